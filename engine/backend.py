"""Array backends: NumPy always, CuPy when installed and a CUDA device answers. The only module that imports cupy."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from engine.errors import SettingError

log = logging.getLogger(__name__)

BACKEND_NAMES = ("auto", "numpy", "cupy")
CUDA_OOM = 2  # cudaErrorMemoryAllocation


@dataclass(frozen=True)
class Backend:
    """An array module (`xp`) and how to bring its arrays back to NumPy."""

    name: str
    xp: ModuleType
    note: str = ""  # why this backend was chosen, shown once to the user
    # True when the note describes the ordinary case rather than a failure: 'auto' on a machine without CuPy
    # installed runs on the CPU as asked; a front end shows it quietly (a status bar), not as a warning
    quiet: bool = False

    @property
    def is_device(self) -> bool:
        return self.xp is not np

    def to_numpy(self, a: Any) -> np.ndarray:
        """A NumPy copy (or the array itself) of a backend array."""
        if self.xp is np:
            return np.asarray(a)
        return self.xp.asnumpy(a)

    def asarray(self, a: Any, dtype: Any = None) -> Any:
        """Move a host array onto this backend."""
        return self.xp.asarray(a, dtype=dtype)

    def copy_to_device(self, dst: Any, src: np.ndarray) -> None:
        """Write a host array into an existing backend array of the same shape, without a new allocation."""
        setter = getattr(dst, "set", None)  # cupy.ndarray.set: one host-to-device copy on the current stream
        if setter is not None:
            setter(np.ascontiguousarray(src, dtype=dst.dtype))
        else:
            dst[...] = src

    def address(self, a: Any) -> int:
        """The device (or host) address of an array's first element, for pointer tables read by kernels."""
        ptr = getattr(getattr(a, "data", None), "ptr", None)  # cupy.ndarray.data is a MemoryPointer
        return int(ptr) if ptr is not None else int(a.__array_interface__["data"][0])

    def classify_error(self, exc: BaseException) -> str | None:
        """'oom' for out-of-memory, 'device' for a CUDA failure (driver, lost device, cuBLAS), None otherwise."""
        if isinstance(exc, MemoryError) or _is_cuda_oom(exc):
            return "oom"
        if self.xp is np:
            return None
        return "device" if isinstance(exc, _device_error_types(self.xp)) else None

    def device_memory(self) -> tuple[int, int] | None:
        """(free, total) bytes of the current device; None on NumPy or when the driver does not answer."""
        if self.xp is np:
            return None
        try:
            free, total = self.xp.cuda.runtime.memGetInfo()
        except Exception:  # noqa: BLE001 - a failing driver is reported by the caller's fallback
            return None
        return int(free), int(total)

    def device_name(self) -> str:
        """The GPU's name ('NVIDIA H200'), or 'CPU'."""
        if self.xp is np:
            return "CPU"
        try:
            name = self.xp.cuda.runtime.getDeviceProperties(self.xp.cuda.runtime.getDevice())["name"]
        except Exception:  # noqa: BLE001
            return "CUDA device"
        return name.decode() if isinstance(name, bytes) else str(name)

    def free_cached_memory(self) -> None:
        """Give the memory pool's unused blocks back to the driver (after an out-of-memory error)."""
        if self.xp is np:
            return
        try:
            self.xp.get_default_memory_pool().free_all_blocks()
        except Exception:  # noqa: BLE001
            log.debug("could not free the CuPy memory pool", exc_info=True)


NUMPY = Backend("numpy", np)


def _is_cuda_oom(exc: BaseException) -> bool:
    # cupy.cuda.memory.OutOfMemoryError, or a CUDARuntimeError carrying cudaErrorMemoryAllocation
    return type(exc).__name__ == "OutOfMemoryError" or getattr(exc, "status", None) == CUDA_OOM


def _device_error_types(xp: ModuleType) -> tuple[type[BaseException], ...]:
    found: list[type[BaseException]] = []
    for path in ("cuda.runtime.CUDARuntimeError", "cuda.driver.CUDADriverError", "cuda.cublas.CUBLASError",
                 "cuda.compiler.CompileException", "cuda.memory.OutOfMemoryError"):
        obj: Any = xp
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            found.append(obj)
    return tuple(found)


def _try_cupy() -> tuple[ModuleType | None, str]:
    try:
        import cupy  # noqa: PLC0415 - the only cupy import in the project
    except Exception as exc:  # ImportError, or a broken CUDA install raising anything
        return None, f"CuPy is not installed ({type(exc).__name__}); running on the CPU"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return None, f"no usable CUDA device ({exc}); running on the CPU"
    if n < 1:
        return None, "no CUDA device found; running on the CPU"
    return cupy, ""


def get_backend(name: str = "auto") -> Backend:
    """The backend called `name`; 'auto' takes CuPy when it works, else NumPy with a note saying why."""
    if name not in BACKEND_NAMES:
        raise SettingError(f"backend {name!r} is not one of {', '.join(BACKEND_NAMES)}")
    if name == "numpy":
        return NUMPY
    cupy, why = _try_cupy()
    if cupy is not None:
        return Backend("cupy", cupy)
    if name == "cupy":
        raise SettingError(f"backend 'cupy' asked for, but {why.split(';')[0]}")
    log.info(why)
    # no CuPy at all is the normal CPU install; CuPy present but no device means a GPU was meant to be used
    return Backend("numpy", np, note=why, quiet=why.startswith("CuPy is not installed"))
