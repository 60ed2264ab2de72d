"""Importance-weighted quantization (quant_weights) byte for byte against ggml_quantize_chunk's own bytes.

Fixture: tests/fixtures/imatrix/kernels.npz from tools/make_imatrix_kernel_fixtures.py (random rows with zero
blocks, tiny rows and an outlier, and real SmolLM2 rows, with imatrix-like weights).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.errors import SettingError
from engine.quant import dequantize, quantize
from engine.quant.types import GGMLType

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "imatrix" / "kernels.npz"
GOLDEN = dict(np.load(FIXTURE))
CASES = sorted({k.split(".")[0] if not k.startswith("blk") else ".".join(k.split(".")[:2]) for k in GOLDEN})
KEYS = sorted(k for k in GOLDEN if not k.endswith((".x", ".qw")))


@pytest.mark.parametrize("key", KEYS)
def test_bytes_equal_ggml(key: str) -> None:
    case, _, rest = key.rpartition(".") if not key.endswith(".plain") else (key[: -len(".plain")], "", "plain")
    if rest == "plain":
        case, _, tname = case.rpartition(".")
        qw = None
    else:
        tname = rest
        qw = GOLDEN[f"{case}.qw"]
    got = quantize(GOLDEN[f"{case}.x"], GGMLType[tname], qw)
    want = GOLDEN[key]
    bad = np.flatnonzero((got != want).any(axis=1))
    assert bad.size == 0, f"{key}: rows {bad[:8]} differ"


def test_weights_change_the_bytes_and_lower_the_weighted_error() -> None:
    x, qw = GOLDEN["random.x"], GOLDEN["random.qw"]
    for qtype in (GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q3_K, GGMLType.IQ4_XS):
        plain, weighted = quantize(x, qtype), quantize(x, qtype, qw)
        assert (plain != weighted).any()
        err = [float(np.sum(qw * (dequantize(b, qtype).reshape(x.shape) - x) ** 2)) for b in (plain, weighted)]
        assert err[1] < err[0], qtype.name


def test_bad_weights_are_refused() -> None:
    x = GOLDEN["random.x"]
    with pytest.raises(SettingError, match="512"):
        quantize(x, GGMLType.Q4_K, np.ones(256, np.float32))
    with pytest.raises(SettingError, match="non-finite"):
        quantize(x, GGMLType.Q4_0, np.full(512, np.nan, np.float32))
