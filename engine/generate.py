"""Generation as an iterator of Step records: prefill in chunks, then one token at a time, cancellable."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from engine.cache import KVCache
from engine.errors import ContextFullError, InferenceError, SettingError
from engine.observe.recorder import Recorder
from engine.sampler import SamplerSettings, make_sampler
from engine.tokenizer.vocab import StreamDecoder

if TYPE_CHECKING:
    from engine.model import Model

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], None]  # (prompt tokens done, prompt tokens total)


@dataclass(frozen=True)
class Step:
    """One generated token (token_id >= 0), or a closing record (token_id == -1) that only says why it stopped."""

    index: int  # 0-based index among generated tokens
    token_id: int
    text: str  # the text this step adds (whole UTF-8 characters, stop strings removed)
    logprob: float  # log-probability of token_id under the model (before sampling filters)
    top: tuple[tuple[int, float], ...]  # the most likely tokens: (id, logprob), best first
    prompt_tokens: int  # tokens the prompt had
    prefilled_tokens: int  # of them, how many ran (the rest came from the cache)
    prompt_s: float  # prefill time
    gen_s: float  # time since the first generated token was sampled
    finish_reason: str | None = None  # None, or 'eos' | 'stop' | 'length' | 'context' | 'cancelled'

    @property
    def prompt_tok_s(self) -> float:
        return self.prefilled_tokens / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def gen_tok_s(self) -> float:
        return self.index / self.gen_s if self.gen_s > 0 and self.index > 0 else 0.0


@dataclass(frozen=True)
class GenerationConfig:
    """What to generate: how much, where to stop, how to sample."""

    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    top_logprobs: int = 10
    chunk_size: int = 256  # prefill chunk (cancel and progress between chunks)

    def check(self) -> GenerationConfig:
        if not (0 <= self.max_tokens <= 1 << 20):
            raise SettingError(f"max_tokens = {self.max_tokens}: must be between 0 and 1048576")
        if not (1 <= self.chunk_size <= 8192):
            raise SettingError(f"chunk_size = {self.chunk_size}: must be between 1 and 8192")
        if not (0 <= self.top_logprobs <= 100):
            raise SettingError(f"top_logprobs = {self.top_logprobs}: must be between 0 and 100")
        self.sampler.check()
        return self


def log_softmax(logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """log p over the last axis, computed in float64 for stability."""
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    lse = m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))
    return (x - lse).astype(np.float32)


def _top(logp: npt.NDArray[np.float32], k: int) -> tuple[tuple[int, float], ...]:
    if k <= 0:
        return ()
    idx = np.argpartition(-logp, min(k, logp.size - 1))[:k]
    idx = idx[np.argsort(-logp[idx], kind="stable")]
    return tuple((int(i), float(logp[i])) for i in idx)


def _non_finite(values: npt.NDArray[np.float32]) -> str | None:
    """'NaN' or 'Inf' where `values` holds one, else None."""
    if np.all(np.isfinite(values)):
        return None
    return "NaN" if np.isnan(values).any() else "Inf"


def _keep(values: npt.NDArray[np.float32], what: str, ids: Sequence[int], cache: KVCache,
          recorder: Recorder | None) -> npt.NDArray[np.float32]:
    """A forward pass's output `values` (what: what they are, for the message) committed to the cache and the
    recorder, or refused when not finite (nothing committed)."""
    bad = _non_finite(values)
    if bad is not None:
        raise InferenceError(f"numerical error in {what} ({bad}) at position {cache.length}; the step was not kept")
    cache.commit(list(ids))
    if recorder is not None:
        recorder.commit()
    return values


def _out_of_memory(cache: KVCache) -> InferenceError:
    return InferenceError(f"ran out of memory at token {cache.length}; reduce the context or close other programs")


def run_checked(model: Model, ids: Sequence[int], cache: KVCache, recorder: Recorder | None, all_logits: bool = False) -> npt.NDArray[np.float32]:
    """One forward pass; commits to the cache only when the logits are finite."""
    try:
        logits = model.forward(ids, cache, recorder, all_logits=all_logits)
    except MemoryError:
        raise _out_of_memory(cache) from None
    return _keep(logits, "model output", ids, cache, recorder)


def run_hidden_checked(model: Model, ids: Sequence[int], cache: KVCache,
                       recorder: Recorder | None) -> npt.NDArray[np.float32] | None:
    """run_checked without the output head: the residual stream after the last layer (model.logits_of gives its
    rows' logits), committed to the cache only when finite; None where the model cannot stop before its head."""
    try:
        x = model.forward_hidden(ids, cache, recorder)
    except MemoryError:
        raise _out_of_memory(cache) from None
    return None if x is None else _keep(x, "the residual stream", ids, cache, recorder)


def head_blocks(rows: int, most: int) -> list[tuple[int, int]]:
    """The row blocks [r0, r1) in which logits_checked may take a forward chunk's `rows` residual rows, about `most`
    at a time, with the numbers of the whole chunk's head: every block starts at a multiple of 8 and holds 16 rows
    or more (a product's kernel depends on its batch: one row, under 8, rows in fours or eights), so a remainder
    under 16 joins the block before it; a chunk under 16 rows is one block."""
    step = max(16, most - most % 8)
    out = [(r0, min(rows, r0 + step)) for r0 in range(0, rows, step)]
    if len(out) > 1 and out[-1][1] - out[-1][0] < 16:
        out[-2:] = [(out[-2][0], rows)]
    return out


def logits_checked(model: Model, hidden: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """model.logits_of rows of run_hidden_checked's residual stream, refused when not finite."""
    logits = model.logits_of(hidden)
    bad = _non_finite(logits)
    if bad is not None:
        raise InferenceError(f"numerical error in model output ({bad}); the comparison stops here")
    return logits


def run_for_logits(model: Model, ids: Sequence[int], cache: KVCache,
                   recorder: Recorder | None) -> tuple[npt.NDArray[np.float32], bool]:
    """One checked pass of `ids` for a caller that wants their logits a few rows at a time: (the residual stream,
    True) where the model stops before its head (run_hidden_checked), else (all the logits, False)."""
    x = run_hidden_checked(model, ids, cache, recorder)
    if x is not None:
        return x, True
    return run_checked(model, ids, cache, recorder, all_logits=True), False


def logit_blocks(models: Sequence[Model], outs: Sequence[npt.NDArray[np.float32]], hidden: Sequence[bool],
                 most: int) -> Iterator[list[npt.NDArray[np.float32]]]:
    """The logits of one chunk of several runs in step (run_for_logits' outputs and flags, one per model), a
    head_blocks block of rows at a time: the same rows of every run together. A caller drops each block's list
    before taking the next, so that one block is alive at a time."""
    n = outs[0].shape[0]
    for r0, r1 in head_blocks(n, most) if any(hidden) else [(0, n)]:
        yield [logits_checked(m, o[r0:r1]) if h else o[r0:r1] for m, o, h in zip(models, outs, hidden)]


UBATCH = 512  # prompt tokens a forward pass takes at once: llama.cpp's default n_ubatch (its batches, its numbers;
# a 16k prompt's activations and attention tiles stay those of 512 tokens)


def prefill(
    model: Model,
    ids: Sequence[int],
    cache: KVCache,
    *,
    chunk_size: int = UBATCH,
    recorder: Recorder | None = None,
    cancel: threading.Event | None = None,
    progress: ProgressFn | None = None,
    all_logits: bool = False,
) -> npt.NDArray[np.float32] | None:
    """Run the tokens the cache does not hold yet, in chunks. Returns the logits (last row, or all rows run), None if cancelled."""
    keep = cache.resumable(min(cache.common_prefix(list(ids)), len(ids) - 1))  # a recurrent state resumes at snapshots
    cache.truncate(keep)
    if recorder is not None:
        recorder.truncate(keep)
    if len(ids) > cache.n_ctx:
        raise ContextFullError(len(ids), cache.n_ctx)
    todo = list(ids[keep:])
    rows: list[np.ndarray] = []
    done = 0
    if progress is not None:
        progress(0, len(todo))
    while done < len(todo):
        if cancel is not None and cancel.is_set():
            return None
        chunk = todo[done : done + chunk_size]
        logits = run_checked(model, chunk, cache, recorder, all_logits=all_logits)
        rows.append(logits)
        done += len(chunk)
        if progress is not None:
            progress(done, len(todo))
    return np.concatenate(rows) if all_logits else rows[-1][-1:]


def generate(
    model: Model,
    prompt: Sequence[int],
    config: GenerationConfig | None = None,
    *,
    cache: KVCache | None = None,
    recorder: Recorder | None = None,
    cancel: threading.Event | None = None,
    progress: ProgressFn | None = None,
) -> Iterator[Step]:
    """Yield a Step per generated token; the last Step has finish_reason set. Reuses the cache's common prefix."""
    cfg = (config or GenerationConfig()).check()
    if not prompt:
        raise SettingError("the prompt is empty: nothing to continue from")
    cache = cache if cache is not None else model.new_cache()
    t0 = time.perf_counter()
    given = [int(t) for t in prompt]
    encoded = getattr(cache, "encoder_ids", None) == tuple(given)  # an encoder-decoder's input already read
    prompt = decoder_prompt(model, prompt, cache)
    sample = make_sampler(cfg.sampler)
    history = list(prompt)
    n_cached = cache.resumable(min(cache.common_prefix(list(prompt)), len(prompt) - 1))
    logits = prefill(model, prompt, cache, chunk_size=cfg.chunk_size, recorder=recorder, cancel=cancel, progress=progress)
    prompt_s = time.perf_counter() - t0
    base = dict(prompt_tokens=len(prompt), prefilled_tokens=len(prompt) - n_cached, prompt_s=prompt_s)
    if prompt != given:  # T5: the prompt is the encoder's input (the decoder runs its start token only)
        base.update(prompt_tokens=len(given), prefilled_tokens=0 if encoded else len(given))
    if logits is None:
        yield Step(0, -1, "", 0.0, (), gen_s=0.0, finish_reason="cancelled", **base)
        return
    decoder = StreamDecoder(model.tokenizer)
    stops = _StopMatcher(cfg.stop)
    eog = model.tokenizer.eog_ids
    t1 = time.perf_counter()
    for i in range(cfg.max_tokens):
        logp = log_softmax(logits[-1])
        token = sample(logits[-1], history)
        top = _top(logp, cfg.top_logprobs)
        if token in eog:
            yield Step(i, token, stops.flush(decoder.flush()), float(logp[token]), top, gen_s=time.perf_counter() - t1, finish_reason="eos", **base)
            return
        history.append(token)
        text, hit = stops.feed(decoder.feed(token))
        last = i + 1 == cfg.max_tokens
        full = cache.length + 1 > cache.n_ctx
        reason = "stop" if hit else "length" if last else "context" if full else None
        if reason is not None and not hit:
            text += stops.flush(decoder.flush())
        yield Step(i, token, text, float(logp[token]), top, gen_s=time.perf_counter() - t1, finish_reason=reason, **base)
        if reason is not None:
            return
        if cancel is not None and cancel.is_set():
            yield Step(i + 1, -1, stops.flush(decoder.flush()), 0.0, (), gen_s=time.perf_counter() - t1, finish_reason="cancelled", **base)
            return
        logits = run_checked(model, [token], cache, recorder)
    if cfg.max_tokens == 0:
        yield Step(0, -1, "", 0.0, (), gen_s=0.0, finish_reason="length", **base)


def decoder_prompt(model: Model, prompt: Sequence[int], cache: KVCache) -> list[int]:
    """The tokens the decoder runs: the prompt, or for an encoder-decoder model (T5) its start token, the prompt
    being the encoder's input, encoded now unless the cache holds that encoding already (llama.cpp's examples do
    the same: llama_encode on the prompt, then the decoder from decoder_start_token_id)."""
    net = model.net
    if not getattr(net, "is_encoder_decoder", False):
        return list(prompt)
    if getattr(cache, "encoder_ids", None) != tuple(int(t) for t in prompt):
        model.gguf.check_unchanged()
        net.encode(list(prompt), cache)
    return [net.decoder_start_token]


class _StopMatcher:
    """Holds back text that could be the start of a stop string; cuts the text at the first stop string."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.buf = ""
        self.done = False

    def feed(self, text: str) -> tuple[str, bool]:
        if self.done:
            return "", True
        self.buf += text
        if not self.stops:
            out, self.buf = self.buf, ""
            return out, False
        cut = min((p for p in (self.buf.find(s) for s in self.stops) if p >= 0), default=-1)
        if cut >= 0:
            out, self.buf, self.done = self.buf[:cut], "", True
            return out, True
        n_out = max(0, len(self.buf) - self.hold)
        out, self.buf = self.buf[:n_out], self.buf[n_out:]
        return out, False

    def flush(self, text: str = "") -> str:
        if self.done:
            return ""
        out, _ = self.feed(text)
        out += self.buf
        self.buf = ""
        return out
