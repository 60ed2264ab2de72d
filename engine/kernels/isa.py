"""Which instruction set the kernels are compiled for, and whose bits the ggml numerics give there.

The kernels follow the order in which llama.cpp's x86 build *with AVX-512* sums (its 16-lane attention products
and softmax, its vectorised expf; the block products' order is the same in its AVX2 and AVX-512 builds). They
give those bits on every CPU: the order is written out in the kernels, not left to the instructions. A llama.cpp
built for an AVX2-only CPU sums attention, softmax and SwiGLU in 8 lanes and so differs from its own AVX-512
build (measured: max logit difference about 1, mean KLD 0.003 on the golden prose, benchmarks/vs_llamacpp.py
--isa avx2 --exact). `describe` says so wherever the numbers are reported (gguf-lens bench --json, the app's status
line), so nobody takes them for the AVX2 build's.
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass

BITS_OF = "llama.cpp's x86 AVX-512 build"


@dataclass(frozen=True)
class IsaInfo:
    target: str  # 'avx512', 'avx2', 'aarch64', 'generic': what numba compiles the kernels for
    bits_of: str  # whose bits the ggml numerics give
    note: str  # one line for a tooltip / a report

    @property
    def matches_host_build(self) -> bool:
        """Whether a llama.cpp built for this target gives these bits (its AVX-512 build does)."""
        return self.target == "avx512"


def _target_features() -> set[str]:
    """numba's target features: NUMBA_CPU_FEATURES when NUMBA_CPU_NAME overrides the host, else the host's."""
    if os.environ.get("NUMBA_CPU_NAME"):
        return {f[1:] for f in os.environ.get("NUMBA_CPU_FEATURES", "").split(",") if f.startswith("+")}
    from engine.kernels.simd import host_has  # noqa: PLC0415

    return {f for f in ("avx512f", "avx512bw", "avx512vl", "avx2", "fma") if host_has(f)}


def describe() -> IsaInfo:
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        target = "aarch64"
    else:
        feats = _target_features()
        target = ("avx512" if {"avx512f", "avx512bw", "avx512vl"} <= feats else "avx2" if "avx2" in feats
                  else "generic")
    if target == "avx512":
        note = f"the bits of {BITS_OF}, the build for this CPU"
    else:
        note = (f"the bits of {BITS_OF}; llama.cpp built for this {target} CPU sums attention and softmax in "
                "narrower lanes and differs slightly (mean KLD about 0.003)")
    return IsaInfo(target, BITS_OF, note)
