"""The CUDA sources build everywhere CI runs, GPU or not: nvcc for sm_90, NVRTC as CuPy compiles them, and
ggml_blocks.cu as host C++, where its block decoders are checked bit for bit against engine/quant."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.gpu.kernels import CUDA_DIR, KERNELS, MODULES, OPTIONS, cuda_files, module_source
from engine.gpu.linear import DEVICE_TYPES
from engine.quant import dequantize_rows, quantize
from engine.quant.types import TYPES

ARCH = "sm_90"  # Hopper (H100, H200)


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"):
        if os.access(p, os.X_OK):
            return p
    return None


def test_every_kernel_file_is_shipped_and_listed() -> None:
    names = {p.stem for p in cuda_files()}
    assert set(MODULES) <= names and "ggml_blocks" in names
    for module, kernels in KERNELS.items():
        src = module_source(module)
        defined = set(re.findall(r'extern "C" __global__ void (\w+)', src))
        assert set(kernels) == defined, module
        assert not re.search(r"^#include", src, re.M)  # the includes are expanded, so CuPy's cache key covers every file


@pytest.mark.parametrize("path", cuda_files(), ids=lambda p: p.name)
def test_nvcc_compiles_for_hopper(path: Path, tmp_path: Path) -> None:
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    out = tmp_path / (path.stem + ".cubin")
    r = subprocess.run([nvcc, f"-arch={ARCH}", "-cubin", "-I", str(CUDA_DIR), "-o", str(out), str(path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr.lower(), r.stderr
    assert out.stat().st_size > 0


def _libnvrtc() -> ctypes.CDLL | None:
    """libnvrtc from $GGUF_LENS_NVRTC, the system, or an nvidia-cuda-nvrtc wheel; None when absent."""
    candidates = [os.environ.get("GGUF_LENS_NVRTC", "")]
    for name in ("nvrtc",):
        found = ctypes.util.find_library(name)
        if found:
            candidates.append(found)
    for base in map(Path, sys.path):
        candidates += [str(p) for p in base.glob("nvidia/*/lib/libnvrtc.so*") if "builtins" not in p.name and "alt" not in p.name]
    candidates += ["/usr/local/cuda/lib64/libnvrtc.so"]
    for c in candidates:
        if not c:
            continue
        for builtins in Path(c).parent.glob("libnvrtc-builtins.so*"):  # NVRTC dlopens it by name
            if "alt" not in builtins.name:
                try:
                    ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    pass
        try:
            return ctypes.CDLL(c)
        except OSError:
            continue
    return None


@pytest.mark.parametrize("module", MODULES)
def test_nvrtc_compiles_the_modules_cupy_gets(module: str) -> None:
    lib = _libnvrtc()
    if lib is None:
        pytest.skip("libnvrtc is not available (set GGUF_LENS_NVRTC to its path)")
    prog = ctypes.c_void_p()
    src = module_source(module).encode()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, f"{module}.cu".encode(), 0, None, None) == 0
    opts = [f"-arch={ARCH}".encode(), *(o.encode() for o in OPTIONS)]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    assert rc == 0, log.value.decode(errors="replace")


# ---- ggml_blocks.cu as host C++: the block layouts, bit for bit

_SHIM = r"""
#include "ggml_blocks.cu"
extern "C" int gl_dequant_rows(int type, const unsigned char* rows, int n_rows, int row_bytes, int n_cols, float* out) {
    for (int r = 0; r < n_rows; r++)
        for (int j = 0; j < n_cols; j += 4)
            if (!gl_dq4(type, rows + (long)r * row_bytes, j, out + (long)r * n_cols + j)) return 0;
    return 1;
}
extern "C" void gl_to_half(const float* x, unsigned short* out, long n) {
    for (long i = 0; i < n; i++) out[i] = gl_float_to_half(x[i]);
}
"""


@pytest.fixture(scope="module")
def host_blocks(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed")
    d = tmp_path_factory.mktemp("blocks")
    (d / "shim.cpp").write_text(_SHIM)
    so = d / "blocks.so"
    r = subprocess.run([gxx, "-x", "c++", "-O2", "-ffp-contract=off", "-Wall", "-Werror", "-shared", "-fPIC",
                        "-I", str(CUDA_DIR), str(d / "shim.cpp"), "-o", str(so)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return ctypes.CDLL(str(so))


def _host_dequant(lib: ctypes.CDLL, rows: np.ndarray, qtype: int, n_cols: int) -> np.ndarray:
    out = np.empty((rows.shape[0], n_cols), np.float32)
    ok = lib.gl_dequant_rows(int(qtype), rows.ctypes.data_as(ctypes.c_void_p), rows.shape[0], rows.shape[1], n_cols,
                             out.ctypes.data_as(ctypes.c_void_p))
    assert ok == 1
    return out


@pytest.mark.parametrize("qtype", sorted(DEVICE_TYPES), ids=lambda t: t.name)
def test_block_decoders_match_numpy_bit_for_bit(host_blocks: ctypes.CDLL, qtype) -> None:
    info = TYPES[qtype]
    n_cols = 768
    rng = np.random.default_rng(int(qtype))
    random_bytes = rng.integers(0, 256, size=(12, info.row_bytes(n_cols)), dtype=np.uint8)  # NaN/inf scales too
    weights = quantize(rng.standard_normal((12, n_cols)).astype(np.float32), qtype)
    for rows in (random_bytes, weights):
        got = _host_dequant(host_blocks, rows, qtype, n_cols)
        want = dequantize_rows(rows, qtype)
        finite = np.isfinite(want)
        assert np.array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])


def test_unknown_type_is_refused(host_blocks: ctypes.CDLL) -> None:
    rows = np.zeros((1, 64), np.uint8)
    out = np.empty((1, 16), np.float32)
    assert host_blocks.gl_dequant_rows(39, rows.ctypes.data_as(ctypes.c_void_p), 1, 64, 16, out.ctypes.data_as(ctypes.c_void_p)) == 0


def test_float_to_half_rounds_as_numpy(host_blocks: ctypes.CDLL) -> None:
    rng = np.random.default_rng(7)
    x = np.concatenate([
        rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        (rng.standard_normal(100_000) * 1e-5).astype(np.float32),
        np.array([65504, 65519.99, 65520, 6e-8, 2.98e-8, 2.99e-8, 6.1e-5, -0.0, 1.0, np.inf, -np.inf], np.float32),
    ])
    out = np.empty(x.size, np.uint16)
    host_blocks.gl_to_half(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_long(x.size))
    with np.errstate(all="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(x)
    assert np.array_equal(out[~nan], want[~nan].view(np.uint16))
    assert np.isnan(out[nan].view(np.float16)).all()
