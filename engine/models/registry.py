"""Architecture registry: `general.architecture` -> the class that runs it. Adding one is one new file."""
from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Callable

from engine.errors import ModelFormatError

if TYPE_CHECKING:
    from engine.models.decoder import DecoderModel

ARCHITECTURES: dict[str, type[DecoderModel]] = {}


def register(name: str) -> Callable[[type[DecoderModel]], type[DecoderModel]]:
    """Class decorator that makes an architecture loadable by its GGUF name."""

    def deco(cls: type[DecoderModel]) -> type[DecoderModel]:
        ARCHITECTURES[name] = cls
        cls.arch_name = name
        return cls

    return deco


def model_class(arch: str) -> type[DecoderModel]:
    """The class for `general.architecture`; ModelFormatError naming the supported ones otherwise."""
    _discover()
    try:
        return ARCHITECTURES[arch]
    except KeyError:
        known = ", ".join(sorted(ARCHITECTURES))
        raise ModelFormatError("general.architecture", f"is not supported (supported: {known})", arch) from None


# the shared definitions beside the architectures (every other module here is one architecture)
_SHARED = {"args", "decoder", "deltanet", "encoder_decoder", "hybrid", "experts", "ffn", "gemma4_ffn", "layer_kinds", "per_layer_inputs",
           "registry", "rope", "seq2seq", "transformer", "weights"}


def _discover() -> None:
    """Import every architecture module in this package once (each registers itself)."""
    import engine.models as pkg  # noqa: PLC0415

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name not in _SHARED:
            importlib.import_module(f"engine.models.{info.name}")
