"""engine.quant.dequantize is bit-exact with gguf-py (itself tested against ggml-quants.c)."""
from __future__ import annotations


import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf import quants as gguf_quants

from engine.quant import TYPES, GGMLType, dequantize, dequantize_rows
from tests.conftest import model_path

SUPPORTED = [
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
]
# byte offsets of the fp16 scale fields in one block (block layouts in legacy.py / kquants.py)
F16_FIELDS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}
MODEL_FILES = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]


def reference(raw: np.ndarray, name: str) -> np.ndarray:
    """gguf-py's dequantization, flattened; its NaN/inf warnings are expected here."""
    with np.errstate(all="ignore"):
        return gguf_quants.dequantize(raw, GGMLQuantizationType[name]).reshape(-1)


def random_blocks(name: str, n_blocks: int, seed: int, finite_scales: bool = True) -> np.ndarray:
    """Random bytes for `n_blocks` blocks of `name`, with finite fp16 scales unless told otherwise."""
    rng = np.random.default_rng(seed)
    info = TYPES[GGMLType[name]]
    raw = rng.integers(0, 256, size=(n_blocks, info.type_size), dtype=np.uint8)
    if not finite_scales:
        return raw
    if name in ("F32", "F16", "BF16"):
        values = rng.standard_normal(n_blocks).astype(np.float32)
        if name == "F16":
            return values.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
        if name == "BF16":
            return (values.view(np.uint32) >> 16).astype("<u2").view(np.uint8).reshape(n_blocks, 2)
        return values.view(np.uint8).reshape(n_blocks, 4)
    for offset in F16_FIELDS[name]:
        scales = (rng.standard_normal(n_blocks) * 0.01).astype(np.float16)
        raw[:, offset : offset + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw


@pytest.fixture(scope="module")
def open_model():
    """open_model(file_name) -> GGUFReader, parsed once per module; skips when the file is in no model folder."""
    readers: dict[str, GGUFReader] = {}

    def open_(file_name: str) -> GGUFReader:
        path = model_path(file_name)
        if path is None:
            pytest.skip(f"{file_name} not found in the model folders (set GGUF_LENS_MODELS_DIR)")
        if file_name not in readers:
            readers[file_name] = GGUFReader(path)
        return readers[file_name]

    return open_


@pytest.mark.parametrize("name", SUPPORTED)
def test_random_blocks_match_gguf_py(name: str) -> None:
    raw = random_blocks(name, 2000, seed=SUPPORTED.index(name))
    ours = dequantize(raw, GGMLType[name])
    assert ours.dtype == np.float32
    assert ours.shape == (2000 * TYPES[GGMLType[name]].block_size,)
    assert np.isfinite(ours).all()
    assert np.array_equal(ours, reference(raw, name), equal_nan=True)


@pytest.mark.parametrize("name", SUPPORTED)
def test_nan_and_inf_scales_match_gguf_py(name: str) -> None:
    raw = random_blocks(name, 3000, seed=100 + SUPPORTED.index(name), finite_scales=False)
    for offset, bits in zip(F16_FIELDS.get(name, (0,)), (0x7C00, 0xFE00)):  # +inf, a NaN
        raw[:7, offset : offset + 2] = np.array([bits], dtype="<u2").view(np.uint8)
    assert np.array_equal(dequantize(raw, GGMLType[name]), reference(raw, name), equal_nan=True)


@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "F16"])
def test_any_input_shape_and_int_type_id(name: str) -> None:
    raw = random_blocks(name, 96, seed=7)
    expected = reference(raw, name)
    assert np.array_equal(dequantize(raw.reshape(-1), int(GGMLType[name])), expected)
    assert np.array_equal(dequantize(raw.reshape(4, 24, -1), GGMLType[name]), expected)
    assert np.array_equal(dequantize(raw, GGMLType[name], n_elements=expected.size), expected)


def test_large_input_spans_several_chunks() -> None:
    raw = random_blocks("Q5_0", 20_011, seed=3)  # an odd block count, many kernel chunks
    assert np.array_equal(dequantize(raw, GGMLType.Q5_0), reference(raw, "Q5_0"))


