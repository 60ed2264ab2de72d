"""benchmarks/decode_overhead.py counts the copies engine.kernels.variants.specialise makes as compiled kernels, not
as Python: a copy shares its plain function's code object, so cProfile names its calls after that function, and
the benchmark's set of compiled names must hold that name (issue 44: the legacy one-row products were counted as
Python on the AMD host)."""
from __future__ import annotations

import cProfile
import pstats
import sys
from pathlib import Path

import numpy as np

from engine.kernels import variants

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import decode_overhead  # noqa: E402


def _scaled_sum(x):  # noqa: ANN001, ANN202 - the plain function a copy is made of
    total = 0.0
    for v in x:
        total += v * SCALE
    return total


SCALE = 1.0


def test_a_specialised_copy_is_profiled_as_a_kernel() -> None:
    copy = variants.specialise(_scaled_sum, "twice", {"SCALE": 2.0})
    x = np.arange(4.0)
    assert copy(x) == 12.0  # the copy's SCALE is its own constant
    prof = cProfile.Profile()
    prof.enable()
    copy(x)
    prof.disable()
    code = _scaled_sum.__code__
    key = (code.co_filename, code.co_firstlineno, code.co_name)
    assert key in pstats.Stats(prof).stats  # the profile names the copy's call after the plain function
    assert key in decode_overhead._compiled_names()

