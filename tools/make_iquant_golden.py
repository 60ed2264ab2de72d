"""SmolLM2 requantized by llama.cpp to IQ4_NL, IQ4_XS and IQ3_S, and llama.cpp's logits on those files.

GGUF Lens reads the i-quants but cannot write them, and the files (~80-100 MB each) are too big to commit, so
this tool makes them with llama.cpp (llama_model_quantize, --allow-requantize from the catalog's Q4_1 file,
no importance matrix) into a folder outside the repository, and commits only llama.cpp's answer on them:
the top-K log-probabilities at the first POSITIONS tokens of tests/fixtures/prose.txt (F16 KV cache, the
default), for tests/engine/test_iquant_golden.py, which skips while the requantized files are absent. Each file
runs twice, as llama.cpp runs it by default (IQ4_NL weights with rows in eights repacked to iq4_nl_8x8): in one
batch (the other i-quants then take the tiled path from 8 rows) and one token per decode (vec_dot, or the
repacked gemv), the first TOKEN_POSITIONS tokens.

SmolLM2's width 576 is not a multiple of 256, so llama.cpp gives every tensor whose rows are 576 long a
fallback type (IQ4_XS and IQ3_S -> IQ4_NL, tensor_type_fallback in llama-quant.cpp) and picks its own
types for the embedding; the tensor types of each file are recorded in the JSON.

Writes tests/fixtures/golden_iquants.npz (<T>_top_ids, <T>_top_logp, <T>_tokens_top_ids, <T>_tokens_top_logp,
ids) and golden_iquants.json.

  /tmp/llvenv/bin/python tools/make_iquant_golden.py --models-dir ~/.cache/gguf-lens/models [--out-dir DIR]
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import make_golden
from make_golden import GGML_TYPE_F16, log_softmax

FIXTURES = ROOT / "tests" / "fixtures"
SOURCE = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT_DIR = Path("/tmp/gguf-lens-iquants")  # tests/engine/test_iquant_golden.py looks here (or GGUF_LENS_IQUANT_DIR)
FTYPES = {"IQ4_NL": 25, "IQ4_XS": 30, "IQ3_S": 26}  # LLAMA_FTYPE_MOSTLY_* in llama.h
POSITIONS = 128
TOP_K = 32
TOKEN_POSITIONS = 32  # token by token: the first 32 positions


def requantized_name(type_name: str) -> str:
    return f"SmolLM2-135M-Instruct.{type_name}.gguf"


def quantize(src: Path, dst: Path, ftype: int, threads: int) -> None:
    """llama-quantize --allow-requantize SRC DST TYPE, through the llama-cpp-python low-level API."""
    import llama_cpp  # a development tool only

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed ({rc}) for {dst.name}")


def run(path: Path, text: str, *, one_token: bool, threads: int) -> tuple[list[int], np.ndarray]:
    """llama.cpp's logits: make_golden.run (one batch), or one token per decode (n_batch = 1)."""
    if not one_token:
        return make_golden.run(path, text, True, GGML_TYPE_F16, threads)
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=1024, n_batch=1, n_ubatch=1, logits_all=True, n_threads=threads,
                verbose=False, type_k=GGML_TYPE_F16, type_v=GGML_TYPE_F16)
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)[:TOKEN_POSITIONS]
    llm.reset()
    llm.eval(ids)  # one activation row per product: vec_dot, or the repacked gemv for IQ4_NL rows in eights
    return ids, np.array(llm.scores[: len(ids)], dtype=np.float32)


def top_k(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    logp = log_softmax(logits)
    top = np.argsort(-logp, axis=-1, kind="stable")[:, :TOP_K]
    return top.astype(np.int32), np.take_along_axis(logp, top, axis=-1).astype(np.float32)


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each ggml type the file holds, and which types the 576-wide rows got."""
    from gguf import GGUFReader

    counts: collections.Counter[str] = collections.Counter()
    by_role: dict[str, str] = {}
    for t in GGUFReader(str(path)).tensors:
        name = t.tensor_type.name
        counts[name] += 1
        role = t.name.split(".", 2)[-1] if t.name.startswith("blk.") else t.name
        by_role.setdefault(role, name)
    return {"counts": dict(counts), "layer_0_or_global": by_role}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", required=True, type=Path, help="the folder with " + SOURCE)
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR, help="where the requantized files go")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    src = args.models_dir / SOURCE
    if not src.exists():
        raise SystemExit(f"{src} missing (gguf-lens fetch smollm2-135m-instruct)")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    text = (FIXTURES / "prose.txt").read_text(encoding="utf-8")
    out: dict[str, np.ndarray] = {}
    summary: dict[str, object] = {"source": SOURCE, "positions": POSITIONS, "token_positions": TOKEN_POSITIONS,
                                  "top_k": TOP_K, "kv_cache": "f16",
                                  "script": "tools/make_iquant_golden.py", "files": {}}
    for type_name, ftype in FTYPES.items():
        dst = args.out_dir / requantized_name(type_name)
        if not dst.exists() or dst.stat().st_mtime < src.stat().st_mtime:
            quantize(src, dst, ftype, args.threads)
        ids, logits = run(dst, text, one_token=False, threads=args.threads)
        ids, logits = ids[:POSITIONS], logits[:POSITIONS]
        out["ids"] = np.asarray(ids, np.int32)
        out[f"{type_name}_top_ids"], out[f"{type_name}_top_logp"] = top_k(logits)
        ids1, logits1 = run(dst, text, one_token=True, threads=args.threads)
        assert ids1 == ids[:TOKEN_POSITIONS], "the two runs tokenized the prose differently"
        out[f"{type_name}_tokens_top_ids"], out[f"{type_name}_tokens_top_logp"] = top_k(logits1)
        logp = log_softmax(logits)
        nll = -logp[np.arange(len(ids) - 1), np.asarray(ids[1:])]
        summary["files"][type_name] = {"file": dst.name, "bytes": dst.stat().st_size,
                                       "ppl": math.exp(float(nll.mean())), **tensor_types(dst)}
        print(type_name, json.dumps(summary["files"][type_name]))
    np.savez_compressed(FIXTURES / "golden_iquants.npz", **out)
    (FIXTURES / "golden_iquants.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{(FIXTURES / 'golden_iquants.npz').stat().st_size / 1e3:.0f} kB in tests/fixtures/golden_iquants.npz")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
