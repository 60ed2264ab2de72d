"""engine.backend: choosing NumPy or CuPy, the note when falling back, and sorting CUDA faults."""
from __future__ import annotations

import builtins
import sys

import numpy as np
import pytest

from engine import backend as backend_mod
from engine.backend import NUMPY, Backend, get_backend
from engine.errors import SettingError
from tests.engine.gpu.cuda_emulator import CUDARuntimeError, FakeCupy, OutOfMemoryError


@pytest.fixture
def no_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `import cupy` fail, as on a machine without the gpu extra."""
    real_import = builtins.__import__

    def fake_import(name: str, *args, **kwargs):
        if name == "cupy" or name.startswith("cupy."):
            raise ImportError("No module named 'cupy'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(builtins, "__import__", fake_import)


def test_numpy_is_always_there() -> None:
    b = get_backend("numpy")
    assert b is NUMPY and b.xp is np and b.note == "" and not b.is_device


def test_unknown_backend_name_is_a_setting_error() -> None:
    with pytest.raises(SettingError, match="'tpu' is not one of auto, numpy, cupy"):
        get_backend("tpu")


def test_auto_without_cupy_falls_back_with_one_plain_note(no_cupy: None) -> None:
    b = get_backend("auto")
    assert b.name == "numpy" and b.xp is np
    assert b.note.startswith("CuPy is not installed") and "running on the CPU" in b.note
    assert "\n" not in b.note


def test_cupy_asked_for_without_cupy_is_a_clear_setting_error(no_cupy: None) -> None:
    with pytest.raises(SettingError, match="backend 'cupy' asked for, but CuPy is not installed"):
        get_backend("cupy")


def test_auto_without_a_device_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCupy()

    def no_device() -> int:
        raise CUDARuntimeError(100, "cudaErrorNoDevice: no CUDA-capable device is detected")

    fake.cuda.runtime.getDeviceCount = no_device
    monkeypatch.setitem(sys.modules, "cupy", fake)
    b = get_backend("auto")
    assert b.name == "numpy" and "no usable CUDA device" in b.note
    with pytest.raises(SettingError, match="no usable CUDA device"):
        get_backend("cupy")


def test_cupy_with_a_device_is_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    for name in ("auto", "cupy"):
        b = get_backend(name)
        assert b.name == "cupy" and b.xp is fake and b.is_device and b.note == ""


def test_numpy_backend_helpers() -> None:
    a = np.arange(6, dtype=np.float32)
    assert NUMPY.to_numpy(a) is a
    dst = np.zeros(6, np.float32)
    NUMPY.copy_to_device(dst, a)
    assert np.array_equal(dst, a)
    assert NUMPY.device_memory() is None and NUMPY.device_name() == "CPU"
    NUMPY.free_cached_memory()


def test_classify_error_sorts_memory_and_device_faults() -> None:
    dev = Backend("cupy", FakeCupy())
    assert dev.classify_error(MemoryError()) == "oom"
    assert dev.classify_error(OutOfMemoryError("out of memory allocating 1 GiB")) == "oom"
    assert dev.classify_error(CUDARuntimeError(backend_mod.CUDA_OOM)) == "oom"
    assert dev.classify_error(CUDARuntimeError(999, "unspecified launch failure")) == "device"
    assert dev.classify_error(ValueError("a bug")) is None
    assert NUMPY.classify_error(MemoryError()) == "oom"
    assert NUMPY.classify_error(RuntimeError("x")) is None


def test_device_backend_helpers_on_the_emulated_device() -> None:
    fake = FakeCupy(free_bytes=3 << 30)
    dev = Backend("cupy", fake)
    assert dev.device_memory() == (3 << 30, 141 << 30)
    assert dev.device_name() == "Emulated CUDA device"
    a = dev.asarray(np.ones(3, np.float32))
    dev.copy_to_device(a, np.array([1, 2, 3], np.float32))
    assert dev.to_numpy(a).tolist() == [1, 2, 3]
