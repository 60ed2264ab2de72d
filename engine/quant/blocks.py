"""One quantized block taken apart field by field, and the block scales of a whole tensor.

The field tables follow the block structs of ggml-common.h (block_q4_0 ... block_q6_K) byte for byte.
`decode_block` also returns, for every weight of the block, the integer quant q, the scale it is
multiplied by and the offset added, with w = scale * q + offset computed in float32 in the same order
as the dequantizers (so the result equals `dequantize` of that block exactly).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from . import floats, iquant_blocks, kquants, legacy, mxfp4
from .types import TYPES, GGMLType

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class FieldSpec:
    """One member of a block struct: name, byte offset and size, storage kind, and what it means."""

    name: str
    offset: int
    size: int
    kind: str  # 'f16', 'bf16', 'f32', 'u8', 'i8', 'nibbles', 'bits', '2-bit', '6-bit packed'
    meaning: str


_F = FieldSpec
_T = GGMLType
# as the structs in ggml/src/ggml-common.h
FIELDS: dict[GGMLType, tuple[FieldSpec, ...]] = {
    _T.F32: (_F("value", 0, 4, "f32", "the weight"),),
    _T.F16: (_F("value", 0, 2, "f16", "the weight"),),
    _T.BF16: (_F("value", 0, 2, "bf16", "the weight"),),
    _T.Q4_0: (_F("d", 0, 2, "f16", "block scale"), _F("qs", 2, 16, "nibbles", "4-bit quants: byte i holds weights i (low) and i+16 (high)")),
    _T.Q4_1: (
        _F("d", 0, 2, "f16", "block scale"),
        _F("m", 2, 2, "f16", "block minimum"),
        _F("qs", 4, 16, "nibbles", "4-bit quants: byte i holds weights i (low) and i+16 (high)"),
    ),
    _T.Q5_0: (
        _F("d", 0, 2, "f16", "block scale"),
        _F("qh", 2, 4, "bits", "fifth bit of each weight (bit j of a little-endian uint32)"),
        _F("qs", 6, 16, "nibbles", "low 4 bits: byte i holds weights i and i+16"),
    ),
    _T.Q5_1: (
        _F("d", 0, 2, "f16", "block scale"),
        _F("m", 2, 2, "f16", "block minimum"),
        _F("qh", 4, 4, "bits", "fifth bit of each weight (bit j of a little-endian uint32)"),
        _F("qs", 8, 16, "nibbles", "low 4 bits: byte i holds weights i and i+16"),
    ),
    _T.Q8_0: (_F("d", 0, 2, "f16", "block scale"), _F("qs", 2, 32, "i8", "8-bit signed quants")),
    _T.MXFP4: (_F("e", 0, 1, "u8", "E8M0 exponent: d = 2^(e - 128), half the scale (the E2M1 codes are stored doubled)"),
               _F("qs", 1, 16, "nibbles", "E2M1 codes: byte i holds weights i (low) and i+16 (high)")),
    _T.Q2_K: (
        _F("scales", 0, 16, "u8", "per 16 weights: 4-bit scale (low) and 4-bit min (high)"),
        _F("qs", 16, 64, "2-bit", "2-bit quants, four planes per byte"),
        _F("d", 80, 2, "f16", "super-block scale of the scales"),
        _F("dmin", 82, 2, "f16", "super-block scale of the mins"),
    ),
    _T.Q3_K: (
        _F("hmask", 0, 32, "bits", "third (high) bit of each quant; set means no -4"),
        _F("qs", 32, 64, "2-bit", "low 2 bits of each quant"),
        _F("scales", 96, 12, "6-bit packed", "16 signed 6-bit scales, one per 16 weights"),
        _F("d", 108, 2, "f16", "super-block scale"),
    ),
    _T.Q4_K: (
        _F("d", 0, 2, "f16", "super-block scale of the scales"),
        _F("dmin", 2, 2, "f16", "super-block scale of the mins"),
        _F("scales", 4, 12, "6-bit packed", "8 scales and 8 mins, 6 bits each, one pair per 32 weights"),
        _F("qs", 16, 128, "nibbles", "4-bit quants"),
    ),
    _T.Q5_K: (
        _F("d", 0, 2, "f16", "super-block scale of the scales"),
        _F("dmin", 2, 2, "f16", "super-block scale of the mins"),
        _F("scales", 4, 12, "6-bit packed", "8 scales and 8 mins, 6 bits each, one pair per 32 weights"),
        _F("qh", 16, 32, "bits", "fifth bit of each quant"),
        _F("qs", 48, 128, "nibbles", "low 4 bits of each quant"),
    ),
    _T.Q6_K: (
        _F("ql", 0, 128, "nibbles", "low 4 bits of each quant"),
        _F("qh", 128, 64, "2-bit", "high 2 bits of each quant"),
        _F("scales", 192, 16, "i8", "signed 8-bit scale per 16 weights"),
        _F("d", 208, 2, "f16", "super-block scale"),
    ),
}

FORMULAS: dict[GGMLType, str] = {
    _T.F32: "w = value",
    _T.F16: "w = value",
    _T.BF16: "w = value",
    _T.Q4_0: "w = d * (q - 8)",
    _T.Q4_1: "w = d * q + m",
    _T.Q5_0: "w = d * (q - 16)",
    _T.Q5_1: "w = d * q + m",
    _T.Q8_0: "w = d * q",
    _T.MXFP4: "w = d * kvalues[q]   (kvalues: 0 1 2 3 4 6 8 12, negated for q >= 8)",
    _T.Q2_K: "w = (d * sc) * q - (dmin * m)   (sc, m per 16 weights)",
    _T.Q3_K: "w = (d * (sc - 32)) * (q - 4 * !hbit)   (sc per 16 weights)",
    _T.Q4_K: "w = (d * sc) * q - (dmin * m)   (sc, m per 32 weights)",
    _T.Q5_K: "w = (d * sc) * q - (dmin * m)   (sc, m per 32 weights)",
    _T.Q6_K: "w = (d * sc) * (q - 32)   (sc per 16 weights)",
    **iquant_blocks.FORMULAS,
}


@dataclass(frozen=True)
class DecodedField:
    """A field of one block: where it is, its raw bytes, and the values it decodes to."""

    spec: FieldSpec
    raw: U8
    values: npt.NDArray  # scalars for scales; per-weight values in weight order for packed quants


@dataclass(frozen=True)
class DecodedBlock:
    """One block: its fields and, per weight, the integer quant, scale and offset with w = scale * q + offset."""

    type_name: str
    block_size: int
    type_size: int
    raw: U8
    fields: tuple[DecodedField, ...]
    quants: npt.NDArray[np.int32]  # (block_size,) the integer q each weight stores (as in the formula)
    scales: F32  # (block_size,) what q is multiplied by
    offsets: F32  # (block_size,) what is added after
    weights: F32  # (block_size,) float32 weights
    formula: str


def _f16(b: U8, off: int) -> F32:
    return floats.f16_bits_to_f32(b[:, off : off + 2].view("<u2"))[:, 0]


def _quants(blocks: U8, qtype: GGMLType) -> tuple[np.ndarray, F32, F32, dict[str, np.ndarray]]:
    """(q, scale, offset) per weight of a (1, type_size) block, and decoded values per field name."""
    t, b = qtype, blocks
    if t in iquant_blocks.FORMULAS:
        return iquant_blocks.quants(b, t)
    if t in (_T.F32, _T.F16, _T.BF16):
        w = {_T.F32: floats.dequantize_f32, _T.F16: floats.dequantize_f16, _T.BF16: floats.dequantize_bf16}[t](b).reshape(1)
        return np.zeros(1, np.int32), np.ones(1, np.float32), w, {"value": w}  # w = 1 * 0 + value
    if t in (_T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q5_1, _T.Q8_0):
        d = _f16(b, 0)
        has_m = t in (_T.Q4_1, _T.Q5_1)
        qs_off = {_T.Q4_0: 2, _T.Q4_1: 4, _T.Q5_0: 6, _T.Q5_1: 8, _T.Q8_0: 2}[t]
        vals: dict[str, np.ndarray] = {"d": d}
        if t == _T.Q8_0:
            q = b[0, 2:].view(np.int8).astype(np.int32)
            vals["qs"] = q
        else:
            nib = legacy._nibbles(b[:, qs_off:])[0].astype(np.int32)
            vals["qs"] = nib
            q = nib
            if t in (_T.Q5_0, _T.Q5_1):
                hi = legacy._fifth_bits(b[:, qs_off - 4 : qs_off])[0].astype(np.int32)
                vals["qh"] = hi >> 4
                q = nib | hi
            q = q - {_T.Q4_0: 8, _T.Q5_0: 16}.get(t, 0)
        if has_m:
            vals["m"] = _f16(b, 2)
        off = np.full(32, vals["m"][0] if has_m else 0.0, np.float32)
        return q, np.full(32, d[0], np.float32), off, vals
    if t == _T.MXFP4:  # q is the value of the code (kvalues_mxfp4), the scale d
        d = mxfp4.e8m0_half(b[:, 0])
        codes = legacy._nibbles(b[:, 1:])[0].astype(np.int32)
        return mxfp4.KVALUES[codes].astype(np.int32), np.full(32, d[0], np.float32), np.zeros(32, np.float32), \
            {"e": b[:, 0].astype(np.int32), "qs": codes}
    if t == _T.Q2_K:
        sc = b[0, 0:16]
        dl = _f16(b, 80) * (sc & 15).astype(np.float32)
        ml = _f16(b, 82) * (sc >> 4).astype(np.float32)
        q = kquants._two_bit_planes(b[:, 16:80])[0].astype(np.int32)
        vals = {"scales": np.stack([sc & 15, sc >> 4]), "qs": q, "d": _f16(b, 80), "dmin": _f16(b, 82)}
        return q, np.repeat(dl, 16), -np.repeat(ml, 16), vals
    if t == _T.Q3_K:
        sc = kquants.q3_k_scales(b[:, 96:108])[0].astype(np.int32)
        low = kquants._two_bit_planes(b[:, 32:96])[0].astype(np.int32)
        hbit = kquants._bit_planes(b[:, 0:32])[0].astype(np.int32)
        q = (low | (hbit << 2)) - 4
        dl = _f16(b, 108) * sc.astype(np.float32)
        vals = {"hmask": hbit, "qs": low, "scales": sc, "d": _f16(b, 108)}
        return q, np.repeat(dl, 16), np.zeros(256, np.float32), vals
    if t in (_T.Q4_K, _T.Q5_K):
        sc, mn = kquants.k4_scales_mins(b[:, 4:16])
        dl = _f16(b, 0) * sc[0].astype(np.float32)
        ml = _f16(b, 2) * mn[0].astype(np.float32)
        qs_off = 16 if t == _T.Q4_K else 48
        nib = kquants._nibble_pairs(b[:, qs_off : qs_off + 128])[0].astype(np.int32)
        vals = {"d": _f16(b, 0), "dmin": _f16(b, 2), "scales": np.stack([sc[0], mn[0]]), "qs": nib}
        q = nib
        if t == _T.Q5_K:
            hb = kquants._bit_planes(b[:, 16:48])[0].astype(np.int32)
            vals["qh"] = hb
            q = nib | (hb << 4)
        return q, np.repeat(dl, 32), -np.repeat(ml, 32), vals
    if t == _T.Q6_K:
        low = ((b[:, 0:128].reshape(-1, 2, 1, 64) >> kquants._SHIFT_NIBBLE.reshape(1, 1, 2, 1)) & 15).reshape(256)
        high = ((b[:, 128:192].reshape(-1, 2, 1, 32) >> kquants._SHIFT_2BIT.reshape(1, 1, 4, 1)) & 3).reshape(256)
        q = (low.astype(np.int32) | (high.astype(np.int32) << 4)) - 32
        sc = b[0, 192:208].view(np.int8).astype(np.int32)
        dl = _f16(b, 208) * sc.astype(np.float32)
        vals = {"ql": low.astype(np.int32), "qh": high.astype(np.int32), "scales": sc, "d": _f16(b, 208)}
        return q, np.repeat(dl, 16), np.zeros(256, np.float32), vals
    raise ValueError(f"decoding {t.name} blocks is not supported")


FIELDS.update({t: tuple(FieldSpec(*f) for f in specs) for t, specs in iquant_blocks.fields().items()})


def decode_block(block: npt.ArrayLike, qtype: GGMLType | int) -> DecodedBlock:
    """Take one block (type_size bytes) apart field by field; ValueError for types without a table."""
    t = GGMLType(int(qtype))
    info = TYPES[t]
    raw = np.ascontiguousarray(np.asarray(block, dtype=np.uint8).reshape(-1))
    if raw.size != info.type_size:
        raise ValueError(f"a {t.name} block is {info.type_size} bytes, got {raw.size}")
    if t not in FIELDS:
        raise ValueError(f"decoding {t.name} blocks is not supported")
    with np.errstate(all="ignore"):
        q, scale, offset, vals = _quants(raw.reshape(1, -1), t)
        scale = scale.astype(np.float32)
        offset = offset.astype(np.float32)
        if t in (_T.F32, _T.F16, _T.BF16):
            w = offset.copy()
        elif t in (_T.Q4_1, _T.Q5_1):  # y = q; y *= d; y += m, as dequantize_row_q4_1
            w = q.astype(np.float32) * scale + offset
        elif t in (_T.Q2_K, _T.Q4_K, _T.Q5_K):  # dl * q - ml
            w = scale * q.astype(np.float32) - (-offset)
        else:
            w = scale * q.astype(np.float32)
    fields = tuple(
        DecodedField(spec, raw[spec.offset : spec.offset + spec.size].copy(), np.asarray(vals.get(spec.name, [])))
        for spec in FIELDS[t]
    )
    return DecodedBlock(t.name, info.block_size, info.type_size, raw.copy(), fields, q.astype(np.int32), scale, offset, w.astype(np.float32), FORMULAS[t])


def block_scales(blocks: U8, qtype: GGMLType | int) -> dict[str, F32]:
    """Scales of every block of a (n_blocks, type_size) array: raw d (and m/dmin) and effective sub-block scales."""
    t = GGMLType(int(qtype))
    b = np.ascontiguousarray(blocks)
    if len(b) == 0 or t in (_T.F32, _T.F16, _T.BF16) or t not in FIELDS:
        return {}
    with np.errstate(all="ignore"):
        if t in iquant_blocks.FORMULAS:
            return iquant_blocks.block_scales(b, t)
        if t in (_T.Q4_0, _T.Q5_0, _T.Q8_0):
            return {"d": _f16(b, 0)}
        if t in (_T.Q4_1, _T.Q5_1):
            return {"d": _f16(b, 0), "m": _f16(b, 2)}
        if t == _T.MXFP4:
            return {"d": mxfp4.e8m0_half(b[:, 0])}
        if t == _T.Q2_K:
            sc = b[:, 0:16]
            d, dmin = _f16(b, 80)[:, None], _f16(b, 82)[:, None]
            return {"d": d[:, 0], "dmin": dmin[:, 0], "d*sc": (d * (sc & 15)).ravel(), "dmin*m": (dmin * (sc >> 4)).ravel()}
        if t == _T.Q3_K:
            d = _f16(b, 108)[:, None]
            return {"d": d[:, 0], "d*sc": (d * kquants.q3_k_scales(b[:, 96:108]).astype(np.float32)).ravel()}
        if t in (_T.Q4_K, _T.Q5_K):
            sc, mn = kquants.k4_scales_mins(b[:, 4:16])
            d, dmin = _f16(b, 0)[:, None], _f16(b, 2)[:, None]
            return {"d": d[:, 0], "dmin": dmin[:, 0], "d*sc": (d * sc).ravel(), "dmin*m": (dmin * mn).ravel()}
        if t == _T.Q6_K:
            d = _f16(b, 208)[:, None]
            return {"d": d[:, 0], "d*sc": (d * b[:, 192:208].view(np.int8).astype(np.float32)).ravel()}
    return {}


def histogram(x: npt.ArrayLike, bins: int = 128) -> tuple[npt.NDArray[np.int64], F32, dict[str, float]]:
    """Histogram of the finite values of x over their range, and summary statistics (min, max, mean, std, ...)."""
    x = np.asarray(x, np.float32).reshape(-1)
    finite = x[np.isfinite(x)]
    if finite.size == 0:
        return np.zeros(bins, np.int64), np.linspace(0, 1, bins + 1, dtype=np.float32), {}
    lo, hi = float(finite.min()), float(finite.max())
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    counts, edges = np.histogram(finite, bins=bins, range=(lo, hi))
    stats = {
        "min": float(finite.min()),
        "max": float(finite.max()),
        "mean": float(finite.mean(dtype=np.float64)),
        "std": float(finite.std(dtype=np.float64)),
        "absmax": float(np.abs(finite).max()),
        "non_finite": float(x.size - finite.size),
        "count": float(x.size),
    }
    return counts.astype(np.int64), edges.astype(np.float32), stats
