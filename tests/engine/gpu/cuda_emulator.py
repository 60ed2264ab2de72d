"""A CPU stand-in for CuPy that runs the project's CUDA kernels, so the GPU path is tested without a GPU.

The kernel sources (engine/gpu/cuda, as engine/gpu/kernels.py assembles them) are compiled with g++
against a small runtime: every CUDA thread of a block is a ucontext fiber on one OS thread, __syncthreads
and __shfl_xor_sync are barriers between them (a deadlock aborts with a message), __shared__ memory is
static, and blocks run one after another. Arrays are NumPy arrays; kernels get their pointers. Stream
capture records kernel launches with their arguments and a graph replays them, as CUDA graphs do, so a
decode step that does anything but launch kernels while captured gives wrong results here too.

This checks the kernels' logic (indexing, reductions, barriers, layouts) and the runner's use of them.
It does not model timing, memory coalescing, or concurrent blocks; the `gpu` tests do that on a device.
"""
from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
import types
from pathlib import Path
from typing import Any

import numpy as np

from engine.gpu.kernels import CUDA_DIR

PRELUDE = r"""
#include <setjmp.h>
#include <ucontext.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

struct emu_dim3 { unsigned x, y, z; };
static emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline unsigned min(int a, unsigned b) { return min((unsigned)a, b); }
static inline unsigned min(unsigned a, int b) { return min(a, (unsigned)b); }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }

struct EmuFiber { ucontext_t ctx; jmp_buf jb; int done, started; };
static std::vector<EmuFiber> emu_fibers;
static std::vector<char*> emu_stacks;
static const size_t EMU_STACK = 256 << 10;
static jmp_buf emu_sched;
static ucontext_t emu_start_from;
static int emu_cur, emu_live, emu_arrivals;
static unsigned emu_bar_count, emu_bar_gen;
static int emu_warp_live[32];
static unsigned emu_wcount[32], emu_wgen[32];
static float emu_wf[32][32];
static int emu_wi[32][32];
static std::function<void()> emu_body;
alignas(16) static char emu_smem[256 << 10];

// switching with _setjmp/_longjmp (no signal-mask system calls); ucontext only starts a fiber on its stack
static void emu_yield() {
    if (!_setjmp(emu_fibers[emu_cur].jb)) _longjmp(emu_sched, 1);
}

static void emu_release_if_ready() {
    if (emu_bar_count > 0 && emu_bar_count == (unsigned)emu_live) { emu_bar_count = 0; emu_bar_gen++; }
    for (int w = 0; w < 32; w++)
        if (emu_wcount[w] > 0 && emu_wcount[w] == (unsigned)emu_warp_live[w]) { emu_wcount[w] = 0; emu_wgen[w]++; }
}

void __syncthreads() {
    unsigned gen = emu_bar_gen;
    emu_arrivals++;
    emu_bar_count++;
    emu_release_if_ready();
    while (emu_bar_gen == gen) emu_yield();
}

static void emu_warp_sync() {
    int w = threadIdx.x >> 5;
    unsigned gen = emu_wgen[w];
    emu_arrivals++;
    emu_wcount[w]++;
    emu_release_if_ready();
    while (emu_wgen[w] == gen) emu_yield();
}

float __shfl_xor_sync(unsigned, float v, int o) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu_wf[w][l] = v;
    emu_warp_sync();
    float r = emu_wf[w][l ^ o];
    emu_warp_sync();
    return r;
}

int __shfl_xor_sync(unsigned, int v, int o) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu_wi[w][l] = v;
    emu_warp_sync();
    int r = emu_wi[w][l ^ o];
    emu_warp_sync();
    return r;
}

static void emu_trampoline() {
    emu_body();
    emu_fibers[emu_cur].done = 1;
    emu_live--;
    emu_warp_live[threadIdx.x >> 5]--;
    emu_arrivals++;
    emu_release_if_ready();
    _longjmp(emu_sched, 1);
}

static void emu_run(unsigned gx, unsigned gy, unsigned bx, std::function<void()> body) {
    if (bx == 0 || bx > 1024 || bx % 32) { fprintf(stderr, "emulator: block of %u threads\n", bx); abort(); }
    gridDim = {gx, gy, 1};
    blockDim = {bx, 1, 1};
    emu_body = body;
    emu_fibers.resize(bx);
    while (emu_stacks.size() < bx) emu_stacks.push_back((char*)malloc(EMU_STACK));
    for (unsigned by = 0; by < gy; by++) {
        for (unsigned bxi = 0; bxi < gx; bxi++) {
            blockIdx = {bxi, by, 0};
            emu_live = (int)bx;
            emu_bar_count = 0;
            for (int w = 0; w < 32; w++) { emu_warp_live[w] = w * 32 < (int)bx ? 32 : 0; emu_wcount[w] = 0; }
            for (unsigned i = 0; i < bx; i++) {
                EmuFiber& f = emu_fibers[i];
                f.done = 0;
                f.started = 0;
                getcontext(&f.ctx);
                f.ctx.uc_stack.ss_sp = emu_stacks[i];
                f.ctx.uc_stack.ss_size = EMU_STACK;
                f.ctx.uc_link = 0;
                makecontext(&f.ctx, emu_trampoline, 0);
            }
            while (emu_live > 0) {
                int before = emu_arrivals;
                for (unsigned i = 0; i < bx; i++) {
                    if (emu_fibers[i].done) continue;
                    emu_cur = (int)i;
                    threadIdx = {i, 0, 0};
                    if (!_setjmp(emu_sched)) {
                        if (emu_fibers[i].started) _longjmp(emu_fibers[i].jb, 1);
                        emu_fibers[i].started = 1;
                        swapcontext(&emu_start_from, &emu_fibers[i].ctx);
                    }
                }
                if (emu_arrivals == before && emu_live > 0) {
                    fprintf(stderr, "emulator: deadlock in block (%u, %u): %d threads wait at a barrier\n", bxi, by, emu_live);
                    abort();
                }
            }
        }
    }
}
"""

