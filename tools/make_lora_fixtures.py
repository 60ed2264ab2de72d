"""llama.cpp's logits on the catalog models with LoRA adapters that GGUF Lens wrote (issue 27's check).

    /tmp/llvenv/bin/python tools/make_lora_fixtures.py [--models-dir DIR] [--model smollm2|gemma3|all]

Two adapters per model in llama.cpp's GGUF format are written from fixed seeds with GGUF Lens's writer
(`write_lora`, which the test suite calls too; the JSON's sha256 says they are the same bytes): "a" adapts every
block's attn_q and attn_v (rank 8, alpha 16, F32), "b" every ffn_up and ffn_down (rank 4, alpha 2, F16), strong
enough that leaving out the alpha / rank scale or an adapter's scale moves the answer by far more than rounding.
llama.cpp loads them with llama_adapter_lora_init, applies them with llama_set_adapters_lora (at scale 1, at 0.5,
and both at once: they adapt different matrices, so the order llama.cpp adds them in does not matter) and runs fixed
token ids (tools/intervene_fixtures.py). Top-K log-probabilities per case go to tests/fixtures/lora/MODEL.npz, the
adapters' sha256 to MODEL.json. A development tool, never a runtime dependency.
"""
from __future__ import annotations

import argparse
import ctypes
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.gguf import write_gguf  # noqa: E402
from engine.quant.types import GGMLType  # noqa: E402
from tools.intervene_fixtures import MODELS, PREFILL, Shape, llama_logits, token_ids, write_fixture  # noqa: E402, F401

FIXTURES = ROOT / "tests" / "fixtures" / "lora"
ADAPTERS = {  # name: (seed, rank, alpha, type, matrices, strength of lora_b)
    "a": (21, 8, 16.0, GGMLType.F32, ("attn_q", "attn_v"), 0.05),
    "b": (22, 4, 2.0, GGMLType.F16, ("ffn_up", "ffn_down"), 0.1),
}
SEED_SHIFT = {"smollm2": 0, "gemma3": 100}  # Gemma's adapters: other seeds
STRENGTH = {"smollm2": 1.0, "gemma3": 1.0}  # times each adapter's strength
TOKEN_SEED = {"smollm2": 7, "gemma3": 8}
CASES = {"a": [("a", 1.0)], "a_half": [("a", 0.5)], "a_b": [("a", 1.0), ("b", 1.0)]}


def _mats(shape: Shape) -> dict[str, tuple[int, int]]:
    return {"attn_q": (shape.dim, shape.q_dim), "attn_v": (shape.dim, shape.kv_dim), "ffn_up": (shape.dim, shape.ff),
            "ffn_down": (shape.ff, shape.dim)}


def write_lora(folder: Path, name: str, model: str = "smollm2") -> Path:
    """Adapter `name` for a catalog model in llama.cpp's LoRA GGUF format, written by GGUF Lens."""
    shape = MODELS[model]
    seed, rank, alpha, qtype, mats, strength = ADAPTERS[name]
    rng = np.random.default_rng(seed + SEED_SHIFT[model])
    dtype = np.float16 if qtype == GGMLType.F16 else np.float32
    tensors = []
    for i in range(shape.n_layers):
        for mat in mats:
            n_in, n_out = _mats(shape)[mat]
            base = f"blk.{i}.{mat}.weight"
            a = rng.standard_normal((rank, n_in)).astype(np.float32) / np.float32(math.sqrt(n_in))
            b = rng.standard_normal((n_out, rank)).astype(np.float32) * np.float32(strength * STRENGTH[model])
            tensors.append((base + ".lora_a", qtype, (n_in, rank), a.astype(dtype)))
            tensors.append((base + ".lora_b", qtype, (rank, n_out), b.astype(dtype)))
    md = {"general.architecture": shape.arch, "general.type": "adapter", "general.name": f"GGUF Lens test LoRA {name}",
          "adapter.type": "lora", "adapter.lora.alpha": np.float32(alpha)}
    tag = "" if model == "smollm2" else f"{model}_"
    path = folder / f"lora_{tag}{name}.gguf"
    write_gguf(path, md, tensors)
    return path


def _with_adapters(adapters: list[tuple[Path, float]]):  # noqa: ANN202
    def setup(llm) -> None:  # noqa: ANN001
        import llama_cpp  # noqa: PLC0415

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
    return setup


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-dir", type=Path, default=Path.home() / ".cache/gguf-lens/models")
    ap.add_argument("--work", type=Path, default=Path("/tmp/lora_fixtures"))
    ap.add_argument("--model", choices=[*MODELS, "all"], default="all")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    for model in MODELS if args.model == "all" else [args.model]:
        shape = MODELS[model]
        files = {name: write_lora(args.work, name, model) for name in ADAPTERS}

        def logits_of(parts: list[tuple[str, float]], shape: Shape = shape, files: dict = files) -> np.ndarray:
            return llama_logits(args.models_dir / shape.file, ids, _with_adapters([(files[n], s) for n, s in parts]))

        ids = token_ids(TOKEN_SEED[model])
        write_fixture(FIXTURES, model, shape, ids, files, CASES, logits_of)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
