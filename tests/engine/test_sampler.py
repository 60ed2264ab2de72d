"""Sampling filters and the sampler chain."""
from __future__ import annotations

import numpy as np
import pytest

from engine.errors import SettingError
from engine.sampler import (
    SamplerSettings,
    apply_min_p,
    apply_repeat_penalty,
    apply_top_k,
    apply_top_p,
    make_sampler,
)

LOGITS = np.log(np.array([0.5, 0.25, 0.15, 0.07, 0.03], dtype=np.float32))


def kept(x: np.ndarray) -> list[int]:
    return [int(i) for i in np.flatnonzero(np.isfinite(x))]


def test_greedy_takes_argmax() -> None:
    s = make_sampler(SamplerSettings(temperature=0.0))
    assert s(LOGITS, []) == 0


def test_top_k_keeps_k_largest() -> None:
    assert kept(apply_top_k(LOGITS, 2)) == [0, 1]
    assert kept(apply_top_k(LOGITS, 0)) == [0, 1, 2, 3, 4]


def test_top_p_keeps_smallest_set_reaching_p() -> None:
    assert kept(apply_top_p(LOGITS, 0.5)) == [0]
    assert kept(apply_top_p(LOGITS, 0.74)) == [0, 1]
    assert kept(apply_top_p(LOGITS, 0.76)) == [0, 1, 2]


def test_min_p_relative_to_top_token() -> None:
    # p >= 0.3 * 0.5 = 0.15 keeps 0.5, 0.25, 0.15
    assert kept(apply_min_p(LOGITS, 0.3)) == [0, 1, 2]


def test_repeat_penalty_divides_positive_multiplies_negative() -> None:
    x = np.array([2.0, -2.0, 1.0], dtype=np.float32)
    out = apply_repeat_penalty(x, [0, 1], 2.0, 64)
    assert out.tolist() == [1.0, -4.0, 1.0]
    # only the last n tokens count
    assert apply_repeat_penalty(x, [0, 1, 2], 2.0, 1).tolist() == [2.0, -2.0, 0.5]


def test_seed_reproducible_and_distribution_follows_probs() -> None:
    cfg = SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    a = [make_sampler(cfg)(LOGITS, []) for _ in range(3)]
    s1, s2 = make_sampler(cfg), make_sampler(cfg)
    draws1 = [s1(LOGITS, []) for _ in range(2000)]
    draws2 = [s2(LOGITS, []) for _ in range(2000)]
    assert draws1 == draws2
    freq = np.bincount(draws1, minlength=5) / 2000
    assert abs(freq[0] - 0.5) < 0.05 and abs(freq[4] - 0.03) < 0.02
    assert len(a) == 3


def test_filters_restrict_sampling() -> None:
    s = make_sampler(SamplerSettings(temperature=5.0, top_k=2, top_p=1.0, min_p=0.0, seed=1))
    assert set(s(LOGITS, []) for _ in range(200)) == {0, 1}


@pytest.mark.parametrize(
    "bad",
    [dict(temperature=-1), dict(temperature=float("nan")), dict(top_k=-3), dict(top_p=0.0), dict(top_p=1.5),
     dict(min_p=2.0), dict(repeat_penalty=0.0), dict(seed=-1)],
)
def test_bad_settings_are_refused(bad: dict) -> None:
    with pytest.raises(SettingError):
        make_sampler(SamplerSettings(**bad))
