"""Random-weight test models of every decoder architecture the engine runs, written once per session."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.quality.requantize import quantize_file
from tests.tiny_models import make_tiny_gemma3
from tools.make_arch_models import token_ids, write_arch

# one test model per architecture (tools/make_arch_models.py names): dense, experts, hybrids, post-norms, caps
ARCHS = ("llama3", "qwen2", "qwen3", "phi3", "gemma2", "mixtral", "qwen2moe", "qwen3moe", "gpt_oss", "qwen35",
         "qwen35moe", "qwen35moe_fused", "qwen3next", "qwen3next_legacy", "qwen3vl", "qwen3vlmoe",
         "gemma4", "gemma4_moe")
IDS = token_ids()[:12]


@pytest.fixture(scope="session")
def arch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("attribute")


def arch_file(folder: Path, name: str, preset: str | None = None) -> Path:
    """The test model `name` (an ARCHS entry or 'gemma3'), F32 or requantized to `preset`, written on first use."""
    if preset is not None:
        path = folder / f"{name}.{preset}.gguf"
        if not path.exists():
            quantize_file(arch_file(folder, name), path, preset)
        return path
    path = folder / f"{name}.gguf"
    if not path.exists():
        if name == "gemma3":
            make_tiny_gemma3(path)
        else:
            write_arch(path, name)
    return path
