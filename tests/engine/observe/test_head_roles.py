"""Head roles on synthetic attention with a known answer, and on SmolLM2 with the induction probe."""
from __future__ import annotations

import numpy as np
import pytest

from engine.observe import head_roles as hr

N = 41  # BOS-like first token, then 20 tokens, then the same 20 again
TOKENS = [1] + list(range(100, 120)) + list(range(100, 120))


def _patterns(n: int, tokens: list[int]) -> np.ndarray:
    """(7, N, N) rows that each follow one role exactly; head 6 parks 0.8 on key 5 (a second sink)."""
    w = np.zeros((7, n, n), np.float32)
    for r in range(n):
        w[0, r, max(r - 1, 0)] = 1  # previous token
        w[1, r, 0] = 1  # sink
        w[2, r, r] = 1  # self
        later = [j + 1 for j in range(r - 1) if tokens[j] == tokens[r]]
        if later:
            w[3, r, later] = 1 / len(later)  # induction
        else:
            w[3, r, r] = 1
        w[4, r, : r + 1] = 1 / (r + 1)  # uniform
        lo = max(1, r - 3)
        w[5, r, lo : r + 1] = 1 / (r + 1 - lo) if r >= 1 else 0  # local: the last 4 keys, never key 0
        if r == 0:
            w[5, 0, 0] = 1
        if r > 5:
            w[6, r, 5], w[6, r, : r + 1] = 0.0, w[6, r, : r + 1] + 0.2 / (r + 1)
            w[6, r, 5] += 0.8
        else:
            w[6, r, : r + 1] = 1 / (r + 1)
    return w


def _score(tokens=TOKENS, windows=None) -> hr.HeadRoles:
    w = _patterns(len(tokens), tokens)
    return hr.score_heads(lambda layer, rows: w[:, rows], [0], windows or {0: None}, tokens, max_rows=None, chunk=7)


def test_each_synthetic_head_is_top_for_its_own_role() -> None:
    roles = _score()
    s = {k: v[0] for k, v in roles.scores.items()}
    assert s["previous"][0] == pytest.approx(1.0) and s["sink"][1] == pytest.approx(1.0)
    assert s["self"][2] == pytest.approx(1.0) and s["induction"][3] == pytest.approx(1.0)
    assert s["broad"][4] == pytest.approx(1.0, abs=1e-5)
    assert s["local"][5] == pytest.approx(1.0, abs=1e-5) and s["local"][4] < 0.5
    for role, head in (("previous", 0), ("sink", 1), ("self", 2), ("induction", 3), ("broad", 4)):
        assert roles.top(role, 1)[0][:2] == (0, head), role
    # a previous-token head is not an induction head, and an induction head's rows in the first copy do not count
    assert s["induction"][0] == pytest.approx(0.0) and s["previous"][3] < 0.5


def test_induction_needs_repeated_text() -> None:
    once = [1] + list(range(100, 140))
    roles = _score(once)
    assert np.isnan(roles.scores["induction"]).all()  # no token repeats: no row qualifies


def test_sinks_are_the_keys_far_above_uniform() -> None:
    roles = _score()
    keys = [s.key for s in roles.sinks]
    assert keys[:1] == [0] and 5 in keys
    five = next(s for s in roles.sinks if s.key == 5)
    assert (five.layer, five.head, five.n_heads) == (0, 6, 1) and five.weight > 0.75 and five.ratio > 5
    # the uniform head gives every key its uniform share: never a sink
    assert all(s.head != 4 for s in roles.sinks)


def test_sliding_window_rows_skip_keys_they_cannot_see() -> None:
    roles = _score(windows={0: 4})
    assert np.isnan(roles.scores["sink"][0][1]) or roles.scores["sink"][0][1] == pytest.approx(1.0)


def test_probe_is_random_tokens_twice(smollm2_model) -> None:
    tok = smollm2_model.tokenizer
    ids = hr.probe_ids(tok, 40, seed=0)
    body = ids[len(ids) - 80 :]
    assert body[:40] == body[40:] and len(set(body[:40])) == 40
    assert not any(tok.is_special(t) for t in body)
    assert ids == hr.probe_ids(tok, 40, seed=0) and ids != hr.probe_ids(tok, 40, seed=1)


def test_smollm2_previous_token_and_induction_heads(smollm2_model) -> None:
    """On the probe, SmolLM2 has clear previous-token heads and one induction head far above the rest."""
    from app.records.head_roles import make_probe_record

    roles = make_probe_record(smollm2_model).roles
    prev, ind = roles.top("previous", 3), roles.top("induction", 3)
    assert prev[0][:2] == (16, 0) and prev[0][2] > 0.8
    assert ind[0][:2] == (18, 6) and ind[0][2] > 0.8
    assert np.nanmedian(roles.scores["induction"]) < 0.1  # most heads do not copy
    assert roles.sinks and roles.sinks[0].key in (0, 1)
