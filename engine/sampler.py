"""Sampling: small pure filters chained as llama.cpp's default sampler chain orders them."""
from __future__ import annotations

import math
from dataclasses import dataclass, asdict
from typing import Callable, Sequence

import numpy as np
import numpy.typing as npt

from engine.errors import SettingError

F32 = npt.NDArray[np.float32]
Sampler = Callable[[F32, Sequence[int]], int]


@dataclass(frozen=True)
class SamplerSettings:
    """Sampling parameters with llama.cpp's meanings; temperature <= 0 is greedy."""

    temperature: float = 0.8
    top_k: int = 40  # 0 = off
    top_p: float = 0.95  # 1.0 = off
    min_p: float = 0.05  # 0.0 = off
    repeat_penalty: float = 1.0  # 1.0 = off
    repeat_last_n: int = 64
    seed: int | None = None

    def check(self) -> SamplerSettings:
        """Raise SettingError naming the first out-of-range value."""
        _require("temperature", self.temperature, 0.0 <= self.temperature <= 100.0, "between 0 and 100")
        _require("top_k", self.top_k, 0 <= self.top_k <= 1_000_000, "between 0 and 1000000")
        _require("top_p", self.top_p, 0.0 < self.top_p <= 1.0, "in (0, 1]")
        _require("min_p", self.min_p, 0.0 <= self.min_p <= 1.0, "in [0, 1]")
        _require("repeat_penalty", self.repeat_penalty, 0.0 < self.repeat_penalty <= 10.0, "in (0, 10]")
        _require("repeat_last_n", self.repeat_last_n, 0 <= self.repeat_last_n <= 1 << 20, ">= 0")
        if self.seed is not None:
            _require("seed", self.seed, 0 <= self.seed < 2**63, "between 0 and 2^63-1")
        return self

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _require(name: str, value: object, ok: bool, rule: str) -> None:
    if not ok or (isinstance(value, float) and not math.isfinite(value)):
        raise SettingError(f"{name} = {value!r}: must be {rule}")


def apply_repeat_penalty(logits: F32, history: Sequence[int], penalty: float, last_n: int) -> F32:
    """Divide positive logits (multiply negative ones) of recently seen tokens by `penalty`."""
    if penalty == 1.0 or last_n == 0 or not history:
        return logits
    seen = np.unique(np.asarray(history[-last_n:], dtype=np.int64))
    seen = seen[(seen >= 0) & (seen < logits.size)]
    out = logits.copy()
    x = out[seen]
    out[seen] = np.where(x > 0, x / penalty, x * penalty)
    return out


def apply_top_k(logits: F32, k: int) -> F32:
    """Keep the k largest logits (ties at the boundary kept), -inf elsewhere."""
    if k <= 0 or k >= logits.size:
        return logits
    kth = np.partition(logits, -k)[-k]
    return np.where(logits >= kth, logits, -np.inf).astype(np.float32)


def _probs(logits: F32) -> F32:
    m = np.max(logits)
    e = np.exp(logits - m)
    return e / e.sum()


def apply_top_p(logits: F32, p: float) -> F32:
    """Keep the smallest set of most likely tokens whose probability reaches p."""
    if p >= 1.0:
        return logits
    probs = _probs(logits)
    order = np.argsort(-probs, kind="stable")
    cum = np.cumsum(probs[order])
    n_keep = int(np.searchsorted(cum, p, side="left")) + 1
    keep = np.zeros(logits.size, dtype=bool)
    keep[order[:n_keep]] = True
    return np.where(keep, logits, -np.inf).astype(np.float32)


def apply_min_p(logits: F32, min_p: float) -> F32:
    """Drop tokens whose probability is below min_p times the top token's."""
    if min_p <= 0.0:
        return logits
    threshold = np.max(logits) + math.log(min_p)
    return np.where(logits >= threshold, logits, -np.inf).astype(np.float32)


def make_sampler(settings: SamplerSettings) -> Sampler:
    """A function (logits, history) -> token id, built from the filters above."""
    s = settings.check()
    rng = np.random.default_rng(s.seed)

    def sample(logits: F32, history: Sequence[int]) -> int:
        x = np.asarray(logits, dtype=np.float32).reshape(-1)
        x = apply_repeat_penalty(x, history, s.repeat_penalty, s.repeat_last_n)
        if s.temperature <= 0.0:
            return int(np.argmax(x))
        x = apply_top_k(x, s.top_k)
        x = apply_top_p(x, s.top_p)
        x = apply_min_p(x, s.min_p)
        probs = _probs(x / np.float32(s.temperature))
        return int(rng.choice(probs.size, p=probs / probs.sum()))

    return sample