def test_partial_block_is_rejected_with_sizes() -> None:
    raw = np.zeros(144 * 3 + 5, dtype=np.uint8)
    with pytest.raises(ValueError, match=r"Q4_K .*437 bytes.*144-byte blocks"):
        dequantize(raw, GGMLType.Q4_K)


def test_wrong_element_count_is_rejected() -> None:
    with pytest.raises(ValueError, match="expected 100"):
        dequantize(np.zeros(34 * 4, dtype=np.uint8), GGMLType.Q8_0, n_elements=100)


def test_unsupported_and_unknown_types_are_rejected() -> None:
    with pytest.raises(ValueError, match="TQ1_0"):
        dequantize(np.zeros(54, dtype=np.uint8), GGMLType.TQ1_0)
    with pytest.raises(ValueError, match="unknown ggml type id 5"):
        dequantize(np.zeros(4, dtype=np.uint8), 5)


def test_non_uint8_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="uint8"):
        dequantize(np.zeros(8, dtype=np.float32), GGMLType.F32)


def test_dequantize_rows_gathers_only_the_requested_rows() -> None:
    n_rows, n_cols = 50, 640  # a small embedding table in Q8_0, 20 blocks a row
    raw = random_blocks("Q8_0", n_rows * n_cols // 32, seed=11).reshape(n_rows, -1)
    full = reference(raw, "Q8_0").reshape(n_rows, n_cols)
    ids = np.array([3, 0, 49, 3, -1])
    got = dequantize_rows(raw, GGMLType.Q8_0, ids)
    assert got.shape == (5, n_cols)
    assert np.array_equal(got, full[ids])
    assert np.array_equal(dequantize_rows(raw, GGMLType.Q8_0), full)
    assert dequantize_rows(raw, GGMLType.Q8_0, np.array([], dtype=np.int64)).shape == (0, n_cols)


def test_dequantize_rows_checks_its_input() -> None:
    raw = np.zeros((4, 34 * 2), dtype=np.uint8)
    with pytest.raises(IndexError):
        dequantize_rows(raw, GGMLType.Q8_0, [4])
    with pytest.raises(ValueError, match="2-D"):
        dequantize_rows(raw.reshape(-1), GGMLType.Q8_0)
    with pytest.raises(ValueError, match="row of 67 bytes"):
        dequantize_rows(raw[:, :67], GGMLType.Q8_0)


SAMPLE_ABOVE = 16 << 20  # elements: a tensor this large is checked on a sample of its rows


@pytest.mark.parametrize("file_name", MODEL_FILES)
def test_every_tensor_of_real_models_matches_gguf_py(open_model, file_name: str) -> None:
    """Every tensor whole, except the very large ones (Gemma 3's 262k-row embedding, 95% of its weights): those
    through 4,096 rows, the first and last and the rest spread over the tensor."""
    seen: set[str] = set()
    for tensor in open_model(file_name).tensors:
        name = GGMLType(int(tensor.tensor_type)).name
        raw = np.asarray(tensor.data).view(np.uint8)
        n = int(tensor.n_elements)
        if n > SAMPLE_ABOVE and len(tensor.shape) == 2:
            n_rows = int(tensor.shape[1])
            rows = raw.reshape(n_rows, -1)
            pick = np.unique(np.r_[0, n_rows - 1, np.random.default_rng(3).integers(0, n_rows, 4094)])
            raw, n = np.ascontiguousarray(rows[pick]).reshape(-1), len(pick) * int(tensor.shape[0])
        ours = dequantize(raw, GGMLType[name], n)
        assert np.array_equal(ours, reference(raw, name), equal_nan=True), tensor.name
        seen.add(name)
    assert seen >= {"Q8_0", "F32"}


def test_embedding_rows_of_a_real_model(open_model) -> None:
    tensor = next(t for t in open_model(MODEL_FILES[1]).tensors if t.name == "token_embd.weight")
    qtype = GGMLType(int(tensor.tensor_type))
    rows = np.asarray(tensor.data).view(np.uint8)
    rows = rows.reshape(int(tensor.shape[1]), -1)  # gguf shape is (n_cols, n_rows)
    ids = np.array([2, 106, 262_143, 1000])
    got = dequantize_rows(rows, qtype, ids)
    expected = reference(rows[ids], qtype.name).reshape(len(ids), -1)
    assert got.shape == (4, int(tensor.shape[0]))
    assert np.array_equal(got, expected)
