"""The CUDA sources in engine/gpu/cuda and their compiled modules (CuPy RawModule, NVRTC).

Each kernel file includes ggml_blocks.cu; the include is expanded here, so the text CuPy hashes for its
kernel cache is the whole program and an edit to ggml_blocks.cu recompiles every module.
"""
from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Any

from engine.backend import Backend

CUDA_DIR = Path(__file__).resolve().parent / "cuda"
MODULES = ("dequant", "gemv", "ops", "attention")  # kernel files; ggml_blocks.cu is included by each
KERNELS = {
    "dequant": ("dequant_rows", "embed_rows"),
    "gemv": ("gemv",),
    "ops": ("rms_norm_rows", "gated_act", "rope_store", "argmax"),
    "attention": ("attention", "attention_combine"),
}
OPTIONS = ("-std=c++14",)

_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_.]+)"\s*$', re.M)


def cuda_files() -> list[Path]:
    """Every .cu file shipped with the engine."""
    return sorted(CUDA_DIR.glob("*.cu"))


def module_source(name: str) -> str:
    """The text of one kernel module with its local includes expanded (each file once)."""
    seen: set[str] = set()

    def expand(fname: str) -> str:
        if fname in seen:
            return ""
        seen.add(fname)
        text = (CUDA_DIR / fname).read_text(encoding="utf-8")
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text)

    return expand(f"{name}.cu")


class Kernels:
    """The compiled kernels, by name, for one CuPy backend (compiled on first use and cached by CuPy)."""

    def __init__(self, backend: Backend):
        self.xp = backend.xp
        self._functions: dict[str, Any] = {}

    @cached_property
    def modules(self) -> dict[str, Any]:
        return {name: self.xp.RawModule(code=module_source(name), options=OPTIONS) for name in MODULES}

    def compile_all(self) -> None:
        """Compile every module now (at load) instead of at the first token."""
        for name in KERNELS:
            for fn in KERNELS[name]:
                self[fn]

    def __getitem__(self, fn: str) -> Any:
        k = self._functions.get(fn)
        if k is None:
            module = next(m for m, fns in KERNELS.items() if fn in fns)
            k = self._functions[fn] = self.modules[module].get_function(fn)
        return k
