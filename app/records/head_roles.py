"""Head-role records: every head scored by pattern on the chat's attention, or on the induction probe.

Made on the worker (engine.observe.head_roles does the math). The probe runs the model on its own fresh cache and
recorder (a random token sequence repeated twice), so the chat's cache, recorder and tokens are never touched.
A hybrid's recurrent layers are scored too, on their read maps (engine.observe.recurrent_roles): `recurrent`
names them, so the view can say which rows are read maps and which are attention.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.errors import LensError
from engine.observe.head_roles import HeadRoles, head_roles, probe_ids
from engine.observe.recurrent_maps import ReadsMemo, recurrent_layers
from engine.observe.recurrent_roles import merge_roles, recurrent_head_roles

if TYPE_CHECKING:
    from engine.cache import KVCache
    from engine.observe.recorder import Recorder

PROBE_LENGTH = 40  # random tokens, then the same again
PROBE_SEED = 0


@dataclass(frozen=True)
class HeadRolesRecord:
    """Role scores of every head and the sinks, on the chat ('chat') or on the repeated random tokens ('probe')."""

    roles: HeadRoles
    source: str  # 'chat' | 'probe'
    token_texts: tuple[str, ...]  # the tokens scored
    model_path: str
    elapsed_s: float
    recurrent: tuple[int, ...] = ()  # the layers scored on their read maps (a hybrid's gated DeltaNet layers)
    read_start: int = 0  # their reads were decomposed from this position on (the earlier context before it)

    def sink_text(self, key: int) -> str:
        return self.token_texts[key] if 0 <= key < len(self.token_texts) else "?"


def make_head_roles_record(model: Any, recorder: Recorder, cache: KVCache, token_texts: list[str],
                           reads_memo: ReadsMemo | None = None) -> HeadRolesRecord | None:
    """Score the heads on the chat's recorded attention (the session's recorder and cache, read only)."""
    t0 = time.perf_counter()
    tokens = list(cache.tokens)
    roles, recurrent, start = _scored(recorder, cache, tokens, reads_memo)
    if roles is None:
        return None
    return HeadRolesRecord(roles, "chat", tuple(token_texts[: roles.n_tokens]), str(getattr(model, "path", "")),
                           time.perf_counter() - t0, recurrent, start)


def _scored(recorder: Recorder, cache: KVCache, tokens: list[int],
            memo: ReadsMemo | None) -> tuple[HeadRoles | None, tuple[int, ...], int]:
    """The attention heads' scores and a hybrid's recurrent heads' (on their reads) in one HeadRoles."""
    attn = head_roles(recorder, cache, tokens) if recorder.specs else None
    layers = recurrent_layers(recorder)
    if not layers:
        return attn, (), 0
    memo = memo if memo is not None else ReadsMemo()
    reads = {i: r for i in layers if (r := memo.get(recorder, i)) is not None}
    n = min(recorder.length, cache.length, len(tokens))
    rec = recurrent_head_roles(reads, tokens, n)
    start = max((r.start for r in reads.values()), default=0)
    return merge_roles(attn, rec), tuple(sorted(reads)) if rec is not None else (), start


def make_probe_record(model: Any, length: int = PROBE_LENGTH, seed: int = PROBE_SEED, cancel: Any = None,
                      progress: Any = None) -> HeadRolesRecord:
    """Run `length` random tokens twice on a fresh cache and recorder and score the heads on that; `cancel` (an
    Event) stops the run (LensError), `progress(done, total)` follows it (engine.generate.prefill's)."""
    from engine.generate import prefill
    from engine.observe.recorder import Recorder

    t0 = time.perf_counter()
    ids = probe_ids(model.tokenizer, length, seed)
    recorder = Recorder(capture_q=True)
    cache = model.new_cache(max(len(ids), 16))
    if prefill(model, ids, cache, recorder=recorder, cancel=cancel, progress=progress) is None:
        raise LensError("the induction probe was stopped")
    roles, recurrent, start = _scored(recorder, cache, ids, None)
    texts = tuple(model.tokenizer.token_text(t) for t in ids)
    assert roles is not None  # the probe's tokens ran through every layer
    return HeadRolesRecord(roles, "probe", texts, str(model.path), time.perf_counter() - t0, recurrent, start)
