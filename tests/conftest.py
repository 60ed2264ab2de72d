"""Shared fixtures: where the real test models live (skipped cleanly when they are absent)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# The fixtures hold llama.cpp's AVX-512 build's bits: the ggml numerics follow that build in every test (and in the
# CLI processes the tests start), whatever CPU runs the suite; the AVX2 tests ask for that build's order themselves.
os.environ["GGUF_LENS_BITS"] = "avx512"
# On a cold kernel cache (a fresh clone) a model's warm-up compiles every kernel before it returns, so that every
# test sees the paths of a warm start (the compiled decode step above all); the background compile of a first start
# has tests of its own (tests/engine/kernels/test_late_kernels.py, test_precompile.py), which ask for it.
os.environ["GGUF_LENS_LATE_KERNELS"] = "now"
# The compiled kernels' thread pool is OpenMP's (libgomp), whose idle threads spin: two test processes (./dev test
# runs two) with two threads each on two cores took turns spinning, and a file of model tests ran 4x slower than
# alone. Passive waiting gives the core back; the numbers are the same either way. Read when libgomp loads, so it
# must be set before the first parallel kernel runs (./dev test sets it before Python starts).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"


def _model_dirs() -> list[Path]:
    """Folders searched for model files: $GGUF_LENS_MODELS_DIR, /work/models, the app's user cache."""
    dirs = []
    if env := os.environ.get("GGUF_LENS_MODELS_DIR"):
        dirs.append(Path(env))
    dirs.append(Path("/work/models"))
    try:
        import platformdirs

        cache = Path(platformdirs.user_cache_dir("gguf-lens"))
        dirs.append(cache / "models")  # as engine.catalog.models_dir()
    except ImportError:
        pass
    return dirs


def model_path(name: str) -> Path | None:
    """The first existing file called `name` in the model folders, or None."""
    for folder in _model_dirs():
        candidate = folder / name
        if candidate.is_file():
            return candidate
    return None


def _require(name: str) -> Path:
    path = model_path(name)
    if path is None:
        pytest.skip(f"model {name} not found (set GGUF_LENS_MODELS_DIR)")
    return path


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (llama architecture, BPE vocab)."""
    return _require(SMOLLM2_FILE)


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """gemma-3-270m Q4_K_M (gemma3 architecture, 262k-token SPM vocab)."""
    return _require(GEMMA3_FILE)


@pytest.fixture(scope="session")
def t5_q8_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random-weight T5 test model (tools/make_t5_model.py, real UGM vocabulary) in Q8_0, written once."""
    from tools.make_t5_model import t5_file  # noqa: PLC0415

    return t5_file(tmp_path_factory.mktemp("t5"))


@pytest.fixture(scope="module", params=["ggml", "float32"])
def t5_model(t5_q8_path: Path, request: pytest.FixtureRequest):  # noqa: ANN201
    """That model loaded in each numerics (no warm-up), closed after the module."""
    from engine.model import load_model  # noqa: PLC0415

    m = load_model(t5_q8_path, numerics=request.param, warm=False)
    yield m
    m.close()
