"""The Why lens's computations (no Qt), run by app.jobs.lens.lens_job under the session lock, between tokens.

`attribution` splits the logit of a token of the conversation on screen (the token the model generated there, read
after its predecessors) into the model's parts (engine.attribute.api.attribute: one forward pass of the tokens before
it, on a cache of its own, so the chat's cache is left as it is). `ablation_check` switches one part off for real
(engine.intervene.ablation: a head zeroed, a layer's FFN or an expert left out), runs the same tokens with and
without it, and reports the logit (difference) both ways, beside the part's attribution.

`patching_check` runs attribution patching (engine.attribute.attribution_patching) of the same token for the clean
prompt (the conversation's tokens before it) and a corrupted prompt of as many tokens, and real activation patching of
each head to check it: one pass per head, each a point where the lens's Stop ends it, each reported as progress.

Results are kept in an AttributionMemo, per (model, the conversation's tokens as read, with the reply version shown,
token, contrast, method or corrupted prompt, interventions on the model): the same question twice costs nothing. They
return app.jobs.lens.InContext, so the LensBridge drops a record of a conversation that is no longer on screen.

`attribution_pair_job` runs on the compare lane: the same token in A and B of the Compare tab's last comparison.
"""
from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np

from app.jobs.chat import fit_context
from app.jobs.lens import InContext, job_cancel, job_progress
from app.records.attribution import (REPLY_TOKEN, ABLATABLE, NO_INDEX, AblationCheck, AttributionPair,
                                     component_label, make_attribution_record, make_patching_record)
from app.records.compare import TaskProgress
from app.records.reply import GenerationRequest
from engine.errors import LensError, SettingError

MEMO_SIZE = 32  # attributions kept (each a few kB: one value per part)
NO_REPLY = "no reply yet: send a message first (the Why lens explains the tokens of a reply)"
NO_CORRUPT = "give a corrupted prompt: the clean one with a word or two changed, as many tokens"


class AttributionMemo:
    """The last MEMO_SIZE records by key (touched on the worker only)."""

    def __init__(self, size: int = MEMO_SIZE):
        self.size = size
        self._kept: OrderedDict[tuple[Any, ...], Any] = OrderedDict()

    def get(self, key: tuple[Any, ...]) -> Any:
        rec = self._kept.get(key)
        if rec is not None:
            self._kept.move_to_end(key)
        return rec

    def put(self, key: tuple[Any, ...], rec: Any) -> None:
        self._kept[key] = rec
        self._kept.move_to_end(key)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def __len__(self) -> int:
        return len(self._kept)


def conversation_ids(model: Any, cache: Any, context: GenerationRequest) -> tuple[list[int], int]:
    """The conversation's token ids as the lenses read it (app.jobs.lens.ensure_context) and where its last reply
    starts (len(ids): the conversation ends with no reply)."""
    n_ctx = int(cache.n_ctx) if cache is not None else int(model.args.n_ctx)
    ids, _dropped, _warning = fit_context(model, context, n_ctx)
    reply = list(context.continue_ids or ())
    if is_seq2seq(model):  # the encoder's input (the last user message), the decoder's start token, the reply
        return [*ids, int(model.net.decoder_start_token), *reply], len(ids) + 1
    if not reply:
        return ids, len(ids)
    return ids, max(0, len(ids) - len(reply))


def is_seq2seq(model: Any) -> bool:
    return bool(getattr(getattr(model, "net", None), "is_encoder_decoder", False))


