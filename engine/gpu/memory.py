"""How much device memory a model needs with N layers on the GPU, before anything is uploaded.

Bytes of the quantized blocks per layer (they stay in their GGUF blocks on the device), the head (output
matrix and norm, plus the embedding table when every layer is on the device), the KV cache of the device
layers, and scratch: one prefill chunk's activations and the largest float32 tile dequantized for cuBLAS.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from engine.gpu.linear import TILE_BYTES
from engine.gpu.plan import ArchPlan
from engine.models.args import BaseArgs

GIB = 1 << 30
MARGIN = 256 << 20  # cuBLAS workspace, the kernels' modules, allocator slack
DEFAULT_CTX = 4096  # the context the estimate plans the KV cache for unless told
DEFAULT_CHUNK = 512


@dataclass(frozen=True)
class GpuMemoryEstimate:
    """Device bytes by part; `needed(n)` for n layers on the GPU (the last n, as llama.cpp's -ngl)."""

    layer_bytes: tuple[int, ...]  # quantized blocks and norms of each layer
    head_bytes: int  # output matrix and norm
    embed_bytes: int  # the embedding table, on the device only when every layer is (0 when tied to the output)
    kv_per_layer: int  # keys and values of one layer at n_ctx
    scratch: int
    n_ctx: int
    free: int | None  # free device memory now, when known

    @property
    def n_layers(self) -> int:
        return len(self.layer_bytes)

    def needed(self, gpu_layers: int) -> int:
        """Bytes for the last gpu_layers layers plus the head, their KV cache and scratch (0 for none)."""
        n = max(0, min(gpu_layers, self.n_layers))
        if n == 0:
            return 0
        weights = sum(self.layer_bytes[self.n_layers - n:]) + self.head_bytes
        if n == self.n_layers:
            weights += self.embed_bytes
        return weights + n * self.kv_per_layer + self.scratch + MARGIN

    def layers_that_fit(self, budget: int | None = None) -> int:
        """The most layers whose needs fit in `budget` (default: the free memory; all when unknown)."""
        budget = self.free if budget is None else budget
        if budget is None:
            return self.n_layers
        for n in range(self.n_layers, 0, -1):
            if self.needed(n) <= budget:
                return n
        return 0

    def message(self, gpu_layers: int) -> str:
        """One line: what n layers need against what is free."""
        free = f", {self.free / GIB:.2f} GiB free" if self.free is not None else ""
        return (f"{gpu_layers} of {self.n_layers} layers on the GPU need {self.needed(gpu_layers) / GIB:.2f} GiB "
                f"(KV cache for {self.n_ctx} tokens included){free}")


def estimate_gpu_memory(plan: ArchPlan, args: BaseArgs, *, n_ctx: int | None = None, cache_bytes: int = 4,
                        chunk: int = DEFAULT_CHUNK, free: int | None = None) -> GpuMemoryEstimate:
    """The estimate for a model's plan; cache_bytes is 4 for an F32 KV cache, 2 for F16."""
    ctx = min(args.n_ctx, n_ctx or DEFAULT_CTX)
    layers = []
    largest = 0
    for L in plan.layers:
        mats = L.qkv + [L.wo] + L.gate_up + [L.down]
        norms = [L.attn_norm, L.ffn_norm, L.q_norm, L.k_norm, L.post_attn_norm, L.post_ffn_norm]
        layers.append(sum(m.weight.nbytes for m in mats) + sum(4 * n.size for n in norms if n is not None)
                      + L.freqs.size * 8)
        for group in (L.qkv, [L.wo], L.gate_up, [L.down]):
            largest = max(largest, sum(m.n_out for m in group) * group[0].n_in * 4)
    head = plan.output.weight.nbytes + 4 * plan.out_norm.size
    tied = plan.output.weight.name == plan.tok_embd.name
    embed = 0 if tied else plan.tok_embd.nbytes
    kv = 2 * ctx * args.n_kv_heads * args.head_dim * cache_bytes
    q_dim, kv_dim = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    acts = chunk * (4 * args.dim + 2 * (q_dim + 2 * kv_dim) + 3 * args.hidden_dim) * 4
    n_split = 16
    attn = args.n_heads * chunk * n_split * (args.head_dim + 2) * 4
    scratch = acts + attn + min(largest, TILE_BYTES) + args.n_vocab * 4 * 2
    return GpuMemoryEstimate(tuple(layers), head, embed, kv, scratch, ctx, free)


def gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def describe(est: GpuMemoryEstimate) -> str:
    """Where the bytes go with every layer on the device."""
    return (f"weights {gib(sum(est.layer_bytes) + est.head_bytes + est.embed_bytes)}, KV cache for {est.n_ctx} tokens "
            f"{gib(est.kv_per_layer * est.n_layers)}, scratch {gib(est.scratch)}; "
            f"{math.ceil(est.needed(est.n_layers) / (1 << 20))} MiB in all")
