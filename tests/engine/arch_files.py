"""The random-weight test model of an architecture (tools/make_arch_models.py, or Gemma 3 from tests/tiny_models.py),
written into a folder on first use and reused after: the attribution and gradient tests share it."""
from __future__ import annotations

from pathlib import Path

from engine.quality.requantize import quantize_file
from tests.tiny_models import make_tiny_gemma3
from tools.make_arch_models import write_arch
from tools.make_t5_model import write_t5


def arch_file(folder: Path, name: str, preset: str | None = None) -> Path:
    """The test model `name` (a tools/make_arch_models.py name, 'gemma3', or 't5' / 't5_relu'), F32 or requantized to `preset`."""
    if preset is not None:
        path = folder / f"{name}.{preset}.gguf"
        if not path.exists():
            quantize_file(arch_file(folder, name), path, preset)
        return path
    path = folder / f"{name}.gguf"
    if not path.exists():
        if name == "gemma3":
            make_tiny_gemma3(path)
        elif name in ("t5", "t5_relu"):  # encoder-decoder: its own writer (F32)
            write_t5(path, name)
        else:
            write_arch(path, name)
    return path
