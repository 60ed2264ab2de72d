"""The architecture test models and llama.cpp's logits on them (tools/make_arch_models.py made the fixtures).

Each model is rebuilt here from its seed with our GGUF writer and requantized with our llama-quantize
(engine.quality.requantize, byte-identical to llama.cpp's: the fixture's sha256 of llama.cpp's file says so),
then run with both numerics and compared position by position with llama.cpp's top-K log-probabilities.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine.generate import prefill
from engine.model import load_model
from engine.quality.requantize import quantize_file
from tests.engine.golden import kld_topk, log_softmax
from tools.make_arch_models import FIXTURES, N_CTX, PREFILL, write_arch

QUANTS = ("F16", "Q8_0", "Q4_K_M", "IQ4_XS")
F32_BOUNDS = (0.005, 0.96)  # mean KLD, same top token: float32 numerics (the bar)
GGML_BOUNDS = (0.001, 0.96)  # ggml numerics
# Mixture-of-Experts in float32: the router's choice is discrete, and where two experts are nearly tied the 8-bit
# activations llama.cpp multiplies (and float32 does not) pick the other one at a few positions, which moves those
# positions' logits by far more than rounding; ggml numerics choose as llama.cpp does and match it to the bit
MOE_F32_BOUNDS = (0.02, 0.95)
# gpt-oss in float32: the same, and its peaked-but-close test model (mean top-1 probability 0.52) turns the 8-bit
# activations' rounding into a top-token flip at 4-8% of positions of the 4-bit files (F16: none), KLD under 0.01
OAI_F32_BOUNDS = (0.02, 0.9)
MOE_GGML_KLD_MAX = 1e-9  # per position: what the fixture's float32 log-probabilities leave of identical logits


@dataclass(frozen=True)
class Reference:
    ids: list[int]
    top_ids: np.ndarray  # (N, K)
    top_logp: np.ndarray
    sha256: str


def reference(name: str, quant: str) -> Reference:
    z = np.load(FIXTURES / f"{name}.npz")
    meta = json.loads((FIXTURES / f"{name}.json").read_text())
    return Reference(z["ids"].tolist(), z[f"{quant}_top_ids"], z[f"{quant}_top_logp"], meta["quants"][quant]["sha256"])


def model_file(folder: Path, name: str, quant: str) -> Path:
    """Test model `name` quantized to `quant` in `folder` (written once per folder)."""
    out = folder / f"{name}.{quant}.gguf"
    if not out.exists():
        base = folder / f"{name}.F32.gguf"
        if not base.exists():
            write_arch(base, name)
        quantize_file(base, out, quant)
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def our_logits(path: Path, ids: list[int], numerics: str, change: Callable[[Any], None] | None = None) -> np.ndarray:
    """Logits at every position: one prompt (float32), or, as llama.cpp ran them, a prompt then decode steps;
    `change` is called with the loaded model first (a feature left out)."""
    model = load_model(path, numerics=numerics)
    try:
        if change is not None:
            change(model.net)
        cache = model.new_cache(N_CTX)
        if numerics == "float32":
            return prefill(model, ids, cache, all_logits=True, chunk_size=256)
        head = prefill(model, ids[:PREFILL], cache, all_logits=True, chunk_size=256)
        rows = [head]
        for tok in ids[PREFILL:]:
            rows.append(model.net.forward([tok], cache))
            cache.commit([tok])
        return np.concatenate(rows)
    finally:
        model.close()


def stats(ref: Reference, logits: np.ndarray) -> dict[str, float]:
    lp = log_softmax(logits)
    kl = kld_topk(ref.top_ids, ref.top_logp, lp)
    return {"kld_mean": float(kl.mean()), "kld_max": float(kl.max()),
            "same_top": float((lp.argmax(-1) == ref.top_ids[:, 0]).mean())}


def split_prompt_stats(folder: Path, name: str) -> dict[str, float]:
    """`name`'s Q8_0 file run as one prompt in batches of tools.make_arch_models.SPLIT (ggml numerics), against the
    fixture's `Q8_0_split` log-probabilities from llama.cpp run the same way."""
    from tools.make_arch_models import SPLIT  # noqa: PLC0415

    z = np.load(FIXTURES / f"{name}.npz")
    ref = Reference(z["ids"].tolist(), z["Q8_0_split_top_ids"], z["Q8_0_split_top_logp"], "")
    model = load_model(model_file(folder, name, "Q8_0"), numerics="ggml")
    try:
        logits = prefill(model, ref.ids, model.new_cache(N_CTX), all_logits=True, chunk_size=SPLIT)
    finally:
        model.close()
    return stats(ref, logits)
