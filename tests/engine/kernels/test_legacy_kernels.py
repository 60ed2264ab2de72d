"""Products on F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 blocks: ggml-cpu's vec_dot, bit for bit.

Three witnesses agree exactly (bitwise, NaN where NaN):
- llama.cpp's ggml_vec_dot_<type> on its own activation bytes (tests/fixtures/kernels/dot_<TYPE>.npz,
  made by tools/make_kernel_fixtures.py on an AVX-512 build);
- the NumPy reference legacy_ref.dot_ref, the same integer lane sums and float steps in ggml's order;
- the compiled kernels, on raw blocks and on repacked byte planes, as gemv and as gemm.
Exact, not approximately equal, because every lane sum is an integer below 2^24 (exact in float32
in any order) and the float steps (the scale product, one fma per lane and block, the fixed-order
lane sum) are done in the same order with the same roundings. dequantize_rows_<type> is held to
engine.quant.dequantize_rows bit for bit.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.kernels.legacy import family as legacy
from engine.kernels.activations import HAVE_NUMBA, quantize_activation
from engine.kernels.legacy.ref import dot_ref, fma32_ref
from engine.kernels.legacy.repack import ROW_GROUP, repack, unpack_planes
from engine.quant import dequantize_rows, quantize
from engine.quant.types import TYPES, GGMLType

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kernels"
TYPE_NAMES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
QUANTS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
needs_numba = pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed: the products are the NumPy reference")


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit, except that any NaN matches any NaN."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    nan = np.isnan(a) & np.isnan(b)
    return a.shape == b.shape and bool(np.all(nan | (a.view(np.uint32) == b.view(np.uint32))))


def _describe(a: np.ndarray, b: np.ndarray) -> str:
    bad = ~((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b)))
    idx = np.argwhere(bad)[:3].tolist()
    return f"{int(bad.sum())} of {bad.size} differ at {idx}: {a[bad][:3]} vs {b[bad][:3]}"


def _golden(name: str) -> dict[str, dict[str, np.ndarray]]:
    """{wcase_xcase: {w, x, xq, dot}} from dot_<name>.npz."""
    with np.load(FIXTURES / f"dot_{name}.npz") as f:
        arrays = {k: f[k] for k in f.files}
    cases = {}
    for key, dot in arrays.items():
        if key.startswith("dot_"):
            wcase, xcase = key[4:].rsplit("_", 1)
            cases[f"{wcase}_{xcase}"] = {"w": arrays[f"w_{wcase}"], "x": arrays[f"x_{xcase}"],
                                         "xq": arrays[f"xq_{xcase}"], "dot": dot}
    return cases


def _products(name: str, w, xq: np.ndarray) -> dict[str, np.ndarray]:
    """Every way this module computes the products: gemm and row-by-row gemv, raw and repacked."""
    qtype = GGMLType[name]
    n_rows = w.shape[0]
    got = {}
    for layout, weight in (("raw", w), ("repacked", legacy.REPACK[qtype](w))):
        out = np.full((len(xq), n_rows), np.nan, np.float32)
        legacy.GEMM[qtype](weight, xq, out)
        got[f"gemm/{layout}"] = out
        rows = np.full((len(xq), n_rows), np.nan, np.float32)
        for i in range(len(xq)):
            legacy.GEMV[qtype](weight, xq[i], rows[i])
        got[f"gemv/{layout}"] = rows
    if name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):  # integers on the GGUF blocks, two rows a vector (legacy.gemv_int)
        from engine.kernels.legacy.gemv_int import GEMV_INT

        rows = np.full((len(xq), n_rows), np.nan, np.float32)
        raw = np.ascontiguousarray(w).copy()
        raw.flags.writeable = False
        for i in range(len(xq)):
            x1 = np.ascontiguousarray(xq[i]).copy()
            x1.flags.writeable = False
            GEMV_INT[int(qtype)](raw, x1, rows[i])
        got["gemv/int"] = rows
    if qtype == GGMLType.Q8_0:  # ggml's AVX2 sequence on the GGUF blocks (engine.kernels.legacy.q8_0_rows)
        from engine.kernels.legacy.q8_0_rows import gemv_q8_0_rows

        rows = np.full((len(xq), n_rows), np.nan, np.float32)
        for i in range(len(xq)):
            gemv_q8_0_rows(np.ascontiguousarray(w), np.ascontiguousarray(xq[i]), rows[i])
        got["gemv/q8_0_rows"] = rows
    return got


# ---- against llama.cpp


@pytest.mark.parametrize("name", TYPE_NAMES)
def test_reference_equals_llama_cpp(name):
    for case, g in _golden(name).items():
        ours = dot_ref(GGMLType[name], g["w"], g["xq"])
        assert _same(ours, g["dot"]), f"{name} {case}: {_describe(ours, g['dot'])}"


@pytest.mark.parametrize("name", TYPE_NAMES)
def test_kernels_equal_llama_cpp(name):
    for case, g in _golden(name).items():
        for how, ours in _products(name, g["w"], g["xq"]).items():
            assert _same(ours, g["dot"]), f"{name} {case} {how}: {_describe(ours, g['dot'])}"


@pytest.mark.parametrize("name", TYPE_NAMES)
def test_our_activation_bytes_give_llama_cpp_products(name):
    """Quantizing the fixture's float activations here gives ggml's bytes, hence its products."""
    for case, g in _golden(name).items():
        xq = quantize_activation(GGMLType[name], g["x"])
        assert np.array_equal(xq, g["xq"]), f"{name} {case}"


def test_fixtures_cover_leftovers_and_edges():
    """The float types' n % 64 tail (n = 96) and the legacy edge blocks are in the fixtures."""
    g = _golden("F32")
    assert g["narrow_narrow"]["x"].shape[1] % 64 == 32
    edge = _golden("Q4_1")["edge_edge"]["w"].reshape(8, -1, 20)
    assert not edge[0].any()  # all-zero blocks
    assert (edge[1, :, :2].copy().view("<f2") == np.float16(65504)).all()  # max scale


