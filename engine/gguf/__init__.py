"""GGUF container: a validated, memory-mapped reader and an atomic writer."""
from __future__ import annotations

from engine.gguf.constants import GGUFValueType
from engine.gguf.reader import GGUFFile, TensorInfo, open_gguf
from engine.gguf.writer import write_gguf

__all__ = ["GGUFFile", "GGUFValueType", "TensorInfo", "open_gguf", "write_gguf"]
