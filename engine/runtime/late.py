"""The late helper's program (engine.runtime.warmup starts it as a process of its own on a first start): build
the model again from its file and compile the late kernels, those the first tokens ran without (the compiled
decode step and its LoRA kernels, the prompt attention, the legacy one-row products, the VNNI batches;
engine.kernels.precompile).
A module apart from warmup because it builds a model, and the numerics it builds one with import warmup."""
from __future__ import annotations

from engine.gguf import open_gguf
from engine.kernels import isa, precompile
from engine.kernels.compile_jobs import parse_weights
from engine.kernels.dispatch import warm_up
from engine.models.registry import model_class
from engine.models.weights import Weights
from engine.ops import attention_ggml
from engine.ops.ggml_kernels import load_parallel
from engine.runtime import decode_lora
from engine.runtime.numerics import numerics_for
from engine.runtime.warmup import dry_passes
from engine.tensor import DenseBudget


def compile_late(path: str, names: list[str]) -> None:
    """A dry four-token prompt and decode step of the model in `path` with every kernel allowed, the parallel chunk
    kernels of a long prompt, then the products of the weights named TYPE:ROWS (the VNNI batches and one-row products
    among them)."""
    gguf = open_gguf(path)
    cls = model_class(str(gguf.metadata["general.architecture"]))
    args = cls.args_from_metadata(gguf.metadata, gguf.tensors["token_embd.weight"].shape[1])
    net = cls(args, Weights(gguf, DenseBudget(0), "ggml"), numerics_for("ggml"))
    with precompile.dry_products():
        dry_passes(net)  # on the model's cache type and an F32 cache (Compare's reference run, the sweep)
    decode_lora.warm()  # an adapter's halves in the decode step (engine.intervene.lora)
    load_parallel(isa.lanes() == 8)  # a long prompt's chunk kernels (every later start loads them at once)
    attention_ggml.load_kernels()  # and its attention's products (tinyBLAS's dot on numba's threads)
    # then the products, the late ones allowed (by now the first helper has compiled, or nearly, the others)
    warm_up(parse_weights(names))
    seen = set()  # and an expert's rows of a prompt (MUL_MAT_ID's band kernels), once per weight type and shape
    for layer in getattr(net, "layers", []):
        for lin in getattr(layer.ffn, "experts", list)():
            key = (lin.weight.qtype, lin.n_in, lin.n_out)
            if key not in seen:
                seen.add(key)
                lin.warm_rows()
