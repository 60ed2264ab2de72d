"""llama.cpp as the tests' outside check: llama-cpp-python (a separate venv) and llama-quantize built from the
vendored sources, where the README's "Golden fixtures" section puts them. Tests that need them skip without."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

LLAMA_PYTHON = Path(os.environ.get("GGUF_LENS_LLAMA_PYTHON", "/tmp/llvenv/bin/python"))
# built by the cmake line in tools/make_imatrix_fixtures.py
LLAMA_QUANTIZE = Path(os.environ.get("GGUF_LENS_LLAMA_QUANTIZE", "/tmp/llbuild/bin/llama-quantize"))

_LOAD_AND_EVAL = ("import sys\nfrom llama_cpp import Llama\nm = Llama(model_path=sys.argv[1], n_ctx=64, verbose=False)\n"
                  "t = m.tokenize(sys.argv[2].encode())\nm.eval(t)\nprint(m.n_vocab())\n")


def need_llama_python() -> None:
    if not LLAMA_PYTHON.exists():
        pytest.skip(f"llama-cpp-python not found at {LLAMA_PYTHON} (set GGUF_LENS_LLAMA_PYTHON)")


def need_llama_quantize() -> None:
    if not LLAMA_QUANTIZE.exists():
        pytest.skip(f"llama-quantize not found at {LLAMA_QUANTIZE} (set GGUF_LENS_LLAMA_QUANTIZE)")


def llama_cpp_n_vocab(path: Path, prompt: str) -> int:
    """Loads the GGUF in llama.cpp (a subprocess), evaluates the prompt; returns llama.cpp's vocabulary size."""
    r = subprocess.run([str(LLAMA_PYTHON), "-c", _LOAD_AND_EVAL, str(path), prompt], capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    return int(r.stdout.split()[-1])