def _explain(model: Any, ids: list[int], reply_start: int, idx: int, contrast: str, method: str) -> Any:
    """engine.attribute's Attribution of token idx of the conversation `ids` read after the tokens before it; an
    encoder-decoder's (T5): the encoder's input, then the decoder's tokens up to it (only a reply's tokens were
    generated), its position given as the conversation's."""
    from engine.attribute.api import attribute  # noqa: PLC0415

    extra: dict[str, Any] = {"method": method} if method else {}  # the gradient methods: only when asked for
    con = contrast if contrast.strip() else None
    progress = job_progress(f"attributing token {idx}", "passes")
    if not is_seq2seq(model):
        return attribute(model, ids[:idx], int(ids[idx]), con, **extra, cancel=_cancel(), progress=progress)
    if idx < reply_start:
        raise SettingError(f"token {idx} is the encoder's input, which the model reads and does not write: an "
                           f"encoder-decoder's Why explains the tokens of its reply (from token {reply_start})")
    enc = ids[: reply_start - 1]
    got = attribute(model, enc, int(ids[idx]), con, **extra, decoder=ids[reply_start:idx], cancel=_cancel(),
                    progress=progress)
    return dataclasses.replace(got, position=idx - 1)


def _token_index(token_index: int, n_tokens: int, reply_start: int) -> int:
    """The token asked for (-k: the k-th from the end; REPLY_TOKEN + p: token p of the last reply), checked: a token
    with no predecessor was never generated."""
    if reply_start >= n_tokens:
        raise SettingError(NO_REPLY)
    if token_index >= REPLY_TOKEN:  # a token of the last reply, counted from its first
        token_index = reply_start + int(token_index) - REPLY_TOKEN
    idx = n_tokens + int(token_index) if token_index < 0 else int(token_index)
    if not 1 <= idx < n_tokens:
        raise SettingError(f"token {idx} is not in the conversation (tokens 1..{n_tokens - 1} have a predecessor)")
    return idx


def interventions_key(model: Any) -> tuple[Any, ...]:
    """What is set on the model that changes its logits (ablation, control vector, LoRA), as a memo key."""
    from engine.intervene import ablation, control_vector, lora  # noqa: PLC0415

    vec = control_vector.current(model)
    return (repr(ablation.current(model)), id(vec) if vec is not None else 0,
            tuple(id(a) for a in lora.current(model)), model.numerics)


def heads_per_layer(model: Any) -> list[int]:
    """Each layer's heads as the attribution numbers them (a recurrent layer's value heads)."""
    from engine.intervene.ablation import heads_in  # noqa: PLC0415

    net = model.net
    if is_seq2seq(model):  # the decoder's blocks (their self-attention heads; the cross heads are parts of their own)
        return [int(net.args.n_heads)] * len(net.dec_layers)
    return [int(heads_in(net, i)) for i in range(int(net.args.n_layers))]


def _check_stopped() -> None:
    cancel = job_cancel()
    if cancel is not None and cancel.is_set():
        raise LensError("attribution was stopped")


def _cancel() -> Callable[[], bool] | None:
    """The running lens job's Stop, as engine.attribute asks it between passes."""
    event = job_cancel()
    return event.is_set if event is not None else None


def attribution(context: GenerationRequest, token_index: int, contrast: str, memo: AttributionMemo,
                serial: int = 0, method: str = "") -> Callable[..., Any]:
    """compute(model, recorder, cache, texts) for app.jobs.lens.lens_job: the AttributionRecord of token
    `token_index` (-k: the k-th from the end) of `context`, its logit minus `contrast`'s ('' : none; a token's text or
    '#id'); `method` 'ixg' or 'ig' adds the input tokens' attributions (engine.attribute's gradient methods)."""

    def compute(model: Any, _recorder: Any, cache: Any, _texts: list[str]) -> InContext:
        ids, reply_start = conversation_ids(model, cache, context)
        idx = _token_index(token_index, len(ids), reply_start)
        key = (serial, tuple(ids), reply_start, idx, contrast, method, interventions_key(model))  # the tokens read
        hit = memo.get(key)
        if hit is not None:
            return InContext(hit, context)
        _check_stopped()
        job_progress(f"attributing token {idx}")(0, idx)
        t0 = time.perf_counter()
        result = _explain(model, ids, reply_start, idx, contrast, method)
        _check_stopped()
        texts = [model.tokenizer.token_text(int(t)) for t in ids]
        rec = make_attribution_record(result, texts, reply_start, heads_per_layer(model), time.perf_counter() - t0,
                                      tuple(ids))
        memo.put(key, rec)
        return InContext(rec, context)

    return compute


