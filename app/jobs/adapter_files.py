"""Adapter files on a model, whichever kind the file is: a LoRA adapter or a control vector (llama.cpp's formats).

Compare's B can be the file with an adapter (chosen there, or one the Experiments tab has on the chat's model). The
file says what it is: a control vector has `controlvector.*` keys (or `general.architecture` = controlvector), anything
else is read as a LoRA adapter, which engine.intervene.lora checks (and refuses, with its reason, when it is not one).
A refused file changes nothing: it is read and checked before what the model held is taken off.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from engine.errors import LensError, SettingError

LORA, CVEC = "lora", "cvec"


def adapter_kind(path: str | Path) -> str:
    """'cvec' for a control vector file, else 'lora' (an unreadable file included: the LoRA reader says why)."""
    from engine.gguf import open_gguf  # noqa: PLC0415

    try:
        with open_gguf(path) as g:
            md = g.metadata
            is_cvec = md.get("general.architecture") == "controlvector" or any(
                k.startswith("controlvector.") for k in md)
    except (LensError, OSError):
        return LORA
    return CVEC if is_cvec else LORA


def adapter_label(path: str | Path, scale: float, kind: str | None = None) -> str:
    """'LoRA style.gguf x1' or 'control vector calm.gguf x0.8' (what a reply's signature calls it)."""
    what = "control vector" if (kind or adapter_kind(path)) == CVEC else "LoRA"
    return f"{what} {Path(path).name} x{scale:g}"


def set_adapter(model: Any, path: str | Path, scale: float) -> str:
    """Put the adapter in `path` at `scale` on the model in place of any adapter or control vector it held; returns its
    kind. SettingError (the model unchanged) for a file that is neither, or does not fit the model."""
    from engine.intervene import control_vector, lora  # noqa: PLC0415

    if not math.isfinite(scale):
        raise SettingError(f"adapter scale {scale}: a scale must be a finite number")
    kind = adapter_kind(path)
    if kind == CVEC:
        vec = control_vector.load([(str(path), scale)], model.args.dim, model.args.n_layers, model.arch)
        control_vector.apply(model, vec)
        _drop_loras(model)
        return kind
    new = lora.load(model, path, scale)
    try:
        old = lora.current(model)
        lora.apply(model, [new])
    except BaseException:
        new.file.close()
        raise
    for ad in old:
        ad.file.close()
    control_vector.apply(model, None)
    return kind


def _drop_loras(model: Any) -> None:
    from engine.intervene import lora  # noqa: PLC0415

    old = lora.current(model)
    lora.apply(model, [])
    for ad in old:
        ad.file.close()
