"""Random-weight test models of every decoder architecture the engine runs, written once per session."""
from __future__ import annotations

from pathlib import Path

import pytest

from tools.make_arch_models import token_ids

# one test model per architecture (tools/make_arch_models.py names): dense, experts, hybrids, post-norms, caps
ARCHS = ("llama3", "qwen2", "qwen3", "phi3", "gemma2", "mixtral", "qwen2moe", "qwen3moe", "gpt_oss", "qwen35",
         "qwen35moe", "qwen35moe_fused", "qwen3next", "qwen3next_legacy", "qwen3vl", "qwen3vlmoe",
         "gemma4", "gemma4_moe")
IDS = token_ids()[:12]


@pytest.fixture(scope="session")
def arch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("attribute")
