"""What tools/make_cvec_fixtures.py and tools/make_lora_fixtures.py share: the catalog models' shapes, the fixed token
ids, llama.cpp's run of them (a PREFILL-token prompt, then one token per step; F16 KV cache, no flash attention) and
the fixture files (top-K log-probabilities per case in MODEL.npz, the intervention files' sha256 in MODEL.json).

A development tool (llama-cpp-python runs only in the fixture scripts), never a runtime dependency; the tests import
the shapes and writers from here without llama_cpp.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tools.make_arch_models import llama_cpp_logits, log_softmax

N_TOKENS, PREFILL, TOP_K = 48, 32, 64


@dataclass(frozen=True)
class Shape:
    """A catalog model as the interventions see it."""

    file: str
    arch: str  # general.architecture, the files' model hint
    n_layers: int
    dim: int
    q_dim: int
    kv_dim: int
    ff: int


MODELS = {
    "smollm2": Shape("SmolLM2-135M-Instruct.Q4_1.gguf", "llama", 30, 576, 576, 192, 1536),
    "gemma3": Shape("gemma-3-270m-q4_k_m.gguf", "gemma3", 18, 640, 1024, 256, 2048),
}


def token_ids(seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(200, 40000, N_TOKENS).tolist()


def llama_logits(model: Path, ids: list[int], setup: Callable[[Any], None]) -> np.ndarray:
    """llama.cpp's logits at every position of `ids`, `setup(llm)` called on the loaded model first."""
    return llama_cpp_logits(model, ids, 2, n_ctx=256, n_batch=256, prefill=PREFILL, setup=setup)


def write_fixture(folder: Path, name: str, shape: Shape, ids: list[int], files: dict[str, Path],
                  cases: dict[str, list[tuple[str, float]]], logits_of: Callable[[list[tuple[str, float]]], np.ndarray],
                  ) -> None:
    """Run every case (and 'none') through `logits_of` and write folder/name.npz and name.json."""
    out: dict[str, np.ndarray] = {"ids": np.asarray(ids, np.int32)}
    for case, parts in {"none": [], **cases}.items():
        logp = log_softmax(logits_of(parts))
        top = np.argsort(-logp, axis=-1, kind="stable")[:, :TOP_K]
        out[f"{case}_top_ids"] = top.astype(np.int32)
        out[f"{case}_top_logp"] = np.take_along_axis(logp, top, axis=-1).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(folder / f"{name}.npz", **out)
    meta = {"model": shape.file, "cases": cases, "top_k": TOP_K, "prefill": PREFILL,
            "sha256": {n: hashlib.sha256(p.read_bytes()).hexdigest() for n, p in files.items()}}
    (folder / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(name, json.dumps(meta["sha256"]))


def read_fixture(folder: Path, name: str) -> dict:
    """What a test compares against: {'npz': the arrays, 'meta': the JSON}."""
    return {"npz": np.load(folder / f"{name}.npz"), "meta": json.loads((folder / f"{name}.json").read_text())}
