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


@dataclass(frozen=True)
class Backend:
    """An array module (`xp`) and how to bring its arrays back to NumPy."""

    name: str
    xp: ModuleType
    note: str = ""  # why this backend was chosen, shown once to the user

    def to_numpy(self, a: Any) -> np.ndarray:
        """A NumPy copy (or the array itself) of a backend array."""
        if self.xp is np:
            return np.asarray(a)
        return self.xp.asnumpy(a)

    def asarray(self, a: Any, dtype: Any = None) -> Any:
        """Move a host array onto this backend."""
        return self.xp.asarray(a, dtype=dtype)


NUMPY = Backend("numpy", np)


def _try_cupy() -> tuple[ModuleType | None, str]:
    try:
        import cupy  # noqa: PLC0415 - the only cupy import in the project
    except Exception as exc:  # ImportError, or a broken CUDA install raising anything
        return None, f"CuPy is not installed ({type(exc).__name__}); running on the CPU with NumPy"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return None, f"no usable CUDA device ({exc}); running on the CPU with NumPy"
    if n < 1:
        return None, "no CUDA device found; running on the CPU with NumPy"
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
    return Backend("numpy", np, note=why)
