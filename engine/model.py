"""load_model: a GGUF file (or catalog name) -> a runnable Model with its tokenizer and chat template."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

from engine.backend import Backend, get_backend
from engine.cache import KVCache
from engine.chat import ChatTemplate
from engine.errors import ModelFormatError
from engine.gguf import GGUFFile, open_gguf
from engine.models.registry import model_class
from engine.models.base import BaseArgs
from engine.models.decoder import DecoderModel, Weights
from engine.observe import Recorder
from engine.tensor import DenseBudget
from engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)

LoadProgress = Callable[[str, float], None]  # (what is happening, fraction done 0..1)

DEFAULT_DENSE_BUDGET = 4 << 30


@dataclass
class Model:
    """A loaded model: the mapped file, the architecture's forward pass, tokenizer and chat template."""

    path: Path
    gguf: GGUFFile
    net: DecoderModel
    tokenizer: Tokenizer
    chat: ChatTemplate
    backend: Backend
    budget: DenseBudget
    warnings: list[str] = field(default_factory=list)

    @property
    def args(self) -> BaseArgs:
        return self.net.args

    @property
    def arch(self) -> str:
        return self.net.arch_name

    @property
    def name(self) -> str:
        name = self.gguf.metadata.get("general.name")
        return name if isinstance(name, str) and name.strip() else self.path.stem

    @property
    def metadata(self) -> dict[str, Any]:
        return self.gguf.metadata

    def new_cache(self, n_ctx: int | None = None, cache_type: str = "F32") -> KVCache:
        """An empty KV cache (F32, F16, Q8_0 or Q4_0 rows) for up to n_ctx positions."""
        return self.net.new_cache(n_ctx, cache_type)

    def forward(
        self, tokens: Any, cache: KVCache, recorder: Recorder | None = None, all_logits: bool = False
    ) -> npt.NDArray[np.float32]:
        self.gguf.check_unchanged()
        return self.net.forward(tokens, cache, recorder, all_logits)

    def close(self) -> None:
        self.gguf.close()


def _default_budget() -> int:
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return DEFAULT_DENSE_BUDGET
    return int(min(DEFAULT_DENSE_BUDGET * 2, max(256 << 20, avail // 2)))


def load_model(
    source: str | os.PathLike[str],
    *,
    backend: str = "numpy",
    dense_budget: int | None = None,
    progress: LoadProgress | None = None,
    warm: bool = True,
) -> Model:
    """Open a GGUF file or catalog model and build the model; ModelFormatError if the file can't be run."""
    from engine.catalog import resolve_model  # noqa: PLC0415 - avoids importing pip machinery for plain paths

    say = progress or (lambda what, frac: None)
    path = resolve_model(str(source), progress=progress)
    say("reading the GGUF header", 0.0)
    gguf = open_gguf(path)
    try:
        arch = gguf.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFormatError("general.architecture", "is missing or not a string", arch)
        cls = model_class(arch)
        say("building the tokenizer", 0.05)
        tokenizer = Tokenizer.from_metadata(gguf.metadata)
        embd = gguf.tensors.get("token_embd.weight")
        if embd is None or len(embd.shape) != 2:
            raise ModelFormatError("token_embd.weight", "is missing or not 2-D")
        n_vocab = embd.shape[1]
        if n_vocab != tokenizer.n_vocab:
            raise ModelFormatError("token_embd.weight", f"has {n_vocab} rows but the vocabulary has {tokenizer.n_vocab} tokens")
        args = cls.args_from_metadata(gguf.metadata, n_vocab)
        budget = DenseBudget(dense_budget if dense_budget is not None else _default_budget())
        weights = Weights(gguf, budget)
        net = cls(args, weights)
        warnings = list(gguf.warnings)
        extra = weights.unused()
        if extra:
            warnings.append(f"{len(extra)} tensors not used by the {arch} architecture, ignored: {', '.join(extra[:5])}")
        chat = ChatTemplate.from_metadata(gguf.metadata, arch, tokenizer)
        model = Model(Path(path), gguf, net, tokenizer, chat, get_backend(backend), budget, warnings)
        if warm:
            net.warm(lambda frac: say("dequantizing weights", 0.1 + 0.9 * frac))
        say("ready", 1.0)
        for w in warnings:
            log.warning(w)
        return model
    except BaseException:
        gguf.close()
        raise
