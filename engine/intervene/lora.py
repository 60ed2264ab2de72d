"""LoRA adapters in llama.cpp's GGUF format, applied as llama_set_adapters_lora applies them.

An adapter file has `general.type` = adapter, `adapter.type` = lora, `adapter.lora.alpha`, `general.architecture`
(the base model's), and for each adapted matrix W (ggml shape n_in x n_out) a pair `W.lora_a` (n_in x rank) and
`W.lora_b` (rank x n_out). build_lora_mm computes W x, then per adapter lora_b (lora_a x) times
scale = adapter_scale * alpha / rank (adapter_scale alone when alpha is 0), added to the product; the adapters' own
products run as any dense weight of their type does (engine.tensor.Linear; in the compiled decode step
engine.runtime.decode_lora binds the same kernels: the same bits). llama.cpp keeps the adapters of a context in a hash
map, so with two adapters on one matrix the order of their additions (and the last bits) is not fixed; on different
matrices it does not matter.

Refused with a message, nothing applied: not an adapter file, another adapter type or architecture, no alpha, a
tensor without its pair or with another suffix, a matrix the model does not have (or one GGUF Lens does not adapt
yet: token_embd, the experts), shapes that do not fit the matrix, rank 0, a value that is not finite.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.errors import ModelFormatError, SettingError
from engine.gguf import open_gguf
from engine.intervene import control_vector
from engine.tensor import DenseBudget, Linear, QTensor

if TYPE_CHECKING:
    from engine.gguf import GGUFFile
    from engine.model import Model

ADAPTER_BUDGET = 1 << 30  # float32 copies of adapter matrices (float32 numerics)


@dataclass
class Adapter:
    """One loaded adapter: its pairs by base matrix name, its alpha, the scale it is applied at."""

    name: str
    alpha: float
    scale: float
    pairs: dict[str, tuple[Linear, Linear]]
    file: GGUFFile

    def weight_scale(self, rank: int) -> float:
        """llama_adapter_lora_weight::get_scale in float32: adapter_scale * alpha / rank, or adapter_scale."""
        s = np.float32(self.scale)
        return float(s * np.float32(self.alpha) / np.float32(rank)) if self.alpha else float(s)


def parse_spec(text: str) -> tuple[str, float]:
    """'FILE[:SCALE]' (the CLI's --lora) -> (path, scale), the scale 1 by default (control vectors' syntax)."""
    return control_vector.parse_spec(text, "--lora")


def load(model: Model, path: str | Path, scale: float = 1.0) -> Adapter:
    """Read and check one adapter against the loaded model (see the module docstring for what is refused)."""
    name = Path(path).name
    try:
        g = open_gguf(path)
    except (ModelFormatError, OSError) as exc:
        raise SettingError(f"LoRA {name}: not a readable GGUF file ({exc})") from None
    try:
        return _read(model, g, name, scale)
    except BaseException:
        g.close()
        raise


def _read(model: Model, g: GGUFFile, name: str, scale: float) -> Adapter:
    md = g.metadata
    if md.get("general.type") != "adapter":
        raise SettingError(f"LoRA {name}: general.type is {md.get('general.type')!r}, not 'adapter'")
    if md.get("adapter.type") != "lora":
        raise SettingError(f"LoRA {name}: adapter.type is {md.get('adapter.type')!r}, not 'lora'")
    if md.get("general.architecture") != model.arch:
        raise SettingError(f"LoRA {name}: made for {md.get('general.architecture')!r}, this model is {model.arch}")
    alpha = md.get("adapter.lora.alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)) or not math.isfinite(alpha):
        raise SettingError(f"LoRA {name}: adapter.lora.alpha is missing or not a number")
    halves: dict[str, dict[str, str]] = {}
    for tname in g.tensors:
        base, dot, part = tname.rpartition(".")
        if part not in ("lora_a", "lora_b") or not dot:
            raise SettingError(f"LoRA {name}: tensor {tname!r} is neither .lora_a nor .lora_b")
        halves.setdefault(base, {})[part] = tname
    if not halves:
        raise SettingError(f"LoRA {name}: no LoRA tensors in the file")
    linears = model.net.linears()
    budget = DenseBudget(ADAPTER_BUDGET)
    pairs: dict[str, tuple[Linear, Linear]] = {}
    for base, got in halves.items():
        if len(got) != 2:
            raise SettingError(f"LoRA {name}: {base} has only its {next(iter(got))[-6:]}")
        target = None if base == "token_embd.weight" else linears.get(base)  # the tied head is not the embedding
        if target is None:
            known = base in model.net.weights.gguf.tensors
            why = "GGUF Lens does not adapt it yet" if known else "the model has no such matrix"
            raise SettingError(f"LoRA {name}: {base}: {why} (an adapter for another model?)")
        ia, ib = g.tensors[got["lora_a"]], g.tensors[got["lora_b"]]
        if len(ia.shape) != 2 or len(ib.shape) != 2:
            raise SettingError(f"LoRA {name}: {base}'s lora_a and lora_b must be matrices")
        (a_in, rank), (b_rank, b_out) = ia.shape, ib.shape
        if rank == 0 or b_rank == 0:
            raise SettingError(f"LoRA {name}: {base} has rank 0")
        if a_in != target.n_in or b_out != target.n_out:
            raise SettingError(f"LoRA {name}: {base} is {target.n_in}x{target.n_out}, the adapter's pair "
                               f"{a_in}x{rank} / {b_rank}x{b_out} does not fit it (an adapter for another model?)")
        if b_rank != rank:
            raise SettingError(f"LoRA {name}: {base}'s lora_a has rank {rank}, lora_b {b_rank}")
        halves_lin = []
        for info in (ia, ib):
            t = QTensor(info.name, info.qtype, tuple(info.shape), g.rows(info.name))
            if not np.isfinite(t.dequantize()).all():
                raise SettingError(f"LoRA {name}: {info.name} holds a NaN or infinity")
            halves_lin.append(Linear(t, budget, numerics=model.numerics))
        pairs[base] = (halves_lin[0], halves_lin[1])
    return Adapter(name, float(alpha), float(scale), pairs, g)


def apply(model: Model, adapters: list[Adapter]) -> None:
    """Put these adapters on the model's matrices (replacing any before); an empty list removes them all."""
    if adapters and model.backend.is_device:
        raise SettingError("LoRA adapters run on the CPU path only; load the model with --backend numpy")
    linears = model.net.linears()
    for lin in linears.values():
        lin.loras = []
    for ad in adapters:
        for base, (a, b) in ad.pairs.items():
            linears[base].loras.append((a, b, ad.weight_scale(a.n_out)))
    model.net.lora_adapters = list(adapters)


def current(model: Model) -> list[Adapter]:
    return list(getattr(model.net, "lora_adapters", []))


def describe(adapters: list[Adapter]) -> str:
    """'LoRA style.gguf x1 + other.gguf x0.5' for a reply's signature ('' without adapters)."""
    return "LoRA " + " + ".join(f"{a.name} x{a.scale:g}" for a in adapters) if adapters else ""
