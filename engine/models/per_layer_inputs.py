"""Per-layer inputs (Gemma 4's E2B / E4B, Gemma 3n's "PLE"): a small embedding of each token for every layer, mixed
into that layer's output.

As llama.cpp's gemma4.cpp builds them (build_inp_per_layer, project_per_layer_inputs, then per layer), with
n_pl = embedding_length_per_layer_input and the embeddings x already times sqrtf(n_embd):

1. once per batch: the token's row of `per_layer_token_embd` (n_pl x n_layer wide) times sqrtf(n_pl); x through
   `per_layer_model_proj` (n_embd -> n_pl x n_layer) times 1/sqrtf(n_embd), each layer's n_pl slice RMS-normed by
   `per_layer_proj_norm`; the two added, times 1/sqrtf(2): one (T, n_pl) input per layer;
2. at the end of block i, on its output x: gelu(`blk.i.inp_gate` x) times layer i's input, through `blk.i.proj`
   (n_pl -> n_embd), RMS-normed by `blk.i.post_norm`, added to x.

Every scale is a float product (ggml_scale) and the GELU is ggml_gelu's (the fp16 table of the gated GELU: GELU(g)
times 1 is GELU(g) bit for bit, so the numerics' `glu('geglu', g, 1)` computes it in either numerics).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from engine.models.weights import Weights
from engine.tensor import Linear, QTensor

if TYPE_CHECKING:
    from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]


def inv_sqrtf(n: float) -> np.float32:
    """1.0f / sqrtf((float) n), in float."""
    return np.float32(1.0) / np.sqrt(np.float32(n))


@dataclass
class PerLayerInputs:
    """The per-layer input tables and each layer's gate, projection and norm (see the module docstring)."""

    table: QTensor  # per_layer_token_embd: ggml shape (n_pl * n_layer, n_vocab)
    model_proj: Linear  # per_layer_model_proj: n_embd -> n_pl * n_layer
    proj_norm: F32  # per_layer_proj_norm (n_pl,)
    gates: list[Linear]  # blk.i.inp_gate: n_embd -> n_pl
    projs: list[Linear]  # blk.i.proj: n_pl -> n_embd
    post_norms: list[F32]  # blk.i.post_norm (n_embd,)
    dim: int
    width: int  # n_pl
    eps: float
    current: F32 | None = None  # the inputs of the tokens `prepare` saw last, (n_layer, T, n_pl)

    @property
    def n_layers(self) -> int:
        return len(self.gates)

    def prepare(self, model: Any, ids: npt.NDArray[np.int64], x: F32) -> None:
        """Every layer's input for the tokens of a pass (their ids and scaled embeddings x), kept for `apply`."""
        self.current = self.inputs(model, ids, x)

    def inputs(self, model: Any, ids: npt.NDArray[np.int64], x: F32) -> F32:
        """Every layer's input for these tokens, (n_layer, T, n_pl), from their ids and scaled embeddings x (T, dim)."""
        ops, t, n = model.ops, x.shape[0], self.n_layers
        rows = ops.embed_rows(model, self.table, ids) * np.sqrt(np.float32(self.width))  # (T, n_pl * n_layer)
        proj = self.model_proj(x) * inv_sqrtf(self.dim)
        proj = ops.norm(proj.reshape(t, n, self.width), self.proj_norm, self.eps)  # (T, n_layer, n_pl)
        out = (proj + rows.reshape(t, n, self.width)) * inv_sqrtf(2.0)
        return out.transpose(1, 0, 2).copy()  # ggml_permute to (n_layer, T, n_pl), made contiguous

    def apply(self, i: int, x: F32, ops: Any, recorder: Recorder | None = None) -> F32:
        """Block i's output x (T, dim) plus its per-layer part, from layer i's inputs of the tokens prepared last."""
        if self.current is None or self.current.shape[1] != x.shape[0]:
            raise RuntimeError("the per-layer inputs are those of other tokens: prepare() these tokens first")
        inputs = self.current[i]
        if recorder is not None:
            recorder.record_input((self.gates[i].weight.name,), x)
        g = self.gates[i](x)
        g = ops.glu("geglu", g, np.ones_like(g)) * inputs  # ggml_gelu, then ggml_mul by the layer's input
        if recorder is not None:
            recorder.record_input((self.projs[i].weight.name,), g)
        y = ops.norm(self.projs[i](g), self.post_norms[i], self.eps)
        return x + y

    def linears(self, i: int) -> list[Linear]:
        """Layer i's matrices in the order the graph multiplies them; per_layer_model_proj (multiplied before every
        block) is listed with block 0's."""
        return [*([self.model_proj] if i == 0 else []), self.gates[i], self.projs[i]]


def load_per_layer_inputs(w: Weights, dim: int, width: int, n_layers: int, n_vocab: int, eps: float) -> PerLayerInputs:
    """The tables and every layer's tensors under llama.cpp's names, each checked against its shape."""
    wide = width * n_layers
    table = w.qtensor("per_layer_token_embd.weight", (wide, n_vocab))
    model_proj = w.linear("per_layer_model_proj.weight", dim, wide)
    proj_norm = w.vector("per_layer_proj_norm.weight", width)
    gates, projs, norms = [], [], []
    for i in range(n_layers):
        b = f"blk.{i}."
        gates.append(w.linear(b + "inp_gate.weight", dim, width))
        projs.append(w.linear(b + "proj.weight", width, dim))
        norms.append(w.vector(b + "post_norm.weight", dim))
    return PerLayerInputs(table, model_proj, proj_norm, gates, projs, norms, dim, width, eps)