def corrupt_ids(tokenizer: Any, text: str) -> list[int]:
    """The corrupted prompt's ids, read as the clean prompt's text is written (the conversation's tokens joined, a
    chat template's special tokens as text): special tokens parsed, none added."""
    return [int(t) for t in tokenizer.encode(text, add_special=False, parse_special=True)]


def patching_check(context: GenerationRequest, token_index: int, contrast: str, corrupt: str, memo: AttributionMemo,
                   serial: int = 0) -> Callable[..., Any]:
    """compute(...) for lens_job: the PatchingRecord of token `token_index` of `context`: attribution patching of its
    logit minus `contrast`'s ('': the corrupted run's top token) for the clean prompt (the tokens before it) and the
    text `corrupt`, checked against real patching of each head. Refused (SettingError) when `corrupt` is empty or
    not as many tokens, or when the model has no backward (engine.grad.backward.check_supported)."""

    def compute(model: Any, _recorder: Any, cache: Any, _texts: list[str]) -> InContext:
        from engine.attribute.attribution_patching import attribution_patching  # noqa: PLC0415
        from engine.attribute.tokens import resolve_token  # noqa: PLC0415
        from engine.grad.backward import check_supported as check_gradients  # noqa: PLC0415

        if not corrupt.strip():
            raise SettingError(NO_CORRUPT)
        ids, reply_start = conversation_ids(model, cache, context)
        idx = _token_index(token_index, len(ids), reply_start)
        tok = model.tokenizer
        bad = corrupt_ids(tok, corrupt)
        if len(bad) != idx:
            raise SettingError(f"the corrupted prompt is {len(bad)} tokens, the clean one (the conversation before "
                               f"token {idx}) is {idx}: attribution patching needs as many tokens in both")
        check_gradients(model)
        con = resolve_token(tok, contrast, "contrast").id if contrast.strip() else None
        key = (serial, tuple(ids[: idx + 1]), tuple(bad), con, interventions_key(model))
        hit = memo.get(key)
        if hit is not None:
            return InContext(hit, context)
        _check_stopped()
        t0 = time.perf_counter()
        est = attribution_patching(model, ids[:idx], bad, int(ids[idx]), con, cancel=_cancel(),
                                   progress=job_progress(f"attribution patching of token {idx}", "passes"))
        rec = make_patching_record(est, idx, idx, tok.token_text(int(ids[idx])), tok.token_text(int(est.wrong)),
                                   corrupt, time.perf_counter() - t0)
        memo.put(key, rec)
        return InContext(rec, context)

    return compute


def logit_diff(model: Any, ids: list[int], target: int, contrast: int | None) -> float:
    """The model's next-token logit of `target` (minus `contrast`'s) after `ids`, before any final soft-cap: one
    forward pass on a cache of its own (the model as it is, interventions applied)."""
    cache = model.new_cache(max(1, len(ids)))
    logits = np.asarray(model.net.forward(list(ids), cache, None, all_logits=False)[-1], np.float64)
    cap = getattr(model.args, "final_softcap", None)
    if cap:  # the attribution splits the logits before the cap: undo it (cap * tanh(x / cap))
        logits = cap * np.arctanh(np.clip(logits / cap, -1 + 1e-12, 1 - 1e-12))
    return float(logits[target] - (logits[contrast] if contrast is not None else 0.0))


def _with_part_off(current: Any, kind: str, layer: int, index: int) -> Any:
    """`current` (the ablation set on the model) with one more part switched off."""
    from engine.intervene.ablation import Ablation  # noqa: PLC0415

    if current.mean_over and kind == "head":
        raise SettingError("the Experiments tab has heads mean-ablated: clear that to confirm a head by zeroing it")
    heads, ffn, experts = current.heads, current.ffn_layers, current.experts
    if kind == "head":
        heads = (*heads, (layer, index))
    elif kind == "ffn":
        ffn = (*ffn, layer)
    else:
        experts = (*experts, (layer, index))
    return Ablation(heads, current.attn_layers, ffn, experts, current.mean_over, current.means)


