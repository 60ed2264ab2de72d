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
from engine.chat.template import ChatTemplate
from engine.errors import ModelFormatError, SettingError
from engine.gguf import GGUFFile, open_gguf
from engine.kernels.dispatch import NUMERICS
from engine.memory import check_memory, scan_small_tensors
from engine.models.registry import model_class
from engine.models.args import BaseArgs
from engine.models.decoder import DecoderModel
from engine.models.weights import Weights
from engine.runtime import warmup
from engine.runtime.numerics import cache_setting, flash_setting, numerics_for
from engine.observe.recorder import Recorder
from engine.tensor import DenseBudget
from engine.tokenizer.vocab import Tokenizer

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

    @property
    def numerics(self) -> str:
        """'ggml' (llama.cpp's numbers: products on the blocks, 8-bit activations) or 'float32' (the reference)."""
        return self.net.numerics

    @property
    def flash_attn(self) -> bool:
        """Whether attention follows llama.cpp's flash attention kernels (--flash-attn on)."""
        return bool(getattr(getattr(self.net, "ops", None), "flash", False))

    def new_cache(self, n_ctx: int | None = None, cache_type: str | None = None) -> KVCache:
        """An empty KV cache (F32, F16, Q8_0 or Q4_0 rows; default F16 with ggml numerics) for up to n_ctx positions."""
        return self.net.new_cache(n_ctx, cache_type)

    def forward(
        self, tokens: Any, cache: KVCache, recorder: Recorder | None = None, all_logits: bool = False
    ) -> npt.NDArray[np.float32]:
        self.gguf.check_unchanged()
        self._late_paths()
        return self.net.forward(tokens, cache, recorder, all_logits)

    def _late_paths(self) -> None:
        """A first start's late kernels ready since the warm-up: the network takes them up whole before this pass
        (engine.runtime.warmup.finish_late: its decode plan and repacked copies built, the file pages they replace
        released, together), not one product at a time inside whatever runs next."""
        if warmup.late_pending(self.net):
            warmup.finish_late(self.net)

    def forward_hidden(self, tokens: Any, cache: KVCache, recorder: Recorder | None = None) -> npt.NDArray[np.float32] | None:
        """The residual stream (T, dim) after the last layer, K/V written, not committed (logits_of turns rows of it
        into forward's logits, bit for bit); None where the network runs its head with its layers (a GPU runner,
        an encoder-decoder): call forward then."""
        if not self.stops_before_head:
            return None
        self.gguf.check_unchanged()
        self._late_paths()
        return self.net.forward_hidden(tokens, cache, recorder)

    @property
    def stops_before_head(self) -> bool:
        """Whether forward_hidden runs (a NumPy decoder), not None (a GPU runner, an encoder-decoder)."""
        return getattr(self.net, "forward_hidden", None) is not None and not self.gpu_layers

    def logits_of(self, hidden: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The logits of rows of forward_hidden's residual stream: the final norm, output product and soft-cap."""
        return self.net.head(hidden, True)

    def _on_fallback(self, backend: Backend, note: str) -> None:
        """The GPU failed mid-run: the model now runs on NumPy; say so once."""
        self.backend = backend
        self.warnings.append(note)

    def greedy_step(self, token: int, cache: KVCache) -> int:
        """Run one token, commit it to the cache and return the most likely next one (bench, greedy decoding).

        On a GPU only the picked id comes back to the host, not the logits.
        """
        step = getattr(self.net, "greedy_step", None)
        if step is not None:
            self.gguf.check_unchanged()
            return step(token, cache)
        logits = self.forward([token], cache)
        cache.commit([token])
        return int(np.argmax(logits[-1]))

    @property
    def gpu_layers(self) -> int:
        """Layers running on the GPU (0 on NumPy)."""
        return int(getattr(self.net, "gpu_layers", 0))

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
    gpu_layers: int | None = None,
    n_ctx: int | None = None,
    numerics: str = "ggml",
    flash_attn: str | bool = "off",
    cache_type: str | None = None,
) -> Model:
    """Open a GGUF file or catalog model and build the model; ModelFormatError if the file can't be run.

    backend 'cupy' (or 'auto' with a GPU) runs the last `gpu_layers` layers (default all) and the head on the
    GPU, fewer when they do not fit; what was decided is in Model.warnings and Model.backend.note.
    n_ctx is the context the memory preflight plans for (default: the model's trained context).
    numerics 'ggml' (default) computes on the GGUF blocks as llama.cpp does and keeps no float copy of a weight;
    'float32' dequantizes the weights (within the dense budget) and multiplies float32 activations.
    flash_attn 'on' (ggml numerics) attends as llama.cpp does with flash attention (ggml_flash_attn_ext), 'off'
    (default) as its mul_mat / soft_max graph. cache_type: the KV cache's rows ('F16', 'F32', 'Q8_0', 'Q4_0'; default
    F16 with ggml numerics, F32 with float32), as llama.cpp's -ctk / -ctv (flash attention takes F16, Q8_0, Q4_0).
    """
    from engine.catalog import resolve_model  # noqa: PLC0415 - avoids importing pip machinery for plain paths

    say = progress or (lambda what, frac: None)
    if gpu_layers is not None and backend == "numpy":
        raise SettingError("--gpu-layers needs the cupy (or auto) backend")
    if numerics not in NUMERICS:
        raise SettingError(f"numerics {numerics!r} is not one of {', '.join(NUMERICS)}")
    flash = flash_setting(flash_attn, numerics)
    kv_type = cache_setting(cache_type, flash)
    chosen = get_backend(backend)
    asked = numerics
    if chosen.is_device and numerics == "ggml":
        numerics = "float32"  # the CUDA kernels multiply float32 activations; the CPU layers follow them
        flash = False  # and attend in float32 (no flash kernel's order to follow)
    path = resolve_model(str(source), progress=progress)
    say("reading the GGUF header", 0.0)
    gguf = open_gguf(path)
    try:
        arch = gguf.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFormatError("general.architecture", "is missing or not a string", arch)
        cls = model_class(arch)
        notes: list[str] = []
        if chosen.is_device and getattr(cls, "is_encoder_decoder", False):  # no CUDA path for an encoder yet
            if backend == "cupy":
                raise SettingError(f"{arch} (encoder-decoder) models run on the CPU only: use the numpy backend")
            chosen, numerics = get_backend("numpy"), asked
            notes.append(f"{arch} (encoder-decoder) runs on the CPU: the GPU path has no encoder yet")
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
        # refuse before allocating anything a model whose weights and KV cache cannot fit (RELIABILITY 28)
        copies = budget.limit if warm and numerics == "float32" else 0
        check_memory(gguf, args, n_ctx=n_ctx, dense_budget=copies,
                     cache_type=kv_type or ("F16" if numerics == "ggml" else "F32"))
        weights = Weights(gguf, budget, numerics)
        net = cls(args, weights, numerics_for(numerics, flash))
        if kv_type is not None:
            net.ops.cache_type = kv_type  # every cache the model makes (new_cache's default)
        warnings = list(gguf.warnings) + scan_small_tensors(gguf) + notes
        extra = weights.unused()
        if extra:
            warnings.append(f"{len(extra)} tensors not used by the {arch} architecture, ignored: {', '.join(extra[:5])}")
        chat = ChatTemplate.from_metadata(gguf.metadata, arch, tokenizer)
        runner: Any = net
        if chosen.is_device:
            from engine.gpu import to_device  # noqa: PLC0415 - the CUDA path loads only with a GPU

            say(f"uploading weights to {chosen.device_name()}", 0.08)
            runner, chosen = to_device(net, chosen, gpu_layers, notes=warnings)
        elif chosen.note:
            warnings.append(chosen.note)
        model = Model(Path(path), gguf, runner, tokenizer, chat, chosen, budget, warnings)
        if hasattr(runner, "on_fallback"):
            runner.on_fallback = model._on_fallback
        if warm:
            what = "preparing the CPU kernels (compiled once, then cached)" if numerics == "ggml" else "dequantizing weights"
            runner.warm(lambda frac: say(what, 0.1 + 0.9 * frac))
        say("ready", 1.0)
        for w in warnings:  # the normal CPU case (auto, no CuPy) is not a warning: a front end shows it quietly
            (log.info if chosen.quiet and w == chosen.note else log.warning)(w)
        return model
    except BaseException:
        gguf.close()
        raise
