"""Set or clear the interventions on the chat's model (engine.intervene) and measure what the change does to the chat.

All or nothing: the spec is read and checked first (a bad head, layer, scale or file: a SettingError, and the model
keeps what it had); if setting it fails anyway, what was on before is put back.

The effect: the chat's tokens run through the model as it was before the change and as it is after (real forward
passes, engine.generate.prefill in chunks, so Stop ends a measurement within one chunk, never the change), compared
as engine.quality.compare does: KLD(before || after) at each position (natural log, as llama.cpp's --kl-divergence),
and the top tokens of the last position, the next token after the chat.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from app.jobs.chat import fit_context
from app.jobs.quant import _wait_for_reply
from app.records.compare import TaskProgress
from app.records.interventions import InterventionRecord, InterventionSpec, LoadedAdapter
from engine.errors import LensError, SettingError

if TYPE_CHECKING:
    from app.jobs.session import Emit, Session
    from app.records.reply import GenerationRequest

TASK = "interventions"
TOP = 5  # tokens shown before and after
MAX_TOKENS = 2048  # the effect is measured on the chat's last tokens at most
LOGITS_BYTES = 512 << 20  # and on fewer where one run's float32 logits would pass this (a 262k-token vocabulary)
CHUNK = 256  # tokens per forward pass: Stop waits for one at most
Held = tuple[Any, Any, list[Any]]  # (ablation, control vector, LoRA adapters) on a model
Say = Callable[[float], None]  # progress of one run, 0..1


def _held(model: Any) -> Held:
    from engine.intervene import ablation, control_vector, lora  # noqa: PLC0415

    return ablation.current(model), control_vector.current(model), lora.current(model)


def _describe(held: Held) -> str:
    """'ablated L3h4 · control vector calm.gguf x0.8 · LoRA style.gguf x1' ('' when nothing is on)."""
    from engine.intervene import lora  # noqa: PLC0415

    abl, vec, adapters = held
    words = (abl.describe(), vec.describe() if vec is not None else "", lora.describe(adapters))
    return " · ".join(w for w in words if w)


def _set(model: Any, held: Held) -> None:
    """Put exactly `held` on the model (nothing held: the model as its file says)."""
    from engine.intervene import control_vector, lora  # noqa: PLC0415
    from engine.intervene.ablation import ablate  # noqa: PLC0415

    abl, vec, adapters = held
    ablate(model, abl)
    control_vector.apply(model, vec)
    lora.apply(model, adapters)


def _check_scale(what: str, scale: float) -> None:
    if not math.isfinite(scale):
        raise SettingError(f"{what} scale {scale}: a scale must be a finite number (e.g. 0.8, or -1 to reverse it)")


def _prepare(model: Any, spec: InterventionSpec, tokens: list[int]) -> list[tuple[str, Any]]:
    """Everything read and checked before anything is applied: (kind, what) pairs."""
    from engine.intervene import ablation as ab  # noqa: PLC0415
    from engine.intervene import control_vector, lora  # noqa: PLC0415

    out: list[tuple[str, Any]] = []
    items = InterventionSpec.items
    what = ab.parse(model, items(spec.heads), items(spec.attn_layers), items(spec.ffn_layers), items(spec.experts))
    if spec.heads_mean and what.heads and not tokens:
        raise SettingError("mean ablation averages each head over the chat: send a message first (or choose zero)")
    if spec.cvec_path:
        _check_scale("the control vector's", spec.cvec_scale)
    if spec.lora_path:
        _check_scale("the LoRA adapter's", spec.lora_scale)
    if not what.empty:
        out.append(("ablation", what))
    if spec.cvec_path:
        out.append(("cvec", control_vector.load([(spec.cvec_path, spec.cvec_scale)], model.args.dim,
                                                model.args.n_layers, model.arch)))
    if spec.lora_path:  # last: its open file is the one thing to close if a later step fails
        out.append(("lora", lora.load(model, spec.lora_path, spec.lora_scale)))
    return out


def _apply(model: Any, parts: list[tuple[str, Any]], mean_over: list[int] | None) -> None:
    """Set the parts on a model that holds nothing; the ablated heads mean-ablated over `mean_over` (the chat's tokens)
    when given, their means taken on the model without them."""
    from engine.intervene import ablation as ab  # noqa: PLC0415
    from engine.intervene import control_vector, lora  # noqa: PLC0415

    for kind, what in parts:
        if kind == "ablation":
            ab.ablate(model, ab.head_means(model, mean_over, what) if mean_over else what)
        elif kind == "cvec":
            control_vector.apply(model, what)
        else:
            lora.apply(model, [what])


def _change(model: Any, parts: list[tuple[str, Any]], mean_over: list[int] | None) -> Held:
    """What was on goes, `parts` go on; if that fails, what was on comes back (and the error is raised)."""
    from engine.intervene.ablation import Ablation  # noqa: PLC0415

    old = _held(model)
    try:
        _set(model, (Ablation(), None, []))
        _apply(model, parts, mean_over)
    except BaseException:
        _set(model, old)
        raise
    for ad in old[2]:  # the adapters replaced: their files close
        ad.file.close()
    return old


def _adapters(spec: InterventionSpec) -> tuple[LoadedAdapter, ...]:
    out = []
    if spec.lora_path:
        out.append(LoadedAdapter("lora", spec.lora_path, float(spec.lora_scale)))
    if spec.cvec_path:
        out.append(LoadedAdapter("cvec", spec.cvec_path, float(spec.cvec_scale)))
    return tuple(out)


# ---- the effect: the chat's next-token distributions before and after, on the same tokens

def chat_tokens(session: Session, model: Any, context: GenerationRequest | None) -> list[int]:
    """The chat's tokens as the model reads them: the conversation on screen rendered as a reply's prompt is (its last
    reply with the tokens it ran), else what the chat's KV cache holds; its last MAX_TOKENS (fewer for a large
    vocabulary: LOGITS_BYTES). Empty for an encoder-decoder model (its decoder reads no chat)."""
    if getattr(model.net, "is_encoder_decoder", False):
        return []
    ids: list[int] | None = None
    if context is not None:
        try:
            ids, _dropped, _warning = fit_context(model, context, session.n_ctx())
        except LensError:  # a chat past the context (its policy refuses to drop turns): what the cache holds
            ids = None
    if ids is None:
        ids = list(session.cache.tokens) if session.cache is not None else []
    keep = min(MAX_TOKENS, max(16, LOGITS_BYTES // (4 * int(model.args.n_vocab))))
    return [int(t) for t in ids[-keep:]]


def next_token_logp(model: Any, tokens: list[int], cancel: threading.Event,
                    say: Say) -> npt.NDArray[np.float32] | None:
    """log p of the next token at every position of `tokens` on a fresh cache, (T, n_vocab); None if cancelled."""
    from engine.generate import prefill  # noqa: PLC0415
    from engine.quality.compare import log_softmax_rows  # noqa: PLC0415

    if cancel.is_set():
        return None
    cache = model.new_cache(max(16, len(tokens)))
    logits = prefill(model, tokens, cache, chunk_size=CHUNK, cancel=cancel, all_logits=True,
                     progress=lambda done, total: say(done / max(1, total)))
    return None if logits is None else log_softmax_rows(logits, out=logits)


def kld_per_position(before: npt.NDArray[np.float32], after: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """KLD(before || after) at each row, in float64 (engine.quality.compare.kld_rows), a block of rows at a time."""
    from engine.quality.compare import STATS_BLOCK_BYTES, kld_rows  # noqa: PLC0415

    out = np.empty(before.shape[0], np.float64)
    step = max(1, STATS_BLOCK_BYTES // max(1, 8 * before.shape[-1]))
    for r0 in range(0, before.shape[0], step):
        out[r0 : r0 + step] = kld_rows(before[r0 : r0 + step].astype(np.float64),
                                       after[r0 : r0 + step].astype(np.float64))
    return out


def top_tokens(tokenizer: Any, logp_row: npt.NDArray[np.float32], k: int = TOP) -> tuple[tuple[str, float], ...]:
    """The k most likely tokens of one row and their probabilities, the most likely first."""
    order = np.argsort(-logp_row, kind="stable")[:k]
    return tuple((tokenizer.token_text(int(i)), float(np.exp(np.float64(logp_row[i])))) for i in order)


def interventions_job(session: Session, spec: InterventionSpec, cancel: threading.Event, emit: Emit,
                      context: GenerationRequest | None = None, tag: tuple[object, ...] = (),
                      expect: Any = None) -> Iterator[object]:
    """Check `spec` (nothing changes if any part is bad), measure the chat (`context`: the conversation on screen) on
    the model as it is, set `spec` in place of what was on, measure again, and return the InterventionRecord. The chat's
    KV cache is cleared: the next reply reads the chat again through the changed model. `expect`: the model asked
    about (another one loaded since: refused, nothing set)."""
    yield from _wait_for_reply(session, TASK, cancel)
    t0 = time.perf_counter()
    yield TaskProgress(TASK, "reading the interventions", 0.0)
    with session.lock:
        model = session.model
        if model is None:
            raise SettingError("no model is loaded")
        if expect is not None and model is not expect:
            raise SettingError("another model was loaded since Apply: nothing was set on it")
        model.gguf.check_unchanged()  # its weights are read through the memory map
        tokens = chat_tokens(session, model, context)
        parts = _prepare(model, spec, tokens)  # raises before anything changes
        said = lambda what, start: lambda f: emit(TaskProgress(TASK, what, start + 0.45 * f))  # noqa: E731
        try:
            before = next_token_logp(model, tokens, cancel, said("the chat as the model was", 0.05)) if tokens else None
            old = _change(model, parts, tokens if spec.heads_mean else None)
        except BaseException:
            for kind, what in parts:
                if kind == "lora":
                    what.file.close()
            raise
        session.fresh_cache()
        description = _describe(_held(model))
        note, after = "", None
        if before is not None:
            try:
                after = next_token_logp(model, tokens, cancel, said("the chat as the model is now", 0.5))
            except (LensError, MemoryError) as exc:  # set all the same: only the measurement failed
                note = f"the effect could not be measured: {exc}"
        if tokens and after is None:
            note = note or "stopped: the effect was not measured"
        tok = model.tokenizer
        if after is None or before is None:
            kld, top_b, top_a = np.zeros(0), (), ()
        else:
            kld, top_b, top_a = kld_per_position(before, after), top_tokens(tok, before[-1]), top_tokens(tok, after[-1])
        texts = tuple(tok.token_text(t) for t in tokens)
        return InterventionRecord(description, kld, texts, top_b, top_a, time.perf_counter() - t0, _describe(old),
                                  _adapters(spec), note, tag)
