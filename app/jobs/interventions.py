"""Set or clear the interventions on the chat's model (engine.intervene) and measure what they do to the chat."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from app.jobs.quant import _wait_for_reply
from app.records.compare import TaskProgress
from app.records.interventions import InterventionRecord, InterventionSpec
from engine.errors import SettingError

if TYPE_CHECKING:
    from app.jobs.session import Emit, Session

TOP = 5
MAX_TOKENS = 2048  # the effect is measured on the chat's last tokens at most


def _clear(model: Any) -> None:
    from engine.intervene import control_vector, lora  # noqa: PLC0415
    from engine.intervene.ablation import Ablation, ablate  # noqa: PLC0415

    ablate(model, Ablation())
    control_vector.apply(model, None)
    for ad in lora.current(model):
        ad.file.close()
    lora.apply(model, [])


def _prepare(model: Any, spec: InterventionSpec, tokens: list[int]) -> list[tuple[str, Any]]:
    """Everything read and checked before anything is applied: (kind, what) pairs."""
    from engine.intervene import ablation as ab  # noqa: PLC0415
    from engine.intervene import control_vector, lora  # noqa: PLC0415

    out: list[tuple[str, Any]] = []
    items = InterventionSpec.items
    what = ab.parse(model, items(spec.heads), items(spec.attn_layers), items(spec.ffn_layers), items(spec.experts))
    if spec.heads_mean and what.heads and not tokens:
        raise SettingError("mean ablation averages each head over the chat: send a message first (or choose zero)")
    if not what.empty:
        out.append(("ablation", what))
    if spec.cvec_path:
        out.append(("cvec", control_vector.load([(spec.cvec_path, spec.cvec_scale)], model.args.dim,
                                                model.args.n_layers, model.arch)))
    if spec.lora_path:
        out.append(("lora", lora.load(model, spec.lora_path, spec.lora_scale)))
    return out


def _apply(model: Any, parts: list[tuple[str, Any]], mean_over: list[int] | None) -> str:
    """Set the parts on the model; the ablated heads mean-ablated over `mean_over` (the chat's tokens) when given."""
    from engine.intervene import ablation as ab  # noqa: PLC0415
    from engine.intervene import control_vector, lora  # noqa: PLC0415

    words = []
    for kind, what in parts:
        if kind == "ablation":
            what = ab.head_means(model, mean_over, what) if mean_over else what
            ab.ablate(model, what)
            words.append(what.describe())
        elif kind == "cvec":
            control_vector.apply(model, what)
            words.append(what.describe())
        else:
            lora.apply(model, [what])
            words.append(lora.describe([what]))
    return " · ".join(words)


def _probs(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def interventions_job(session: Session, spec: InterventionSpec, cancel: threading.Event,
                      emit: Emit) -> Iterator[object]:
    """Clear what the model holds, read and check `spec` (nothing applied if any part is bad), apply it, and compare
    the chat's next-token distributions without and with it. The chat's KV cache is cleared: the next reply reads the
    chat again through the changed model."""
    yield from _wait_for_reply(session, "interventions", cancel)
    t0 = time.perf_counter()
    yield TaskProgress("interventions", "reading the interventions", 0.0)
    with session.lock:
        model = session.model
        if model is None:
            raise SettingError("no model is loaded")
        model.gguf.check_unchanged()  # its weights are read through the memory map
        tokens = list(session.cache.tokens)[-MAX_TOKENS:] if session.cache is not None else []
        parts = _prepare(model, spec, tokens)  # raises before anything changes
        _clear(model)
        before = model.net.forward(tokens, model.new_cache(len(tokens)), all_logits=True) if tokens else None
        emit(TaskProgress("interventions", "the chat with them", 0.5))
        description = _apply(model, parts, tokens if spec.heads_mean else None)
        after = model.net.forward(tokens, model.new_cache(len(tokens)), all_logits=True) if tokens else None
        session.fresh_cache()
        tok = model.tokenizer
        if before is None:
            kld, top_b, top_a = np.zeros(0), (), ()
        else:
            p, q = _probs(before), _probs(after)
            with np.errstate(divide="ignore", invalid="ignore"):
                kld = np.where(p > 0, p * (np.log(p) - np.log(np.maximum(q, 1e-300))), 0.0).sum(axis=-1)
            top = lambda pr: tuple((tok.token_text(int(i)), float(pr[-1, i])) for i in np.argsort(-pr[-1])[:TOP])  # noqa: E731
            top_b, top_a = top(p), top(q)
        texts = tuple(tok.token_text(t) for t in tokens)
        return InterventionRecord(description, kld, texts, top_b, top_a, time.perf_counter() - t0)
