"""llama.cpp's logits on SmolLM2 with LoRA adapters that GGUF Lens wrote (issue 27's check).

    /tmp/llvenv/bin/python tools/make_lora_fixtures.py [--models-dir DIR]

Two adapters in llama.cpp's GGUF format are written from fixed seeds with GGUF Lens's writer (`write_lora`, which the
test suite calls too; the JSON's sha256 says they are the same bytes): "a" adapts every block's attn_q and attn_v
(rank 8, alpha 16, F32), "b" every ffn_up and ffn_down (rank 4, alpha 2, F16), strong enough that leaving out the
alpha / rank scale or an adapter's scale moves the answer by far more than rounding. llama.cpp loads them with
llama_adapter_lora_init, applies them with llama_set_adapters_lora (at scale 1, at 0.5, and both at once: they adapt
different matrices, so the order llama.cpp adds them in does not matter) and runs N_TOKENS fixed token ids (a
PREFILL-token prompt, then one token per step; F16 KV cache, no flash attention). Top-K log-probabilities per case go
to tests/fixtures/lora/smollm2.npz, the adapters' sha256 to smollm2.json. A development tool, never a runtime
dependency.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.gguf import write_gguf  # noqa: E402
from engine.quant.types import GGMLType  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "lora"
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
N_LAYERS, DIM, KV_DIM, FF = 30, 576, 192, 1536
ADAPTERS = {  # name: (seed, rank, alpha, type, {matrix: (n_in, n_out)}, strength of lora_b)
    "a": (21, 8, 16.0, GGMLType.F32, {"attn_q": (DIM, DIM), "attn_v": (DIM, KV_DIM)}, 0.05),
    "b": (22, 4, 2.0, GGMLType.F16, {"ffn_up": (DIM, FF), "ffn_down": (FF, DIM)}, 0.1),
}
CASES = {"a": [("a", 1.0)], "a_half": [("a", 0.5)], "a_b": [("a", 1.0), ("b", 1.0)]}
N_TOKENS, PREFILL, TOP_K = 48, 32, 64


def write_lora(folder: Path, name: str) -> Path:
    """Adapter `name` for SmolLM2 in llama.cpp's LoRA GGUF format, written by GGUF Lens."""
    seed, rank, alpha, qtype, mats, strength = ADAPTERS[name]
    rng = np.random.default_rng(seed)
    dtype = np.float16 if qtype == GGMLType.F16 else np.float32
    tensors = []
    for i in range(N_LAYERS):
        for mat, (n_in, n_out) in mats.items():
            base = f"blk.{i}.{mat}.weight"
            a = rng.standard_normal((rank, n_in)).astype(np.float32) / np.float32(math.sqrt(n_in))
            b = rng.standard_normal((n_out, rank)).astype(np.float32) * np.float32(strength)
            tensors.append((base + ".lora_a", qtype, (n_in, rank), a.astype(dtype)))
            tensors.append((base + ".lora_b", qtype, (rank, n_out), b.astype(dtype)))
    md = {"general.architecture": "llama", "general.type": "adapter", "general.name": f"GGUF Lens test LoRA {name}",
          "adapter.type": "lora", "adapter.lora.alpha": np.float32(alpha)}
    path = folder / f"lora_{name}.gguf"
    write_gguf(path, md, tensors)
    return path


def token_ids() -> list[int]:
    return np.random.default_rng(7).integers(200, 40000, N_TOKENS).tolist()


def llama_logits(model: Path, adapters: list[tuple[Path, float]], ids: list[int]) -> np.ndarray:
    import llama_cpp  # noqa: PLC0415
    from llama_cpp import Llama  # noqa: PLC0415

    llm = Llama(model_path=str(model), n_ctx=256, n_batch=256, n_ubatch=256, logits_all=True, n_threads=2,
                verbose=False, flash_attn=False)
    handles = []
    for path, _ in adapters:
        h = llama_cpp.llama_adapter_lora_init(llm._model.model, str(path).encode())
        if not h:
            raise SystemExit(f"llama_adapter_lora_init failed for {path}")
        handles.append(h)
    if handles:
        arr = (llama_cpp.llama_adapter_lora_p_ctypes * len(handles))(*handles)
        scales = (ctypes.c_float * len(handles))(*[s for _, s in adapters])
        if llama_cpp.llama_set_adapters_lora(llm._ctx.ctx, arr, len(handles), scales) != 0:
            raise SystemExit("llama_set_adapters_lora failed")
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
    ap.add_argument("--work", type=Path, default=Path("/tmp/lora_fixtures"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    files = {name: write_lora(args.work, name) for name in ADAPTERS}
    ids = token_ids()
    out: dict[str, np.ndarray] = {"ids": np.asarray(ids, np.int32)}
    for case, parts in {"none": [], **CASES}.items():
        logp = log_softmax(llama_logits(args.models_dir / MODEL, [(files[n], s) for n, s in parts], ids))
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
