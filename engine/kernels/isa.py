"""Which instruction set the kernels are compiled for, and whose bits the ggml numerics give there.

llama.cpp's x86 builds sum some operations in the width of their vector registers, so its AVX2 build and its
AVX-512 build give different bits for the same model (measured: max logit difference about 1, mean KLD 0.003 on
the golden prose, benchmarks/vs_llamacpp.py --isa avx2 --exact). The parts that differ: ggml_v_expf (the AVX2
variant ends with fma(j, 2^n, 2^n), the AVX-512 one with scalef(j + 1, n)), the softmax and SwiGLU chunks (8 or
16 floats, each chunk's horizontal sum), and the attention's float products (tinyBLAS with 8 or 16 lanes,
ggml_vec_dot_f16 / _f32 with 4 x 8 or 4 x 16 accumulators and their reductions). The quantized block products are
the same in both builds.

The kernels write those orders out, so either build's bits can be made on any CPU: `bits()` names the build the
ggml numerics follow. By default that is the build for the CPU the kernels are compiled for (an AVX2-only target:
llama.cpp's AVX2 build; AVX-512, ARM and anything else: its AVX-512 build, the order this project's fixtures were
first made with); GGUF_LENS_BITS=avx2|avx512 or `forced_bits` choose one. `describe` says which wherever numbers
are reported (gguf-lens bench --json, the app's status line).
"""
from __future__ import annotations

import contextlib
import functools
import os
import platform
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

BUILDS = {"avx512": "llama.cpp's x86 AVX-512 build", "avx2": "llama.cpp's x86 AVX2 build"}
BITS_OF = BUILDS["avx512"]  # the default where the target is not AVX2
ENV = "GGUF_LENS_BITS"
_FORCED: list[str] = []


@dataclass(frozen=True)
class IsaInfo:
    target: str  # 'avx512', 'avx2', 'aarch64', 'generic': what numba compiles the kernels for
    bits_of: str  # whose bits the ggml numerics give
    note: str  # one line for a tooltip / a report

    @property
    def matches_host_build(self) -> bool:
        """Whether the bits are those of llama.cpp's build for this target (its AVX-512 or AVX2 build)."""
        return self.target in BUILDS and self.bits_of == BUILDS[self.target]


def _target_features() -> frozenset[str]:
    """numba's target features: NUMBA_CPU_FEATURES when NUMBA_CPU_NAME overrides the host, else the host's."""
    if os.environ.get("NUMBA_CPU_NAME"):
        return _listed_features(os.environ.get("NUMBA_CPU_FEATURES", ""))
    return _host_features()


@functools.cache
def _listed_features(listed: str) -> frozenset[str]:
    """The features a NUMBA_CPU_FEATURES string turns on (parsed once: the decode step asks on every token)."""
    return frozenset(f[1:] for f in listed.split(",") if f.startswith("+"))


@functools.cache
def _host_features() -> frozenset[str]:
    from engine.kernels.simd import host_has  # noqa: PLC0415

    return frozenset(f for f in ("avx512f", "avx512bw", "avx512vl", "avx2", "fma") if host_has(f))


def target_has(name: str) -> bool:
    """Whether the CPU the kernels are compiled for has feature `name` ('avx512bf16', ...): NUMBA_CPU_FEATURES's
    list where NUMBA_CPU_NAME overrides the host (an AVX2 target on an AVX-512 host has no AVX512_BF16), else
    the host's."""
    if os.environ.get("NUMBA_CPU_NAME"):
        return name in _listed_features(os.environ.get("NUMBA_CPU_FEATURES", ""))
    from engine.kernels.simd import host_has  # noqa: PLC0415

    return host_has(name)


def target() -> str:
    """'avx512', 'avx2', 'aarch64' or 'generic': the CPU the kernels are compiled for."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "aarch64"
    feats = _target_features()
    return "avx512" if {"avx512f", "avx512bw", "avx512vl"} <= feats else "avx2" if "avx2" in feats else "generic"


def bits() -> str:
    """'avx2' or 'avx512': whose order the ggml numerics follow (see the module's docstring)."""
    if _FORCED:
        return _FORCED[-1]
    chosen = os.environ.get(ENV, "").strip().lower()
    if chosen in BUILDS:
        return chosen
    return "avx2" if target() == "avx2" else "avx512"


def lanes() -> int:
    """The vector width, in floats, of the build `bits` names: 8 (AVX2) or 16 (AVX-512)."""
    return 8 if bits() == "avx2" else 16


def w8() -> np.bool_:
    """True where the kernels sum in 8 lanes (an argument of the compiled kernels; a NumPy bool, so that numba
    compiles one specialisation for both values)."""
    return np.bool_(bits() == "avx2")


@contextlib.contextmanager
def forced_bits(name: str) -> Iterator[None]:
    """Within the block, the ggml numerics follow `name`'s build ('avx2' or 'avx512'), whatever the CPU."""
    if name not in BUILDS:
        raise ValueError(f"unknown build {name!r}: one of {', '.join(BUILDS)}")
    _FORCED.append(name)
    try:
        yield
    finally:
        _FORCED.pop()


def describe() -> IsaInfo:
    tgt, chosen = target(), bits()
    bits_of = BUILDS[chosen]
    if tgt in BUILDS and chosen == tgt:
        note = f"the bits of {bits_of}, the build for this CPU"
    elif tgt in BUILDS:
        note = (f"the bits of {bits_of} ({ENV}={chosen}); llama.cpp's build for this {tgt} CPU sums attention, softmax "
                "and SwiGLU in other lanes and differs slightly (mean KLD about 0.003)")
    else:
        note = (f"the bits of {bits_of}; llama.cpp built for this {tgt} CPU sums attention and softmax in its own "
                "lanes and differs slightly")
    return IsaInfo(tgt, bits_of, note)
