"""What every hybrid architecture (attention layers and recurrent DeltaNet layers: qwen35, qwen35moe, qwen3next)
reads beyond the transformer's hyper-parameters: which layers recur (`attention.recurrent_layers`, else the
`full_attention_interval` rule), the DeltaNet sizes, IMROPE's sections and the trailing multi-token-prediction blocks
llama.cpp loads but does not run."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import ModelFormatError
from engine.models.args import MetadataView
from engine.models.deltanet import DeltaNetDims
from engine.models.rope import read_sections
from engine.models.transformer import TransformerArgs


@dataclass
class HybridArgs(TransformerArgs):
    """Qwen3.5 hyper-parameters: the transformer's, the DeltaNet sizes, which layers are recurrent, the sections."""

    deltanet: DeltaNetDims | None = None
    recurrent: tuple[bool, ...] = ()
    rope_sections: tuple[int, int, int, int] = (0, 0, 0, 0)
    n_nextn: int = 0  # nextn_predict_layers: trailing MTP blocks, not run

    @classmethod
    def from_metadata(cls, md: dict[str, Any], n_vocab: int, arch: str, moe: str, recurrent: bool = True,
                      imrope: bool = True, rope_base: float = 10000.0) -> HybridArgs:
        """The hyper-parameters; `imrope` False: no rope.dimension_sections (Qwen3-Next's plain NEOX RoPE)."""
        m = MetadataView(md, arch)
        nextn = m.optional_int("nextn_predict_layers") or 0
        if moe and f"{arch}.feed_forward_length" not in md:  # the experts' width is given on its own
            md = {**md, f"{arch}.feed_forward_length": m.int("expert_feed_forward_length")}
        args = cls.read(md, n_vocab, arch, rope_base=rope_base, moe=moe)
        n_all = args.n_layers
        if not 0 <= nextn < n_all:
            raise ModelFormatError(f"{arch}.nextn_predict_layers", f"must be less than block_count {n_all}", nextn)
        args.n_layers, args.n_nextn = n_all - nextn, nextn
        args.rope_sections = read_sections(m) if imrope else (0, 0, 0, 0)
        args.recurrent = _pattern(m, n_all, args.n_layers) if recurrent else (False,) * args.n_layers
        if any(args.recurrent):
            args.deltanet = DeltaNetDims.read(m)
        return args  # type: ignore[return-value]


def _pattern(m: MetadataView, n_all: int, n_layers: int) -> tuple[bool, ...]:
    """llama.cpp's is_recr per layer: `attention.recurrent_layers` when the file has it, else the interval rule."""
    key = f"{m.arch}.attention.recurrent_layers"
    got = m.md.get(key)
    if got is not None:
        flags = [bool(v) for v in np.asarray(got).reshape(-1)]
        if len(flags) != n_all:
            raise ModelFormatError(key, f"has {len(flags)} entries for block_count {n_all}", len(flags))
        return tuple(flags[:n_layers])
    interval = m.int("full_attention_interval", 4)
    if not 1 <= interval <= n_all:
        raise ModelFormatError(f"{m.arch}.full_attention_interval", f"must be between 1 and block_count {n_all}", interval)
    return tuple((i + 1) % interval != 0 for i in range(n_layers))

