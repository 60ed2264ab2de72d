"""A cached kernel is stale when any compiled source of the engine changed, not only its own file
(engine.kernels.cache_stamp): numba alone would load a kernel whose inlined helper (here engine.kernels.simd's fp16
conversion, inlined into the Q8_0 activation quantizer) was edited since, old code under a new source."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.kernels import cache_stamp
from engine.kernels.dispatch import compiled

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(not compiled(), reason="needs the compiled (numba) kernels")

PROGRAM = r"""
import json
import numpy as np
from engine.kernels.activations import quantize_q8_0, _nb_quantize_q8
quantize_q8_0((np.arange(64, dtype=np.float32) - 20.5)[None, :])
stats = _nb_quantize_q8.stats
print(json.dumps({"hits": sum(stats.cache_hits.values()), "misses": sum(stats.cache_misses.values()),
                  "locator": type(_nb_quantize_q8._cache._impl.locator).__name__}))
"""


def test_the_engines_kernels_are_stamped_with_the_tree():
    from engine.kernels.activations import _nb_quantize_q8

    locator = _nb_quantize_q8._cache._impl.locator
    assert isinstance(locator, cache_stamp._TreeStamp), type(locator)
    assert locator.get_source_stamp()[1] == cache_stamp.tree_stamp()


def test_the_stamp_covers_compiled_sources_only(tmp_path: Path):
    (tmp_path / "k.py").write_text("from numba import njit\n")
    (tmp_path / "plain.py").write_text("x = 1\n")
    before = cache_stamp.stamp_of(tmp_path)
    (tmp_path / "plain.py").write_text("x = 2\n")
    assert cache_stamp.stamp_of(tmp_path) == before
    (tmp_path / "k.py").write_text("from numba import njit  # edited\n")
    assert cache_stamp.stamp_of(tmp_path) != before
    before = cache_stamp.stamp_of(tmp_path)  # a comment or a docstring naming them is not compiled code
    (tmp_path / "notes.py").write_text('"""`import llvmlite` maps ~80 MiB."""\nx = 1  # a broken numba/llvmlite\n')
    assert cache_stamp.stamp_of(tmp_path) == before


def _run(tree: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(NUMBA_CACHE_DIR=str(tree / "cache"), PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_edited_helper_module_recompiles_its_callers(tmp_path: Path):
    shutil.copytree(ROOT / "engine", tmp_path / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    first = _run(tmp_path)
    assert first["locator"].startswith("Engine") and first["misses"] >= 1, first
    again = _run(tmp_path)
    assert again["misses"] == 0 and again["hits"] >= 1, again
    simd = tmp_path / "engine" / "kernels" / "simd.py"  # not the quantizer's own file
    simd.write_text(simd.read_text() + "\n# an edit elsewhere\n")
    edited = _run(tmp_path)
    assert edited["misses"] >= 1 and edited["hits"] == 0, edited