_KERNEL = re.compile(r'extern "C" __global__ void (\w+)\s*\(([^)]*)\)', re.S)


def _wrappers(source: str) -> str:
    """An extern "C" launcher per kernel: emu_launch_NAME(gx, gy, bx, kernel params...)."""
    out = []
    for name, params in _KERNEL.findall(source):
        parts = [p.strip() for p in params.split(",") if p.strip()]
        names = [re.findall(r"\w+", p)[-1] for p in parts]
        out.append(
            f'extern "C" void emu_launch_{name}(unsigned gx, unsigned gy, unsigned bx, {", ".join(parts)}) {{\n'
            f"    emu_run(gx, gy, bx, [=]() {{ {name}({', '.join(names)}); }});\n}}\n"
        )
    return "\n".join(out)


def available() -> bool:
    """True when g++ is there to build the emulated kernels."""
    return shutil.which("g++") is not None


_BUILD_DIR = Path(tempfile.gettempdir()) / "gguf-lens-cuda-emulator"


def build(source: str) -> ctypes.CDLL:
    """Compile a kernel module (as engine/gpu/kernels.module_source gives it) for the emulator; cached by content."""
    text = re.sub(r"extern __shared__ (?:__align__\(\d+\) )?float (\w+)\[\];", r"float* \1 = (float*)emu_smem;", source)
    text = PRELUDE + text + "\n" + _wrappers(source)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    _BUILD_DIR.mkdir(parents=True, exist_ok=True)
    so = _BUILD_DIR / f"mod-{digest}.so"
    if not so.exists():
        src = _BUILD_DIR / f"mod-{digest}.cpp"
        src.write_text(text)
        tmp = so.with_suffix(".tmp.so")
        r = subprocess.run(["g++", "-x", "c++", "-std=c++17", "-O2", "-ffp-contract=off", "-fPIC", "-shared",
                            "-w", f"-I{CUDA_DIR}", str(src), "-o", str(tmp)], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"emulator build failed:\n{r.stderr[-4000:]}")
        tmp.replace(so)
    return ctypes.CDLL(str(so))


# ---- the fake cupy module


class CUDARuntimeError(RuntimeError):
    """As cupy.cuda.runtime.CUDARuntimeError."""

    def __init__(self, status: int, msg: str = "emulated CUDA failure"):
        super().__init__(msg)
        self.status = status


class OutOfMemoryError(MemoryError):
    """As cupy.cuda.memory.OutOfMemoryError."""


