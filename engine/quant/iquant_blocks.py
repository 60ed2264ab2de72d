"""The i-quant blocks taken apart field by field for the Quantization lens (blocks.py merges these tables).

Field tables follow block_iq2_xxs ... block_iq4_xs in ggml-common.h byte for byte. Per weight, `quants` returns
the integer q, the scale and the offset with w = scale * q (offset 0) equal to `dequantize` bit for bit:
  grid types:  q = the signed grid value (magnitude from the grid, sign from the sign bits), scale the
               sub-block's db, so scale * q = +-(db * grid) as dequantize_row_iq2_xxs / iq3_s compute it;
  IQ1_S/IQ1_M: w = dl * (grid + delta) with grid in {-1, 0, 1} and delta = +-1/8, written exactly as
               q = 8 * grid + 8 * delta (odd integers -9 .. 9) and scale = dl / 8;
  IQ4_NL/XS:   q = the non-linear level kvalues_iq4nl[nibble], scale d (IQ4_XS: d * (ls - 32)).
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from . import iquants as iq
from .iquant_grids import ksigns, kvalues_iq4nl
from .types import GGMLType

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]
_T = GGMLType


def _field(name: str, offset: int, size: int, kind: str, meaning: str) -> tuple[str, int, int, str, str]:
    """(name, byte offset, bytes, stored as, meaning): blocks.py makes its FieldSpec of it."""
    return name, offset, size, kind, meaning


_SIGNS7 = "7-bit sign index per 8 weights (ksigns_iq2xs adds the even-parity eighth)"
_SCALES16 = "4-bit scales ls, one per 16 weights: db = d * (0.5 + ls) / 4"


def fields() -> dict[GGMLType, tuple[tuple[str, int, int, str, str], ...]]:
    """The FieldSpec tables of the nine i-quant types (as the structs in ggml-common.h)."""
    f = _field
    d = f("d", 0, 2, "f16", "super-block scale")
    return {
        _T.IQ2_XXS: (d, f("qs", 2, 64, "u32 pairs", "per 32 weights: 4 grid indices (iq2xxs_grid), then 4 x "
                                                    "7 sign bits and a 4-bit scale ls (top bits)")),
        _T.IQ2_XS: (d, f("qs", 2, 64, "u16", "per 8 weights: 9-bit iq2xs_grid index | 7-bit sign index << 9"),
                    f("scales", 66, 8, "nibbles", _SCALES16)),
        _T.IQ2_S: (d, f("qs", 2, 32, "u8", "low 8 bits of each 10-bit iq2s_grid index (per 8 weights)"),
                   f("signs", 34, 32, "bits", "one sign bit per weight"),
                   f("qh", 66, 8, "2-bit", "high 2 bits of the grid indices"),
                   f("scales", 74, 8, "nibbles", _SCALES16)),
        _T.IQ3_XXS: (d, f("qs", 2, 64, "u8", "iq3xxs_grid index per 4 weights"),
                     f("scales_signs", 66, 32, "u32", "per 32 weights: 4 x " + _SIGNS7[:11] + " and a 4-bit scale ls: "
                                                      "db = d * (0.5 + ls) / 2")),
        _T.IQ3_S: (d, f("qs", 2, 64, "u8", "low 8 bits of each 9-bit iq3s_grid index (per 4 weights)"),
                   f("qh", 66, 8, "bits", "ninth bit of the grid indices"),
                   f("signs", 74, 32, "bits", "one sign bit per weight"),
                   f("scales", 106, 4, "nibbles", "4-bit scales ls per 32 weights: db = d * (1 + 2 ls)")),
        _T.IQ1_S: (d, f("qs", 2, 32, "u8", "low 8 bits of each 11-bit iq1s_grid index (per 8 weights)"),
                   f("qh", 34, 16, "u16", "per 32 weights: 4 x 3 high index bits, a 3-bit scale s and the "
                                          "delta sign: dl = d * (2 s + 1)")),
        _T.IQ1_M: (f("qs", 0, 32, "u8", "low 8 bits of each 11-bit iq1s_grid index (per 8 weights)"),
                   f("qh", 32, 16, "nibbles", "per 8 weights: 3 high index bits and the delta sign"),
                   f("scales", 48, 8, "u16", "3-bit scales s per 16 weights (dl = d * (2 s + 1)); the top "
                                             "nibbles of the four words are the fp16 d")),
        _T.IQ4_NL: (d, f("qs", 2, 16, "nibbles", "4-bit level indices: byte i holds weights i (low) and i+16")),
        _T.IQ4_XS: (d, f("scales_h", 2, 2, "2-bit", "high 2 bits of the eight 6-bit scales"),
                    f("scales_l", 4, 4, "nibbles", "low 4 bits of the scales: ls - 32 per 32 weights"),
                    f("qs", 8, 128, "nibbles", "4-bit level indices, per 32 weights as IQ4_NL")),
    }


_GRID = "w = db * q   (q = grid value * sign; db per "
FORMULAS: dict[GGMLType, str] = {
    _T.IQ2_XXS: _GRID + "32 weights, d * (0.5 + ls) / 4)",
    _T.IQ2_XS: _GRID + "16 weights, d * (0.5 + ls) / 4)",
    _T.IQ2_S: _GRID + "16 weights, d * (0.5 + ls) / 4)",
    _T.IQ3_XXS: _GRID + "32 weights, d * (0.5 + ls) / 2)",
    _T.IQ3_S: _GRID + "32 weights, d * (1 + 2 ls))",
    _T.IQ1_S: "w = dl * (grid ± 1/8) = (dl / 8) * q   (q = 8 grid ± 1; dl per 32 weights)",
    _T.IQ1_M: "w = dl * (grid ± 1/8) = (dl / 8) * q   (q = 8 grid ± 1; dl per 16 weights)",
    _T.IQ4_NL: "w = d * kvalues[q4]   (16 non-linear levels)",
    _T.IQ4_XS: "w = (d * (ls - 32)) * kvalues[q4]   (ls per 32 weights)",
}


def _grid_values(name: str, idx: np.ndarray) -> np.ndarray:
    return iq.grid(name)[idx].astype(np.int32)


def _sign_factors(bits: np.ndarray) -> np.ndarray:
    """Sign bytes (...,) -> (..., 8) int32 factors +1 / -1 (bit k set: weight k negative)."""
    return 1 - 2 * ((bits[..., None].astype(np.int32) >> np.arange(8)) & 1)


def quants(b: U8, t: GGMLType) -> tuple[np.ndarray, F32, F32, dict[str, np.ndarray]]:
    """(q, scale, offset) per weight of a (1, type_size) i-quant block, and decoded values per field name."""
    d = iq.iq1_m_scale(b)[0] if t == _T.IQ1_M else iq._f16(b, 0)[0]
    if t in (_T.IQ4_NL, _T.IQ4_XS):
        qs = b[:, 2:18] if t == _T.IQ4_NL else b[:, 8:136]
        nib = ((qs.reshape(-1, 1, 16) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)) & 15).reshape(-1)
        q = kvalues_iq4nl()[nib].astype(np.int32)
        if t == _T.IQ4_NL:
            return q, np.full(32, d[0], np.float32), np.zeros(32, np.float32), {"d": d, "qs": nib}
        ls = iq.iq4_xs_scales(b)[0].astype(np.int32)
        scale = np.repeat(d * ls.astype(np.float32), 32)
        vals = {"d": d, "scales_h": ls + 32 >> 4, "scales_l": ls + 32 & 15, "qs": nib}
        return q, scale, np.zeros(256, np.float32), vals
    if t in (_T.IQ1_S, _T.IQ1_M):
        q, dl, vals = _iq1_quants(b, t, d[0])
        return q, (dl * np.float32(0.125)).astype(np.float32), np.zeros(256, np.float32), {"d": d, **vals}
    q, db, vals = _grid_quants(b, t, d)
    return q, db.astype(np.float32), np.zeros(256, np.float32), {"d": d, **vals}


def _iq1_quants(b: U8, t: GGMLType, d: np.float32) -> tuple[np.ndarray, F32, dict[str, np.ndarray]]:
    """q = 8 * grid + 8 * delta (256,) and dl per weight of an IQ1_S / IQ1_M block, as dequantize_row_iq1_*."""
    if t == _T.IQ1_S:
        qh = b[0, 34:50].view("<u2")
        s = (qh >> 12) & 7
        high = ((qh[:, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7).reshape(32)
        neg = np.repeat((qh & 0x8000) != 0, 4)  # per group of 8
        idx = b[0, 2:34].astype(np.int32) | (high.astype(np.int32) << 8)
        dl = np.repeat(d * (np.uint16(2) * s + np.uint16(1)), 32)
    else:
        sc = b[0, 48:56].view("<u2")
        s = ((sc[:, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7).reshape(16)
        nib = ((b[0, 32:48, None] >> np.array([0, 4], np.uint8)) & 15).reshape(32)
        neg = (nib & 8) != 0
        idx = b[0, 0:32].astype(np.int32) | ((nib & 7).astype(np.int32) << 8)
        dl = np.repeat(d * (np.uint16(2) * s + np.uint16(1)), 16)
    g = _grid_values("iq1s_grid", idx).reshape(32, 8)
    q = (8 * g + np.where(neg, -1, 1)[:, None]).reshape(256)
    return q, dl.astype(np.float32), {"qs": idx & 255, "qh": idx >> 8, "scales": s.astype(np.int32),
                                      "delta_sign": np.where(neg, -1, 1)}


def _grid_quants(b: U8, t: GGMLType, d: F32) -> tuple[np.ndarray, F32, dict[str, np.ndarray]]:
    """Signed grid values (256,) and db per weight of the IQ2 / IQ3 types."""
    if t in (_T.IQ2_XXS, _T.IQ3_XXS):
        aux = b[0, 2:66].view("<u4").reshape(8, 2) if t == _T.IQ2_XXS else b[0, 66:98].view("<u4")
        tail = aux[:, 1] if t == _T.IQ2_XXS else aux
        ls = (tail >> 28).astype(np.float32)
        sidx = (tail[:, None] >> np.array([0, 7, 14, 21], np.uint32)) & 127
        signs = _sign_factors(ksigns()[sidx]).reshape(256)
        if t == _T.IQ2_XXS:
            idx = np.ascontiguousarray(aux[:, 0]).view(np.uint8)
            g = _grid_values("iq2xxs_grid", idx).reshape(256)
            db = d * (np.float32(0.5) + ls) * np.float32(0.25)
            return g * signs, np.repeat(db, 32), {"qs": idx}  # the grid indices (the tail bits: see formula)
        g = _grid_values("iq3xxs_grid", b[0, 2:66]).reshape(256)
        db = d * (np.float32(0.5) + ls) * np.float32(0.5)
        return g * signs, np.repeat(db, 32), {"qs": b[0, 2:66], "scales_signs": ls.astype(np.int32)}
    if t == _T.IQ2_XS:
        q16 = b[0, 2:66].view("<u2")
        ls = np.stack([b[0, 66:74] & 15, b[0, 66:74] >> 4], axis=1).reshape(16).astype(np.float32)
        g = _grid_values("iq2xs_grid", q16 & 511).reshape(256)
        signs = _sign_factors(ksigns()[q16 >> 9]).reshape(256)
        db = d * (np.float32(0.5) + ls) * np.float32(0.25)
        return g * signs, np.repeat(db, 16), {"qs": q16, "scales": ls.astype(np.int32)}
    if t == _T.IQ2_S:
        qh = ((b[0, 66:74, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3).reshape(32)
        idx = b[0, 2:34].astype(np.int32) | (qh.astype(np.int32) << 8)
        ls = np.stack([b[0, 74:82] & 15, b[0, 74:82] >> 4], axis=1).reshape(16).astype(np.float32)
        g = _grid_values("iq2s_grid", idx).reshape(256)
        signs = _sign_factors(b[0, 34:66]).reshape(256)
        db = d * (np.float32(0.5) + ls) * np.float32(0.25)
        return g * signs, np.repeat(db, 16), {"qs": idx & 255, "signs": (signs < 0).astype(np.int32), "qh": qh,
                                              "scales": ls.astype(np.int32)}
    # IQ3_S
    qh = ((b[0, 66:74, None] >> np.arange(8, dtype=np.uint8)) & 1).reshape(64)
    idx = b[0, 2:66].astype(np.int32) | (qh.astype(np.int32) << 8)
    ls = np.stack([b[0, 106:110] & 15, b[0, 106:110] >> 4], axis=1).reshape(8)
    g = _grid_values("iq3s_grid", idx).reshape(256)
    signs = _sign_factors(b[0, 74:106]).reshape(256)
    db = d * (np.uint8(1) + np.uint8(2) * ls.astype(np.uint8))
    return g * signs, np.repeat(db, 32), {"qs": idx & 255, "qh": qh, "signs": (signs < 0).astype(np.int32),
                                          "scales": ls.astype(np.int32)}


def block_scales(b: U8, t: GGMLType) -> dict[str, F32]:
    """The super-block scale d of every block (n, type_size) and the effective sub-block scales."""
    d = iq.iq1_m_scale(b)[:, 0] if t == _T.IQ1_M else iq._f16(b, 0)[:, 0]
    return {"d": d}