def ablation_check(context: GenerationRequest, token_index: int, contrast: str, kind: str, layer: int,
                   index: int, estimate: float) -> Callable[..., Any]:
    """compute(...) for lens_job: the logit (difference) of token `token_index` of `context` with the part
    (kind, layer, index) switched off for real, and without; the model's ablation is put back after."""

    def compute(model: Any, _recorder: Any, cache: Any, _texts: list[str]) -> InContext:
        from engine.attribute.capture import check_supported  # noqa: PLC0415
        from engine.attribute.tokens import resolve_token  # noqa: PLC0415
        from engine.intervene import ablation  # noqa: PLC0415

        if kind not in ABLATABLE:
            raise SettingError(f"{component_label(kind, layer, index)}: only a head, an FFN or an expert can be "
                               "switched off to confirm it")
        check_supported(model)
        ids, reply_start = conversation_ids(model, cache, context)
        idx = _token_index(token_index, len(ids), reply_start)
        con = resolve_token(model.tokenizer, contrast, "contrast").id if contrast.strip() else None
        _check_stopped()
        job_progress(f"ablating {component_label(kind, layer, index)}")(0, 2 * idx)
        t0 = time.perf_counter()
        prompt, target = ids[:idx], int(ids[idx])
        base = logit_diff(model, prompt, target, con)
        held = ablation.current(model)
        ablation.ablate(model, _with_part_off(held, kind, layer, NO_INDEX if kind == "ffn" else index))
        try:
            off = logit_diff(model, prompt, target, con)
        finally:
            ablation.ablate(model, held)
        check = AblationCheck(kind, layer, index, idx, base, off, float(estimate), time.perf_counter() - t0)
        return InContext(check, context)

    return compute


PAIR_TASK = "why_pair"  # the compare lane's task kind


def attribution_pair_job(ws: Any, ids: tuple[int, ...], token_index: int, reply_start: int, contrast_id: int | None
                         ) -> Iterator[object]:
    """The same attribution in A and B of the last comparison (app.jobs.compare.last_models: loaded again, released
    after), of token `token_index` of `ids` (the conversation, read by the chat's model: the same tokenizer).
    Yields TaskProgress, then the AttributionPair."""
    from app.jobs.compare import last_models  # noqa: PLC0415
    from engine.attribute.api import attribute  # noqa: PLC0415

    ids = tuple(int(t) for t in ids)
    idx = _token_index(token_index, len(ids), reply_start)
    last = ws.last
    if last is None:
        raise LensError("run a comparison in the Compare tab first: its A and B are what this explains")
    t0 = time.perf_counter()
    yield TaskProgress(PAIR_TASK, "loading A and B of the last comparison", 0.0)
    model_a, model_b = last_models(ws)
    recs = []
    try:
        for n, model in enumerate((model_a, model_b)):
            yield TaskProgress(PAIR_TASK, f"attributing token {idx} in {'AB'[n]}", 0.1 + 0.45 * n)
            t1 = time.perf_counter()
            result = attribute(model, list(ids[:idx]), ids[idx], contrast_id)
            texts = [model.tokenizer.token_text(t) for t in ids]
            recs.append(make_attribution_record(result, texts, reply_start, heads_per_layer(model),
                                                time.perf_counter() - t1, ids))
    finally:
        ws.release()
    opts = getattr(last, "opts", None)
    source = str(getattr(opts, "b_source", ""))
    b_what = str(getattr(opts, "b_preset", "")) if source == "preset" else source
    yield AttributionPair(recs[0], recs[1], "A: the file", f"B: {b_what or 'the last comparison'}",
                          time.perf_counter() - t0)