def _c_arg(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        return ctypes.c_void_p(a.__array_interface__["data"][0])
    if isinstance(a, np.int32):
        return ctypes.c_int32(int(a))
    if isinstance(a, np.float32):
        return ctypes.c_float(float(a))
    if isinstance(a, np.float64):
        return ctypes.c_double(float(a))
    if isinstance(a, np.uint64):
        return ctypes.c_uint64(int(a))
    raise TypeError(f"kernel argument of type {type(a).__name__}: pass numpy scalars or arrays")


class EmuKernel:
    """A RawKernel stand-in: kernel(grid, block, args, shared_mem=0)."""

    def __init__(self, xp: FakeCupy, lib: ctypes.CDLL, name: str):
        self.xp = xp
        self.name = name
        self.fn = getattr(lib, f"emu_launch_{name}")
        self.fn.restype = None
        self.max_dynamic_shared_size_bytes = 48 << 10

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        capture = self.xp.cuda.capturing
        if capture is not None:
            capture.append((self, grid, block, tuple(args), shared_mem))
            return
        self.xp.launches += 1
        if self.xp.fail_after is not None:
            self.xp.fail_after -= 1
            if self.xp.fail_after < 0:
                self.xp.fail_after = None
                raise self.xp.fail_with
        if shared_mem > max(48 << 10, self.max_dynamic_shared_size_bytes) or shared_mem > (256 << 10):
            raise RuntimeError(f"{self.name}: {shared_mem} bytes of dynamic shared memory without opting in")
        g = tuple(grid) + (1, 1)
        self.fn(ctypes.c_uint(g[0]), ctypes.c_uint(g[1]), ctypes.c_uint(block[0]), *(_c_arg(a) for a in args))


class EmuModule:
    """A RawModule stand-in."""

    def __init__(self, xp: FakeCupy, code: str, options: tuple = ()):
        self.xp = xp
        self.lib = build(code)

    def get_function(self, name: str) -> EmuKernel:
        return EmuKernel(self.xp, self.lib, name)


class EmuGraph:
    """The kernel launches recorded while a stream captured, replayed on launch()."""

    def __init__(self, launches: list):
        self.launches = launches

    def launch(self, stream: Any = None) -> None:
        for kernel, grid, block, args, smem in self.launches:
            kernel(grid, block, args, shared_mem=smem)


class _Stream:
    def __init__(self, cuda: Any, non_blocking: bool = False):
        self.cuda = cuda

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def begin_capture(self, mode: Any = None) -> None:
        if self.cuda.capturing is not None:
            raise RuntimeError("already capturing")
        self.cuda.capturing = []

    def end_capture(self) -> EmuGraph:
        launches, self.cuda.capturing = self.cuda.capturing, None
        self.cuda.graphs += 1
        return EmuGraph(launches)

    def synchronize(self) -> None:
        return None


class FakeCupy(types.ModuleType):
    """Enough of cupy for engine/gpu: NumPy arrays, emulated RawModule, streams with capture, memory info."""

    def __init__(self, free_bytes: int = 8 << 30):
        super().__init__("cupy_emulated")
        self.launches = 0
        self.fail_after: int | None = None  # raise fail_with at the (n+1)-th launch from now
        self.fail_with: BaseException = CUDARuntimeError(999)
        xp = self
        cuda = types.SimpleNamespace(capturing=None, graphs=0)
        cuda.Stream = lambda non_blocking=False: _Stream(cuda, non_blocking)
        cuda.runtime = types.SimpleNamespace(
            memGetInfo=lambda: (xp.free_bytes, 141 << 30),
            getDevice=lambda: 0,
            getDeviceCount=lambda: 1,
            getDeviceProperties=lambda i: {"name": b"Emulated CUDA device"},
            CUDARuntimeError=CUDARuntimeError,
        )
        cuda.memory = types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError)
        self.cuda = cuda
        self.free_bytes = free_bytes
        self._modules: dict[str, EmuModule] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    def RawModule(self, code: str, options: tuple = (), **kw: Any) -> EmuModule:  # noqa: N802 - cupy's name
        mod = self._modules.get(code)
        if mod is None:
            mod = self._modules[code] = EmuModule(self, code, options)
        return mod

    def asarray(self, a: Any, dtype: Any = None) -> np.ndarray:
        return np.array(a, dtype=dtype, copy=True)

    def asnumpy(self, a: Any) -> np.ndarray:
        return np.array(a, copy=True)

    def get_default_memory_pool(self) -> Any:
        return types.SimpleNamespace(free_all_blocks=lambda: None)