# ---- compiled against the NumPy reference, on blocks made here


def _edge_blocks(name: str, rng: np.random.Generator, n_rows: int, n: int) -> np.ndarray:
    """Random, zero, max-scale and extreme-weight blocks of `name`, (n_rows, row_bytes)."""
    qtype = GGMLType[name]
    info = TYPES[qtype]
    if info.block_size == 1:
        x = (rng.standard_normal((n_rows, n)) * rng.choice([1e-30, 1e-3, 1.0, 3e4], (n_rows, 1))).astype(np.float32)
        x[1] = 0.0
        return quantize(x, qtype)
    size = info.type_size
    nb = n // 32
    b = rng.integers(0, 256, (n_rows, nb, size), dtype=np.uint8)
    head = 4 if name in ("Q4_1", "Q5_1") else 2
    scales = (rng.standard_normal((n_rows, nb, head // 2)) * 0.02).astype("<f2").view(np.uint8)
    b[..., :head] = scales.reshape(n_rows, nb, head)
    b[0] = 0  # all-zero blocks
    b[1, :, 0:2] = np.frombuffer(np.float16(65504).tobytes(), np.uint8)  # max scale
    if head == 4:
        b[1, :, 2:4] = np.frombuffer(np.float16(-65504).tobytes(), np.uint8)
    b[2, :, head:] = 0x00 if name != "Q8_0" else 0x81  # weights at the low extreme (-8, -16, 0; -127 for Q8_0)
    b[3, :, head:] = 0xFF if name != "Q8_0" else 0x7F  # the high extreme
    b[4, ::2] = 0
    return b.reshape(n_rows, nb * size)


def _edge_activations(name: str, rng: np.random.Generator, n: int, m: int = 5) -> np.ndarray:
    x = rng.standard_normal((m, n)).astype(np.float32)
    x[1] = 0.0  # all zeros
    x[2] = 0.0
    x[2, n // 3] = 3e4  # one huge value
    x[3] *= np.float32(1e-3)
    x[4] = np.where(np.arange(n) % 2 == 0, np.float32(127.0), np.float32(-127.0))
    return quantize_activation(GGMLType[name], x)


@needs_numba
@pytest.mark.parametrize("name", TYPE_NAMES)
@pytest.mark.parametrize("shape", [(ROW_GROUP + 6, 96, 5), (7, 256, 9), (2 * ROW_GROUP, 64, 5)])
def test_compiled_equals_reference_on_random_and_edge_blocks(name, shape):
    """Row counts off the SIMD group size, n % 64 tails, zero/max/extreme blocks, zero and one-huge activations."""
    n_rows, n, m = shape
    rng = np.random.default_rng(sum(map(ord, name)) * 1000 + n_rows)
    w = _edge_blocks(name, rng, n_rows, n)
    xq = _edge_activations(name, rng, n, m)
    want = dot_ref(GGMLType[name], w, xq)
    assert np.isfinite(want[:, 2:]).all() or name in ("F16", "BF16", "F32")
    for how, ours in _products(name, w, xq).items():
        assert _same(ours, want), f"{name} {shape} {how}: {_describe(ours, want)}"


@needs_numba
@pytest.mark.parametrize("name", TYPE_NAMES)
def test_read_only_memory_maps_work(name, tmp_path):
    """The weights usually are a read-only np.memmap: the kernels take it as it is."""
    rng = np.random.default_rng(11)
    w = _edge_blocks(name, rng, 40, 128)
    path = tmp_path / "w.bin"
    w.tofile(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r", shape=w.shape)
    assert not mm.flags.writeable
    xq = _edge_activations(name, rng, 128)
    xq.flags.writeable = False
    want = dot_ref(GGMLType[name], w, xq)
    for how, ours in _products(name, mm, xq).items():
        assert _same(ours, want), how


def test_products_approximate_float_math():
    """Sanity against plain float math: the quantized product is near W x (and not, say, transposed)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    wf = (rng.standard_normal((70, 256)) * 0.05).astype(np.float32)
    for name in TYPE_NAMES:
        qtype = GGMLType[name]
        w = quantize(wf, qtype)
        out = np.empty((2, 70), np.float32)
        legacy.GEMM[qtype](w, quantize_activation(qtype, x), out)
        exact = x.astype(np.float64) @ dequantize_rows(w, qtype).astype(np.float64).T
        assert np.abs(out - exact).max() < 0.03 * np.abs(exact).max(), name


def test_fma_reference_rounds_once():
    a = np.float32(1 + 2**-23)
    assert fma32_ref(a, np.float32(1 - 2**-23), np.float32(-1))[()] == np.float32(-(2.0**-46))
    assert fma32_ref(np.float32(3e38), np.float32(2), np.float32(-3e38))[()] == np.float32(3e38)
    rng = np.random.default_rng(9)
    a, b, c = (rng.standard_normal(10000).astype(np.float32) for _ in range(3))
    exact = np.array([float(np.float64(x) * np.float64(y) + np.float64(z)) for x, y, z in zip(a, b, c)])
    assert np.array_equal(fma32_ref(a, b, c), exact.astype(np.float32))


# ---- dequantization and layout


@pytest.mark.parametrize("name", TYPE_NAMES)
def test_dequantize_rows_equals_engine_quant(name):
    qtype = GGMLType[name]
    rng = np.random.default_rng(7)
    w = _edge_blocks(name, rng, ROW_GROUP + 9, 128)
    for r0, r1 in ((0, len(w)), (5, 6), (3, ROW_GROUP + 2)):
        want = dequantize_rows(w[r0:r1], qtype)
        for weight in (w, legacy.REPACK[qtype](w)):
            out = np.full((r1 - r0, 128), np.nan, np.float32)
            legacy.DEQUANTIZE_ROWS[qtype](weight, r0, r1, out)
            assert _same(out, want), f"{name} rows {r0}:{r1}"


@pytest.mark.parametrize("name", QUANTS)
def test_repack_keeps_the_bytes(name):
    qtype = GGMLType[name]
    w = _edge_blocks(name, np.random.default_rng(1), 2 * ROW_GROUP + 3, 64)
    rep = repack(qtype, w)
    assert rep.shape == w.shape
    assert rep.nbytes <= w.nbytes + ROW_GROUP * w.shape[1]
    assert np.array_equal(unpack_planes(rep), w)


def test_repack_rejects_wrong_rows():
    with pytest.raises(ValueError, match="whole number"):
        repack(GGMLType.Q4_0, np.zeros((2, 20), np.uint8))
    with pytest.raises(ValueError, match="Q4_K"):
        repack(GGMLType.Q4_K, np.zeros((2, 144), np.uint8))


@needs_numba
@pytest.mark.parametrize("n_rows", [1, 3, 4, 19, 37, 100, 259, 1003])
def test_q8_0_rows_in_fours_and_the_rest_equal_the_reference(n_rows):
    """gemv_q8_0_rows carries four rows a loop (their own fma chains, a quarter of a task apart) and a task's rest
    one by one: ggml's numbers for every row count, -128 weights (vpsignb's wrap) and fp16 scales of every size
    among them."""
    from engine.kernels.legacy.q8_0_rows import gemv_q8_0_rows

    rng = np.random.default_rng(n_rows)
    w = rng.integers(0, 256, (n_rows, 3, 34), dtype=np.uint8)
    w[..., :2] = (rng.standard_normal((n_rows, 3, 1)) * 10.0 ** rng.integers(-6, 2, (n_rows, 3, 1))).astype("<f2").view(
        np.uint8).reshape(n_rows, 3, 2)
    w = w.reshape(n_rows, 102)
    xq = quantize_activation(GGMLType.Q8_0, rng.standard_normal((2, 96)).astype(np.float32))
    for i in range(2):
        got = gemv_q8_0_rows(w, np.ascontiguousarray(xq[i]), np.full(n_rows, np.nan, np.float32))
        want = dot_ref(GGMLType.Q8_0, w, xq[i : i + 1])[0]
        assert _same(got, want), _describe(got, want)


@needs_numba
def test_a_q8_0_weight_without_the_x16_path_reads_its_gguf_blocks(tmp_path):
    """A Q8_0 weight whose rows are not in sixteens (or a CPU without AVX512-VNNI) takes ggml's AVX2 vec_dot
    sequence on the GGUF blocks themselves (path q8_0_rows): llama.cpp's numbers. From the first one-row product
    the blocks are an anonymous copy (a file mapping's small pages slow a whole-weight read), which batches read
    too, and the file's pages leave the process: one copy resident, not two."""
    from engine.kernels.dispatch import BlockProduct, compiled

    if not compiled():
        pytest.skip("the compiled kernels are not in use")
    g = _golden("Q8_0")["quantized_edge"]
    blocks = np.ascontiguousarray(g["w"])  # 24 rows
    blocks.flags.writeable = False
    path = tmp_path / "q8_0.bin"
    blocks.tofile(path)
    mapped = np.memmap(path, np.uint8, mode="r", shape=blocks.shape)
    product = BlockProduct(GGMLType.Q8_0, mapped, g["x"].shape[1])
    assert product.path == "q8_0_rows" and not product.repacked and not product.repack_made
    batch = product(g["x"])  # a prompt reads the mapping
    assert not product.repack_made
    for i in range(len(g["x"])):
        got = product(g["x"][i : i + 1])
        assert _same(got[0], g["dot"][i]), _describe(got[0], g["dot"][i])
    weight = product.weight
    assert not isinstance(weight, np.memmap) and not isinstance(weight.base, np.memmap)
    assert np.array_equal(weight, blocks) and product.raw_parts == [weight]
    again = product(g["x"])  # a prompt after the first decode step reads the copy: the same numbers
    assert np.array_equal(again.view(np.uint32), batch.view(np.uint32))
    ids = np.array([0, 5, 23, 5])  # a tied embedding's look-ups read the copy too
    np.testing.assert_array_equal(product.rows(ids), dequantize_rows(blocks, GGMLType.Q8_0, ids))
