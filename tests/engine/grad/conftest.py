"""Random-weight test models of the architectures the backward covers and of those it refuses, written once."""
from __future__ import annotations

from pathlib import Path

import pytest


# every switch of the block graph: biases, q/k norms, fused qkv and gate+up, post-norms, soft-caps, sliding windows,
# query scaling, NEOX / IMROPE-as-NEOX RoPE; experts with softmax and softmax-weight gating, a shared expert and its
# gate, expert biases, attention sinks, the clamped SwiGLU
COVERED = ("llama3", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "qwen3vl", "mixtral", "qwen2moe", "qwen3moe",
           "gpt_oss")
REFUSED = {"qwen35": "recurrent \\(DeltaNet\\) mixer", "qwen3next": "recurrent \\(DeltaNet\\) mixer",
           "gemma4": "per-layer inputs"}


@pytest.fixture(scope="session")
def grad_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("grad")
