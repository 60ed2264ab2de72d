"""One block decoded field by field agrees with engine.quant.dequantize, on random bytes and on real tensors."""
from __future__ import annotations

import numpy as np
import pytest

from engine.quant import dequantize
from engine.quant.blocks import FIELDS, block_scales, decode_block
from engine.quant.types import TYPES, GGMLType
from tests.conftest import GEMMA3_FILE, SMOLLM2_FILE, model_path

TYPES_WITH_FIELDS = sorted(FIELDS, key=int)


@pytest.mark.parametrize("qtype", TYPES_WITH_FIELDS, ids=lambda t: t.name)
def test_fields_tile_the_block(qtype: GGMLType) -> None:
    spans = sorted((f.offset, f.offset + f.size) for f in FIELDS[qtype])
    assert spans[0][0] == 0 and spans[-1][1] == TYPES[qtype].type_size
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # no gap, no overlap


@pytest.mark.parametrize("qtype", TYPES_WITH_FIELDS, ids=lambda t: t.name)
def test_decode_equals_dequantize_on_random_blocks(qtype: GGMLType) -> None:
    rng = np.random.default_rng(int(qtype))
    info = TYPES[qtype]
    for _ in range(50):
        raw = rng.integers(0, 256, info.type_size, dtype=np.uint8)
        b = decode_block(raw, qtype)
        ref = dequantize(raw, qtype)
        np.testing.assert_array_equal(b.weights, ref)  # bit for bit (NaN where the scale is NaN)
        with np.errstate(all="ignore"):
            recon = b.scales * b.quants.astype(np.float32) + b.offsets
        finite = np.isfinite(ref) & np.isfinite(recon)
        np.testing.assert_allclose(recon[finite], ref[finite], rtol=1e-6, atol=1e-30)
        assert b.weights.shape == b.quants.shape == (info.block_size,)
        assert b.raw.tobytes() == raw.tobytes()


def test_q4_1_fields_by_hand() -> None:
    d, m = np.float16(0.5), np.float16(-1.0)
    qs = np.arange(16, dtype=np.uint8) | (np.uint8(15) << 4)  # weights 0..15 low nibbles, 16..31 all 15
    raw = np.concatenate([np.frombuffer(d.tobytes() + m.tobytes(), np.uint8), qs])
    b = decode_block(raw, GGMLType.Q4_1)
    names = [f.spec.name for f in b.fields]
    assert names == ["d", "m", "qs"]
    assert b.fields[0].values[0] == 0.5 and b.fields[1].values[0] == -1.0
    np.testing.assert_array_equal(b.quants, list(range(16)) + [15] * 16)
    np.testing.assert_array_equal(b.weights, 0.5 * b.quants - 1.0)


def test_q8_0_and_k_scale_fields() -> None:
    raw = np.zeros(34, np.uint8)
    raw[:2] = np.frombuffer(np.float16(0.25).tobytes(), np.uint8)
    raw[2:] = np.arange(-16, 16, dtype=np.int8).view(np.uint8)
    b = decode_block(raw, GGMLType.Q8_0)
    np.testing.assert_array_equal(b.fields[1].values, np.arange(-16, 16))
    np.testing.assert_array_equal(b.weights, 0.25 * np.arange(-16, 16))
    blocks = np.random.default_rng(0).integers(0, 256, (7, 144), dtype=np.uint8)
    s = block_scales(blocks, GGMLType.Q4_K)
    assert set(s) == {"d", "dmin", "d*sc", "dmin*m"} and s["d"].shape == (7,) and s["d*sc"].shape == (56,)
    assert block_scales(blocks[:, :4].reshape(-1, 4), GGMLType.F32) == {}


def test_bad_input_is_rejected_with_a_message() -> None:
    with pytest.raises(ValueError, match="18 bytes"):
        decode_block(np.zeros(17, np.uint8), GGMLType.Q4_0)
    with pytest.raises(ValueError, match="not supported"):
        decode_block(np.zeros(TYPES[GGMLType.TQ1_0].type_size, np.uint8), GGMLType.TQ1_0)


@pytest.mark.parametrize("file", [SMOLLM2_FILE, GEMMA3_FILE])
def test_real_blocks_decode_like_the_dequantizer(file: str) -> None:
    path = model_path(file)
    if path is None:
        pytest.skip(f"model {file} not found")
    from engine.gguf import open_gguf  # noqa: PLC0415

    seen = set()
    with open_gguf(path) as g:
        for name, info in g.tensors.items():
            if info.qtype in seen or info.qtype not in FIELDS:
                continue
            seen.add(info.qtype)
            ti = TYPES[info.qtype]
            blocks = g.raw(name).reshape(-1, ti.type_size)
            for i in (0, len(blocks) // 2, len(blocks) - 1):
                b = decode_block(blocks[i], info.qtype)
                np.testing.assert_array_equal(b.weights, dequantize(np.array(blocks[i]), info.qtype))
            scales = block_scales(np.array(blocks[:64]), info.qtype)
            if ti.block_size > 1:
                np.testing.assert_array_equal(scales["d"][:1], decode_block(blocks[0], info.qtype).fields[
                    [f.spec.name for f in decode_block(blocks[0], info.qtype).fields].index("d")].values)
    assert len(seen) >= 2
