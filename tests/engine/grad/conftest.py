"""Random-weight test models of every architecture the backward covers (all the engine runs), written once."""
from __future__ import annotations

from pathlib import Path

import pytest


# every switch of the block graph: biases, q/k norms, fused qkv and gate+up, post-norms, soft-caps, sliding windows,
# query scaling, NEOX / IMROPE-as-NEOX RoPE; experts with softmax and softmax-weight gating, a shared expert and its
# gate, expert biases, attention sinks, the clamped SwiGLU
# the hybrids' DeltaNet layers (its recurrence traced a token at a time) and gated attention, Qwen3-Next's grouped
# heads, Gemma 4's per-layer inputs, KV sharing, V from K and its experts branch
COVERED = ("llama3", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "qwen3vl", "mixtral", "qwen2moe", "qwen3moe",
           "gpt_oss", "qwen35", "qwen35moe", "qwen3next", "gemma4", "gemma4_moe")
SEQ2SEQ = ("t5", "t5_relu")  # encoder-decoders: the gradient w.r.t. the encoder's and the decoder's embeddings


@pytest.fixture(scope="session")
def grad_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("grad")
