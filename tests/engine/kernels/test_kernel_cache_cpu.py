"""A kernel cache made for one CPU is never loaded on another: numba keys each cached entry by the target CPU's name
and features, so a cache copied from another host (here: one compiled for a generic x86-64 target, then read by
this machine's target, and the other way) is passed over and compiled again, with the same results, never a crash;
the same target reads its own entries back."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.kernels.dispatch import compiled

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(not compiled() or sys.platform != "linux" or os.uname().machine != "x86_64",
                                reason="needs the compiled (numba) kernels on an x86-64 host")
OTHER = {"NUMBA_CPU_NAME": "generic", "NUMBA_CPU_FEATURES": ""}  # a target no real host is: "another CPU"

PROGRAM = r"""
import json
import numpy as np
from engine.kernels.activations import quantize_q8_0, _nb_quantize_q8
x = (np.arange(256, dtype=np.float32) - 100.5) / 7.0
out = quantize_q8_0(x[None, :])
stats = _nb_quantize_q8.stats
print(json.dumps({"hits": sum(stats.cache_hits.values()), "misses": sum(stats.cache_misses.values()),
                  "bytes": bytes(np.ascontiguousarray(out).view(np.uint8).ravel()).hex()}))
"""


def _run(cache: Path, target: dict[str, str] | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    env.update(NUMBA_CACHE_DIR=str(cache), **(target or {}))
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_cache_from_another_cpu_is_compiled_again(tmp_path: Path) -> None:
    cache = tmp_path / "copied"
    made = _run(cache, OTHER)  # the "other host": a generic x86-64 target fills the cache
    assert made["misses"] >= 1 and made["hits"] == 0
    here = _run(cache, None)  # this machine's own target: the copied entry is passed over, compiled again
    assert here["misses"] >= 1 and here["hits"] == 0 and here["bytes"] == made["bytes"]
    again = _run(cache, None)  # its own entry now: read back
    assert again["hits"] >= 1 and again["misses"] == 0 and again["bytes"] == made["bytes"]
    back = _run(cache, OTHER)  # and the other target still finds its own
    assert back["hits"] >= 1 and back["misses"] == 0
