"""New weight types' kernels compile in a helper process (engine.kernels.warmed, engine.runtime.warmup.products_apart):
the markers, and a requantized model whose new type's kernels a real helper prepares, once."""
from __future__ import annotations

import os

import numpy as np
import pytest

from engine.kernels import precompile, warmed
from engine.kernels.dispatch import compiled, warm_up
from engine.model import load_model
from engine.quality.requantize import Requantizer
from engine.quant.types import GGMLType
from engine.runtime import warmup
from tests.tiny_models import make_tiny_llama

needs_kernels = pytest.mark.skipif(not compiled(), reason="needs the compiled (numba) kernels")


@pytest.fixture
def marks(tmp_path, monkeypatch):
    """A marker folder of this test's own, in the environment too (a helper process finds the same one)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(warmed, "_FOLDER", [])
    return tmp_path


def test_row_classes_and_names():
    assert [warmed.row_class(r) for r in (576, 640, 1000, 262144, 49152, 36)] == [16, 16, 8, 16, 16, 4]
    assert warmed.name(GGMLType.Q4_0, 1000) == "Q4_0_8"
    assert warmed.name(int(GGMLType.Q6_K), 64) == "Q6_K_16"


@needs_kernels
def test_marks_are_kept_per_row_class(marks):
    want = {(GGMLType.Q4_0, 64), (GGMLType.Q4_0, 36), (GGMLType.Q6_K, 640)}
    assert warmed.missing(want) == want
    warmed.mark([(GGMLType.Q4_0, 32)])
    assert warmed.missing(want) == {(GGMLType.Q4_0, 36), (GGMLType.Q6_K, 640)}  # 64 rows: the class of 32
    assert str(warmed.folder()).startswith(str(marks / "cache"))


@needs_kernels
def test_warm_up_marks_what_it_compiled_and_a_dry_pass_marks_nothing(marks):
    with precompile.dry_products():
        warm_up({(GGMLType.Q8_0, 48)})
    assert warmed.missing({(GGMLType.Q8_0, 48)}) == {(GGMLType.Q8_0, 48)}
    warm_up({(GGMLType.Q8_0, 48)})
    assert warmed.missing({(GGMLType.Q8_0, 48)}) == set()


def test_nothing_runs_unless_the_process_asked(marks, monkeypatch):
    monkeypatch.delenv(warmup.APART_ENV, raising=False)
    monkeypatch.setattr(precompile, "start_products", lambda weights, late=False: pytest.fail("a helper was started"))
    assert warmup.products_apart({(GGMLType.Q4_0, 64)}) is False


@needs_kernels
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the helper needs two cores")
def test_requantized_types_are_prepared_by_a_helper_once(marks, tmp_path, monkeypatch):
    monkeypatch.setenv(warmup.APART_ENV, "1")
    monkeypatch.setenv("GGUF_LENS_PRECOMPILE", "1")
    real, started, split = precompile.start_products, [], []

    def spy(weights, late=False):  # late: products_apart's helpers (their late kernels too); else a first-start split
        (started if late else split).append(sorted({warmed.name(t, r) for t, r in weights}))
        return real(weights, late=late)

    monkeypatch.setattr(precompile, "start_products", spy)
    path = make_tiny_llama(tmp_path / "q8_0.gguf", qtype=GGMLType.Q8_0, dim=64, hidden=128)
    model = load_model(path)  # a cold kernel cache: the first-start split's helper; a warm one: products_apart's
    try:  # helper for the model's own types (no markers here yet). One of the two prepared them
        assert started or split, "no helper prepared the model's own types"
        assert all(n.startswith(("Q8_0", "F32", "F16")) for names in started + split for n in names), (started, split)
        started.clear()
        rq = Requantizer(model)
        seen: list[str] = []
        assert rq.apply(rq.plan(None, ["ffn_.*=Q4_0"]), progress=lambda what, frac: seen.append(what))
        assert started == [["Q4_0_16"]], started  # the new type only: the helper process compiled or loaded it
        assert "compiling the new types' kernels" in seen
        assert warmed.missing({(GGMLType.Q4_0, 128)}) == set()  # marked by the helper, for every later process
        cache = model.new_cache(32)
        logits = model.forward(np.array([1, 5, 9, 3], np.int64), cache)
        assert np.isfinite(np.asarray(logits)).all()
        rq.reset()
        assert rq.apply(rq.plan(None, ["ffn_.*=Q4_0"]))
        assert started == [["Q4_0_16"]]  # marked: no second helper
    finally:
        model.close()


@needs_kernels
def test_a_model_warmed_before_the_late_kernels_takes_them_up_once(tmp_path):
    """A first start warms the model while the late kernels compile (here: without_late); finish_late then runs the
    late paths' warm pass (decode plan, repacked copies) once, and the numbers stay the same."""
    path = make_tiny_llama(tmp_path / "q4_0.gguf", qtype=GGMLType.Q4_0, dim=64, hidden=128)
    with precompile.without_late():
        model = load_model(path)
        assert not warmup.late_pending(model.net)  # still compiling, as far as this thread knows
    try:
        assert warmup.late_pending(model.net)
        ids = np.array([1, 5, 9, 3], np.int64)
        before = np.asarray(model.net.forward(ids, model.new_cache(32), None, False))  # the early paths' numbers
        assert warmup.finish_late(model.net) is True
        assert not warmup.late_pending(model.net) and warmup.finish_late(model.net) is False
        assert np.array_equal(np.asarray(model.forward(ids, model.new_cache(32))), before)
    finally:
        model.close()


@needs_kernels
def test_the_first_pass_after_the_late_kernels_takes_them_up(tmp_path, monkeypatch):
    """Without a front end calling finish_late, the model's next forward pass does, before its own work."""
    path = make_tiny_llama(tmp_path / "q8_0.gguf", qtype=GGMLType.Q8_0, dim=64, hidden=128)
    with precompile.without_late():
        model = load_model(path)
    calls: list[object] = []
    real = warmup.finish_late
    monkeypatch.setattr(warmup, "finish_late", lambda net: calls.append(net) or real(net))
    try:
        ids = np.array([1, 5, 9, 3], np.int64)
        first = np.asarray(model.forward(ids, model.new_cache(32)))
        assert calls == [model.net] and not warmup.late_pending(model.net)
        assert np.array_equal(np.asarray(model.forward(ids, model.new_cache(32))), first)
        assert calls == [model.net]
    finally:
        model.close()
