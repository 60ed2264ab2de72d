"""Comparing our logits with llama.cpp's golden top-K log-probabilities (see tools/make_golden.py)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@dataclass(frozen=True)
class Golden:
    ids: list[int]
    top_ids: np.ndarray  # (N, K) int32, best first
    top_logp: np.ndarray  # (N, K) float32
    ppl: float
    ppl_f32_cache: float
    f32_top_ids: np.ndarray
    f32_top_logp: np.ndarray


def load_golden(key: str) -> Golden:
    z = np.load(FIXTURES / f"golden_{key}.npz")
    meta = json.loads((FIXTURES / f"golden_{key}.json").read_text())
    return Golden(z["ids"].tolist(), z["f16_top_ids"], z["f16_top_logp"], meta["f16_ppl"], meta["f32_ppl"],
                  z["f32_top_ids"], z["f32_top_logp"])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))


def kld_topk(ref_ids: np.ndarray, ref_logp: np.ndarray, our_logp: np.ndarray) -> np.ndarray:
    """KL(ref || ours) per position over ref's top-K, with the rest of the mass lumped into one bucket."""
    p_lp = ref_logp.astype(np.float64)
    q_lp = np.take_along_axis(our_logp, ref_ids.astype(np.int64), axis=-1)
    p = np.exp(p_lp)
    kl = (p * (p_lp - q_lp)).sum(-1)
    p_tail = np.clip(1.0 - p.sum(-1), 1e-12, None)
    q_tail = np.clip(1.0 - np.exp(q_lp).sum(-1), 1e-12, None)
    return kl + p_tail * np.log(p_tail / q_tail)


def compare(g: Golden, logits: np.ndarray, f32_cache: bool = False) -> dict[str, float]:
    """KLD mean/max, same-top-token rate and perplexity of our logits against the golden ones."""
    lp = log_softmax(logits)
    ids, logp = (g.f32_top_ids, g.f32_top_logp) if f32_cache else (g.top_ids, g.top_logp)
    kl = kld_topk(ids, logp, lp)
    nll = -lp[np.arange(len(g.ids) - 1), np.asarray(g.ids[1:])]
    return {
        "kld_mean": float(kl.mean()),
        "kld_max": float(kl.max()),
        "same_top": float((lp.argmax(-1) == ids[:, 0]).mean()),
        "ppl": float(np.exp(nll.mean())),
    }
