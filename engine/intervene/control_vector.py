"""Control vectors in llama.cpp's format: read, checked, summed, applied to a model, written.

A control vector file is a GGUF with `controlvector.model_hint` (the architecture it was made for),
`controlvector.layer_count`, and one F32 tensor `direction.<L>` (n_embd values) per layer L >= 1. As common.cpp's
common_control_vector_load reads them, each file's directions are multiplied by its scale and summed with the
other files' per layer; llama_adapter_cvec then adds direction L to block L's output (after its residual add,
build_cvec) for L in [layer_start, layer_end] (llama.cpp's defaults: 1 and n_layer), never to block 0. Unlike
common.cpp, which skips a bad file with a log line, a bad file here is refused with a message and nothing is
applied: another width or layer count, another architecture's hint, a direction that is not F32 and 1-D, a layer
index that does not parse or is 0, a value that is not finite.

The residual add and the direction are two float32 additions in llama.cpp's order, op by op and in the compiled
decode step alike (engine.runtime.decode_plan completes the residual add before adding the direction).
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.errors import LensError, ModelFormatError, SettingError
from engine.gguf import open_gguf, write_gguf
from engine.quant.types import GGMLType

if TYPE_CHECKING:
    from engine.model import Model

@dataclass(frozen=True)
class ControlVector:
    """Directions by layer (1..), already scaled and summed over the files, and where they came from."""

    directions: dict[int, np.ndarray]  # layer -> (n_embd,) float32
    sources: tuple[tuple[str, float], ...]  # (file name, scale)
    n_embd: int

    def describe(self) -> str:
        """'control vector calm.gguf x0.8 + happy.gguf x1' for a reply's signature."""
        return "control vector " + " + ".join(f"{name} x{scale:g}" for name, scale in self.sources)


def parse_spec(text: str, flag: str = "--control-vector") -> tuple[str, float]:
    """'FILE[:SCALE]' (the CLI's --control-vector, and --lora) -> (path, scale); the scale defaults to 1. A file
    whose own name holds a ':' is taken as it is when it exists."""
    if ":" not in text or Path(text).exists():
        return text, 1.0
    path, scale = text.rsplit(":", 1)
    try:
        value = float(scale)
    except ValueError:
        raise SettingError(f"{flag} {text!r}: the scale after ':' must be a number") from None
    if not math.isfinite(value):
        raise SettingError(f"{flag} {text!r}: the scale must be finite")
    return path, value


def read_one(path: str | Path, scale: float, n_embd: int, n_layers: int, arch: str) -> dict[int, np.ndarray]:
    """One file's directions times `scale`, checked against the model (n_embd, n_layers, arch)."""
    name = Path(path).name
    try:
        g = open_gguf(path)
    except (ModelFormatError, OSError) as exc:
        raise SettingError(f"control vector {name}: not a readable GGUF file ({exc})") from None
    with g:
        hint = g.metadata.get("controlvector.model_hint")
        if isinstance(hint, str) and hint and hint != arch:
            raise SettingError(f"control vector {name}: made for a {hint} model, this one is {arch}")
        count = g.metadata.get("controlvector.layer_count")
        if isinstance(count, (int, np.integer)) and not isinstance(count, bool) and int(count) > n_layers:
            raise SettingError(f"control vector {name}: made for {int(count)} layers, this model has {n_layers}")
        if not g.tensors:
            raise SettingError(f"control vector {name}: no direction tensors in the file")
        out: dict[int, np.ndarray] = {}
        for tname, info in g.tensors.items():
            prefix, _, index = tname.partition(".")
            if prefix != "direction" or not index.isdigit():
                raise SettingError(f"control vector {name}: tensor {tname!r} is not direction.<layer>")
            layer = int(index)
            if layer == 0:
                raise SettingError(f"control vector {name}: direction.0 (layer 0 never gets one)")
            if layer > n_layers:
                raise SettingError(f"control vector {name}: direction.{layer} is past this model's {n_layers} layers")
            if info.qtype != GGMLType.F32 or len([d for d in info.shape if d != 1]) > 1:
                raise SettingError(f"control vector {name}: {tname} must be a 1-D F32 tensor")
            if info.n_elements != n_embd:
                raise SettingError(f"control vector {name}: {tname} has {info.n_elements} values, this model's width "
                                   f"is {n_embd}")
            values = np.frombuffer(g.rows(tname).tobytes(), np.float32).copy()
            if not np.isfinite(values).all():
                raise SettingError(f"control vector {name}: {tname} holds a NaN or infinity")
            # common.cpp: dst[j] += src[j] * strength (several directions for one layer in one file add up)
            out[layer] = out.get(layer, np.zeros(n_embd, np.float32)) + values * np.float32(scale)
    return out


def load(specs: Iterable[tuple[str, float]], n_embd: int, n_layers: int, arch: str) -> ControlVector:
    """Every file read and checked first (nothing is applied if one is bad), then summed per layer in order."""
    specs = list(specs)
    parts = [read_one(path, scale, n_embd, n_layers, arch) for path, scale in specs]
    total: dict[int, np.ndarray] = {}
    for part in parts:
        for layer, values in part.items():
            total[layer] = total[layer] + values if layer in total else values.astype(np.float32)
    return ControlVector(total, tuple((Path(p).name, s) for p, s in specs), n_embd)


def apply(model: Model, cvec: ControlVector | None, layer_start: int = 1, layer_end: int | None = None) -> None:
    """Add `cvec`'s directions to block outputs layer_start..layer_end (llama.cpp's defaults: 1 and n_layer; block 0
    never), from the next forward on; None removes it. SettingError where it cannot apply."""
    net = model.net
    if cvec is None:
        net.control = {}
        net.control_vector = None
        return
    if model.backend.is_device:
        raise SettingError("control vectors run on the CPU path only; load the model with --backend numpy")
    if not hasattr(net, "control"):
        raise SettingError(f"control vectors are not available for the {net.arch_name} architecture")
    if cvec.n_embd != model.args.dim:
        raise SettingError(f"the control vector is {cvec.n_embd} wide, this model {model.args.dim}")
    end = model.args.n_layers if layer_end is None else layer_end
    net.control = {il: d for il, d in cvec.directions.items() if max(1, layer_start) <= il <= end
                   and il < model.args.n_layers}
    net.control_vector = cvec


def current(model: Model) -> ControlVector | None:
    return getattr(model.net, "control_vector", None)


def save(path: str | Path, directions: dict[int, np.ndarray], arch: str, n_layers: int) -> Path:
    """Write directions (layer >= 1 -> (n_embd,)) as a control vector file llama.cpp loads."""
    if any(layer < 1 for layer in directions):
        raise LensError("control vector layers start at 1")
    md = {"general.architecture": "controlvector", "controlvector.model_hint": arch,
          "controlvector.layer_count": np.uint32(n_layers)}
    tensors = [(f"direction.{layer}", GGMLType.F32, (int(v.size),), np.ascontiguousarray(v, np.float32).reshape(-1))
               for layer, v in sorted(directions.items())]
    write_gguf(path, md, tensors)
    return Path(path)
