"""llama.cpp's logits on SmolLM2 with control vectors that GGUF Lens wrote (issue 27's check).

    /tmp/llvenv/bin/python tools/make_cvec_fixtures.py [--models-dir DIR]

Two control vector files are written from fixed seeds with GGUF Lens's own writer (`write_cvec`, which the test
suite calls too: the sha256 in the JSON says they are the same bytes), one random direction per layer 1..29 for
SmolLM2 (30 blocks, 576 wide), strong enough that applying a direction one block early or late, or leaving out a
scale, moves the answer by far more than rounding. llama.cpp then loads them as common.cpp's
common_control_vector_load does (read here with gguf-py, llama.cpp's own GGUF reader: F32 `direction.<L>` tensors,
each file's directions times its scale, summed per layer), applies them with llama_set_adapter_cvec over its default
layer range (1 .. n_layer) and runs N_TOKENS fixed token ids (a PREFILL-token prompt, then one token per step; F16 KV
cache, no flash attention). Per case the top-K log-probabilities at every position go to
tests/fixtures/cvec/smollm2.npz, the files' sha256 to smollm2.json. A development tool, never a runtime dependency.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.intervene.control_vector import save  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "cvec"
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
N_EMBD, N_LAYERS = 576, 30
SEEDS = {"a": 11, "b": 12}
STRENGTH = 0.6  # per-element std of each direction
CASES = {"a": [("a", 1.0)], "a_half": [("a", 0.5)], "a_half_b": [("a", 0.5), ("b", 1.0)]}
N_TOKENS, PREFILL, TOP_K = 48, 32, 64


def directions(seed: int) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {layer: (rng.standard_normal(N_EMBD) * STRENGTH).astype(np.float32) for layer in range(1, N_LAYERS)}


def write_cvec(folder: Path, name: str) -> Path:
    """Control vector `name` ('a' or 'b') for SmolLM2, written by GGUF Lens."""
    return save(folder / f"cvec_{name}.gguf", directions(SEEDS[name]), "llama", N_LAYERS)


def token_ids() -> list[int]:
    return np.random.default_rng(5).integers(200, 40000, N_TOKENS).tolist()


def load_like_common(files: list[tuple[Path, float]]) -> np.ndarray:
    """common_control_vector_load: per file F32 direction.<L> times the scale into data[(L-1) * n_embd], summed."""
    import gguf  # noqa: PLC0415 - llama.cpp's gguf-py

    data = np.zeros(0, np.float32)
    for path, scale in files:
        for t in gguf.GGUFReader(str(path)).tensors:
            layer = int(t.name.split(".", 1)[1])
            assert t.name.startswith("direction.") and layer > 0 and t.tensor_type == 0 and t.data.size == N_EMBD
            if data.size < N_EMBD * layer:
                data = np.concatenate([data, np.zeros(N_EMBD * layer - data.size, np.float32)])
            data[N_EMBD * (layer - 1) : N_EMBD * layer] += np.asarray(t.data, np.float32) * np.float32(scale)
    return data


def llama_logits(model: Path, data: np.ndarray, ids: list[int]) -> np.ndarray:
    import llama_cpp  # noqa: PLC0415
    from llama_cpp import Llama  # noqa: PLC0415

    llm = Llama(model_path=str(model), n_ctx=256, n_batch=256, n_ubatch=256, logits_all=True, n_threads=2,
                verbose=False, flash_attn=False)
    buf = np.ascontiguousarray(data, np.float32)
    ptr = buf.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    if llama_cpp.llama_set_adapter_cvec(llm._ctx.ctx, ptr, buf.size, N_EMBD, 1, N_LAYERS) != 0:
        raise SystemExit("llama_set_adapter_cvec failed")
    llm.reset()
    llm.eval(ids[:PREFILL])
    for tok in ids[PREFILL:]:
        llm.eval([tok])
    out = np.array(llm.scores[: len(ids)], dtype=np.float32)
    del llm
    return out


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-dir", type=Path, default=Path.home() / ".cache/gguf-lens/models")
    ap.add_argument("--work", type=Path, default=Path("/tmp/cvec_fixtures"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    files = {name: write_cvec(args.work, name) for name in SEEDS}
    ids = token_ids()
    out: dict[str, np.ndarray] = {"ids": np.asarray(ids, np.int32)}
    for case, parts in {"none": [], **CASES}.items():
        data = load_like_common([(files[n], s) for n, s in parts]) if parts else np.zeros(0, np.float32)
        logp = log_softmax(llama_logits(args.models_dir / MODEL, data, ids))
        top = np.argsort(-logp, axis=-1, kind="stable")[:, :TOP_K]
        out[f"{case}_top_ids"] = top.astype(np.int32)
        out[f"{case}_top_logp"] = np.take_along_axis(logp, top, axis=-1).astype(np.float32)
    np.savez_compressed(FIXTURES / "smollm2.npz", **out)
    meta = {"model": MODEL, "cases": CASES, "top_k": TOP_K, "prefill": PREFILL,
            "sha256": {n: hashlib.sha256(p.read_bytes()).hexdigest() for n, p in files.items()}}
    (FIXTURES / "smollm2.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta["sha256"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
