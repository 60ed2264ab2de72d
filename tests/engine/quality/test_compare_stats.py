"""token_stats a block of rows at a time: the same numbers as the whole-matrix formulas, with small temporaries;
Requantizer.apply(replace_first=True): the same model as a plain apply, one copy at a time, the file on cancel."""
from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest

import engine.generate as engine_generate
import engine.quality.compare as compare
from engine.generate import log_softmax
from engine.model import load_model
from engine.quality.compare import TokenStats, log_softmax_rows, token_stats
from engine.quality.requantize import Requantizer
from tests.tiny_models import make_tiny_llama


def whole_matrix_stats(logits_base: np.ndarray, logits_other: np.ndarray, ids: list[int]) -> dict[str, object]:
    """token_stats as it was written before it went by blocks: every (N, n_vocab) array at once."""
    a = log_softmax(logits_base).astype(np.float64)
    b = log_softmax(logits_other).astype(np.float64)
    kld = np.maximum(np.sum(np.exp(a) * (a - b), axis=-1), 0.0)
    n = len(ids)
    tgt = np.asarray(ids[1:], dtype=np.int64)
    rows = np.arange(n - 1)
    nll_a, nll_b = -a[rows, tgt], -b[rows, tgt]
    ppl_a, ppl_b = math.exp(float(nll_a.mean())), math.exp(float(nll_b.mean()))
    dp = 100.0 * (np.exp(-nll_b) - np.exp(-nll_a))
    q = np.quantile(kld, [0.5, 0.9, 0.99, 0.999])
    return dict(
        n_tokens=n, kld_mean=float(kld.mean()), kld_median=float(q[0]), kld_p90=float(q[1]), kld_p99=float(q[2]),
        kld_p999=float(q[3]), kld_max=float(kld.max()),
        same_top_pct=100.0 * float(np.mean(a.argmax(-1) == b.argmax(-1))),
        ppl_base=ppl_a, ppl_other=ppl_b, ppl_ratio=ppl_b / ppl_a, ln_ppl_ratio=math.log(ppl_b / ppl_a),
        delta_p_mean=float(dp.mean()), delta_p_rms=float(np.sqrt(np.mean(dp**2))),
        per_token_kld=tuple(float(x) for x in kld),
    )


@pytest.fixture()
def logits() -> tuple[np.ndarray, np.ndarray, list[int]]:
    rng = np.random.default_rng(7)
    n, vocab = 37, 5003
    a = (4 * rng.standard_normal((n, vocab))).astype(np.float32)
    b = (a + 0.3 * rng.standard_normal((n, vocab))).astype(np.float32)
    return a, b, [int(i) for i in rng.integers(0, vocab, n)]


def test_blocks_of_rows_give_the_whole_matrix_numbers(logits, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, ids = logits
    want = whole_matrix_stats(a, b, ids)
    monkeypatch.setattr(compare, "STATS_BLOCK_BYTES", 3 * 8 * a.shape[1])  # blocks of 3 rows
    assert token_stats(a, b, ids) == want
    acc = TokenStats(ids, base_logp=True)  # pieces of any size, one side as log-probabilities
    for r0, r1 in ((0, 5), (5, 6), (6, 30), (30, 37)):
        acc.add(log_softmax_rows(a[r0:r1]), b[r0:r1])
    assert acc.result() == want
    assert token_stats(log_softmax_rows(a), log_softmax_rows(b), ids, logp=True) == want


def test_log_softmax_rows_in_place_equals_log_softmax(logits, monkeypatch: pytest.MonkeyPatch) -> None:
    a, _, _ = logits
    want = log_softmax(a)
    monkeypatch.setattr(compare, "STATS_BLOCK_BYTES", 4 * 8 * a.shape[1])
    x = a.copy()
    assert log_softmax_rows(x, out=x) is x
    np.testing.assert_array_equal(x, want)


def test_rows_must_fit(logits) -> None:
    a, b, ids = logits
    acc = TokenStats(ids[:10])
    with pytest.raises(Exception, match="rows"):
        acc.add(a[:11], b[:11])
    acc.add(a[:4], b[:4])
    with pytest.raises(Exception, match="4 of 10"):
        acc.result()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf", dim=256, n_heads=4, n_kv_heads=2,
                           hidden=512, n_ctx=64, tied=False)


def _blocks(rq: Requantizer) -> dict[str, bytes]:
    return {name: lin.weight.blocks.tobytes() for name, lin in rq.model.net.linears().items()}


def test_replace_first_gives_the_same_model_and_the_file_on_cancel(tiny: Path) -> None:
    plain, first = Requantizer(load_model(tiny, warm=False)), Requantizer(load_model(tiny, warm=False))
    file_blocks = _blocks(first)
    for preset in ("Q8_0", "Q4_K_M", "Q4_K_S", "Q2_K"):
        assert plain.apply(plain.plan(preset))
        assert first.apply(first.plan(preset), replace_first=True)
        assert _blocks(first) == _blocks(plain) and first.applied is not None
        assert first.current_types() == plain.current_types()
        ids = list(range(3, 40))
        np.testing.assert_array_equal(first.model.forward(ids, first.model.new_cache(64, "F32"), all_logits=True),
                                      plain.model.forward(ids, plain.model.new_cache(64, "F32"), all_logits=True))
    cancel = threading.Event()
    cancel.set()
    assert not first.apply(first.plan("Q5_0"), cancel=cancel, replace_first=True)
    assert _blocks(first) == file_blocks and first.applied is None and not first._held  # back at the file
    assert not plain.apply(plain.plan("Q5_0"), cancel=cancel)
    assert plain.applied is not None and plain.applied.preset.name == "Q2_K"  # a plain apply leaves it untouched
    plain.model.close()
    first.model.close()


def test_compare_models_in_step_holds_no_whole_logits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """compare_models runs A and B a chunk at a time, each pass stopping before the head, and keeps only each block's
    numbers: the statistics and the per-layer divergence of the two whole runs (prefilled in chunks of the same size),
    with no logit array of more than HEAD_ROWS rows made."""
    from engine.quality.compare import compare_models, layer_divergence, run_recorded

    a = load_model(make_tiny_llama(tmp_path / "a.gguf", n_ctx=256))
    b = load_model(make_tiny_llama(tmp_path / "b.gguf", n_ctx=256, seed=5))
    try:
        ids = [int(i) for i in np.random.default_rng(3).integers(3, a.args.n_vocab, 70)]
        monkeypatch.setattr(compare, "LOGIT_ROWS_BYTES", 16 * 4 * a.args.n_vocab)  # chunks of 16 rows
        assert compare.lockstep_chunk(a.args.n_vocab) == 16
        seen: list[int] = []
        real = engine_generate.logits_checked

        def spy(model, hidden):  # noqa: ANN001
            got = real(model, hidden)
            seen.append(got.shape[0])
            return got

        monkeypatch.setattr(engine_generate, "logits_checked", spy)
        got = compare_models(a, b, ids)
        assert max(seen) == compare.HEAD_ROWS and sum(seen) == 2 * len(ids)  # both runs, a block of rows at a time
        monkeypatch.setattr(engine_generate, "logits_checked", real)
        la, ra = run_recorded(a, ids, chunk=16)
        lb, rb = run_recorded(b, ids, chunk=16)
        want = token_stats(la, lb, ids)
        for key, value in want.items():
            assert getattr(got, key) == value, key
        assert got.per_layer == layer_divergence(ra.hidden, rb.hidden, len(ids))
    finally:
        a.close()
        b.close()
