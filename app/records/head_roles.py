"""Head-role records: every head scored by pattern on the chat's attention, or on the induction probe.

Made on the worker (engine.observe.head_roles does the math). The probe runs the model on its own fresh cache and
recorder (a random token sequence repeated twice), so the chat's cache, recorder and tokens are never touched.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.observe.head_roles import HeadRoles, head_roles, probe_ids

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

    def sink_text(self, key: int) -> str:
        return self.token_texts[key] if 0 <= key < len(self.token_texts) else "?"


def make_head_roles_record(model: Any, recorder: Recorder, cache: KVCache, token_texts: list[str]) -> HeadRolesRecord:
    """Score the heads on the chat's recorded attention (the session's recorder and cache, read only)."""
    t0 = time.perf_counter()
    tokens = list(cache.tokens)
    roles = head_roles(recorder, cache, tokens)
    return HeadRolesRecord(roles, "chat", tuple(token_texts[: roles.n_tokens]), str(getattr(model, "path", "")),
                           time.perf_counter() - t0)


def make_probe_record(model: Any, length: int = PROBE_LENGTH, seed: int = PROBE_SEED) -> HeadRolesRecord:
    """Run `length` random tokens twice on a fresh cache and recorder and score the heads on that."""
    from engine.generate import prefill
    from engine.observe.recorder import Recorder

    t0 = time.perf_counter()
    ids = probe_ids(model.tokenizer, length, seed)
    recorder = Recorder(capture_q=True)
    cache = model.new_cache(max(len(ids), 16))
    prefill(model, ids, cache, recorder=recorder)
    roles = head_roles(recorder, cache, ids)
    texts = tuple(model.tokenizer.token_text(t) for t in ids)
    return HeadRolesRecord(roles, "probe", texts, str(model.path), time.perf_counter() - t0)
