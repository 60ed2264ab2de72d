"""I-quant dequantization (engine/quant/iquants.py) bit for bit as gguf-py's, and the types load.

Fixture: tests/fixtures/quant/iquants.npz, made by tools/make_iquant_fixtures.py: per type, blocks that
llama.cpp quantized, random bytes and edge blocks (zero, 0xFF, 0x55, 0xAA, the largest, a subnormal, a
negative, an infinite and a NaN scale), with gguf-py's dequantization of them (which the tool checked against
ggml's own dequantize_row_iq*). The grids are checked against gguf-py's own copies.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.quant import TYPES, GGMLType, dequantize, dequantize_rows
from engine.quant.iquant_grids import grid_bytes, ksigns, kvalues_iq4nl

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "fixtures" / "quant" / "iquants.npz"
IQ_TYPES = ["IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"]


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(FIXTURE) as f:
        return dict(f)


def assert_same_bits(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    """The same float32 bits (-0 != +0, the same NaN payloads)."""
    assert ours.dtype == np.float32 and ours.shape == theirs.shape, what
    bad = ours.view(np.uint32) != theirs.view(np.uint32)
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} values differ, first at {np.argwhere(bad)[0]}"


@pytest.mark.parametrize("name", IQ_TYPES)
def test_dequantize_matches_the_fixture_bit_for_bit(golden: dict[str, np.ndarray], name: str) -> None:
    blocks = golden[f"blocks_{name}"]
    expected = golden[f"values_{name}"].view(np.float32)
    assert blocks.shape == (26, TYPES[GGMLType[name]].type_size)
    assert np.isnan(expected).any() and np.isinf(expected).any()  # the edge scales are in the fixture
    assert_same_bits(dequantize(blocks, GGMLType[name]), expected, name)
    # one block at a time (no cross-block state), and as rows
    each = np.concatenate([dequantize(b, GGMLType[name]) for b in blocks])
    assert_same_bits(each, expected, f"{name} block by block")
    rows = dequantize_rows(blocks.reshape(2, -1), GGMLType[name], [1])
    assert_same_bits(rows.reshape(-1), expected.reshape(2, -1)[1], f"{name} row 1")


@pytest.mark.parametrize("name", IQ_TYPES)
def test_dequantize_matches_gguf_py_on_random_bytes(name: str) -> None:
    """Any bytes, NaN and infinite scales included: the same bits as gguf-py."""
    gguf_quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType

    info = TYPES[GGMLType[name]]
    raw = np.random.default_rng(sum(map(ord, name))).integers(0, 256, (3000, info.type_size), dtype=np.uint8)
    with np.errstate(all="ignore"):
        theirs = gguf_quants.dequantize(raw, GGMLQuantizationType[name]).reshape(-1).astype(np.float32)
    assert_same_bits(dequantize(raw, GGMLType[name]), theirs, name)


def test_grids_are_gguf_py_grids() -> None:
    gguf_quants = pytest.importorskip("gguf.quants")
    for table, cls_name in [("iq2xxs_grid", "IQ2_XXS"), ("iq2xs_grid", "IQ2_XS"), ("iq2s_grid", "IQ2_S"),
                            ("iq3xxs_grid", "IQ3_XXS"), ("iq3s_grid", "IQ3_S"), ("iq1s_grid", "IQ1_S")]:
        cls = getattr(gguf_quants, cls_name)
        cls.init_grid()
        raw = grid_bytes(table)
        ours = (raw.view(np.int8) if table == "iq1s_grid" else raw).astype(np.float32)
        assert np.array_equal(ours, np.asarray(cls.grid).reshape(ours.shape)), table
    assert ksigns().tobytes() == gguf_quants.IQ2_XXS.ksigns
    assert kvalues_iq4nl().tolist() == list(gguf_quants.IQ4_NL.kvalues)
    assert not grid_bytes("iq2s_grid").flags.writeable


def test_ksigns_have_even_parity() -> None:
    """ksigns_iq2xs stores 7 sign bits and an eighth that makes the count even (the format's invariant)."""
    s = ksigns()
    assert np.array_equal(s & 0x7F, np.arange(128))
    assert (np.unpackbits(s[:, None], axis=1).sum(axis=1) % 2 == 0).all()


@pytest.mark.parametrize("name", IQ_TYPES)
def test_types_are_supported_and_checked(name: str) -> None:
    info = TYPES[GGMLType[name]]
    assert info.supported
    with pytest.raises(ValueError, match=f"not a whole number of {info.type_size}-byte blocks"):
        dequantize(np.zeros(info.type_size + 1, np.uint8), info.qtype)


def test_a_gguf_with_i_quant_tensors_loads(tmp_path: Path, golden: dict[str, np.ndarray]) -> None:
    """The reader accepts every i-quant tensor and its bytes dequantize to the fixture's values."""
    from engine.gguf.reader import open_gguf
    from engine.gguf.writer import write_gguf

    tensors = []
    for name in IQ_TYPES:
        info = TYPES[GGMLType[name]]
        blocks = golden[f"blocks_{name}"][:8]
        tensors.append((f"t.{name.lower()}", info.qtype, (8 * info.block_size // 2, 2), blocks.reshape(-1)))
    path = tmp_path / "iq.gguf"
    write_gguf(path, {"general.architecture": "llama"}, tensors)
    with open_gguf(path) as gguf:
        for name in IQ_TYPES:
            t = gguf.tensors[f"t.{name.lower()}"]
            assert t.qtype == GGMLType[name]
            expected = golden[f"values_{name}"].view(np.float32)[: 8 * TYPES[GGMLType[name]].block_size]
            assert_same_bits(dequantize_rows(gguf.rows(t.name), t.qtype).reshape(-1), expected, name)


@pytest.mark.parametrize("name", IQ_TYPES)
def test_decoded_blocks_give_the_dequantized_weights(golden: dict[str, np.ndarray], name: str) -> None:
    """decode_block's w = scale * q + offset is dequantize's result bit for bit, edge blocks included."""
    from engine.quant.blocks import block_scales, decode_block

    qtype = GGMLType[name]
    blocks = golden[f"blocks_{name}"]
    expected = golden[f"values_{name}"].view(np.float32).reshape(len(blocks), -1)
    for i, raw in enumerate(blocks):
        block = decode_block(raw, qtype)
        assert_same_bits(block.weights, expected[i], f"{name} block {i}")
        assert block.quants.dtype == np.int32 and not block.offsets.any()
        with np.errstate(all="ignore"):
            product = block.scales * block.quants.astype(np.float32)
        assert_same_bits(product, expected[i], f"{name} block {i}: scale * q")
        assert sum(f.spec.size for f in block.fields) == TYPES[qtype].type_size
    assert block_scales(blocks, qtype)["d"].shape == (len(blocks),)
