"""Write a ~1.1B-parameter llama model in Q4_K_M with random weights (Llama-3.2-1B shapes), for the benchmarks.

Shapes as Llama 3.2 1B: dim 2048, 16 layers, 32 query / 8 KV heads of 64, FFN 8192, tied output (no
output.weight: the embedding table is the head). The vocabulary defaults to 49152 (1.07B parameters, a
638 MiB file, the model issue 12 measured); `--vocab 128256` gives Llama 3.2 1B's own (1.24B, 763 MiB).
Every tensor gets the type llama-quantize's Q4_K_M mix gives it (engine.quant.presets.choose_types: tied
embeddings Q6_K, attn_v and ffn_down Q6_K in half the layers, the rest Q4_K; norms F32).

Weights are normal * 0.02, norms 1 (not degenerate: activations and logits keep unit-order spread). They are
made and quantized a chunk of rows at a time on a few threads (seeded per chunk, so the file is the same
whatever the thread count) and written with the project's writer (engine.gguf.write_gguf). Quantization
uses ggml's own C quantizer through ctypes (`ggml_quantize_chunk` from llama-cpp-python's libggml-base)
when it is found, else the project's NumPy quantizers (engine.quant.quantize); without an importance
matrix both are quantize_row_*_ref, so the bytes are identical (`--check` verifies this on one chunk), and
the C one is about twice as fast and releases the GIL. About 2-4 minutes on 2 cores.

    .venv/bin/python benchmarks/synthetic_1b.py [OUT.gguf] [--vocab N] [--threads N] [--quantizer auto|ggml|numpy]

Without OUT it writes (or reuses) /tmp/gguf-lens-bench/llama-1.1b-q4_k_m-v{vocab}-s{seed}.gguf and prints
the path. The file is generated on the fly for a benchmark run and never committed.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_model import _vocab  # noqa: E402

from engine.gguf import GGUFValueType, write_gguf  # noqa: E402
from engine.quant import quantize  # noqa: E402
from engine.quant.presets import ModelShape, choose_types, preset_by_name  # noqa: E402
from engine.quant.types import TYPES, GGMLType  # noqa: E402

T = GGMLType
FORMAT = 2  # bump when the generated file changes, so a cached one is not reused
CHUNK_WEIGHTS = 4 << 20  # float32 weights made and quantized at a time per thread (16 MiB)
STD = 0.02
DEFAULT_DIR = Path(tempfile.gettempdir()) / "gguf-lens-bench"
LLAMA_LIB_GLOBS = (
    "/tmp/llvenv/lib/python3*/site-packages/llama_cpp/lib/libggml-base.so",
    str(Path(sys.prefix) / "lib/python3*/site-packages/llama_cpp/lib/libggml-base.so"),
)


@dataclass(frozen=True)
class Shape1B:
    dim: int = 2048
    hidden: int = 8192
    n_layers: int = 16
    n_heads: int = 32
    n_kv_heads: int = 8
    head_dim: int = 64
    n_vocab: int = 49152
    n_ctx: int = 8192  # the engine's memory preflight plans a KV cache for the trained context: keep it modest
    rope_base: float = 500000.0
    eps: float = 1e-5

    def matrices(self) -> list[tuple[str, int, int]]:
        """(name, n_in, n_out) of every matrix, in file order."""
        qd, kvd = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        out = [("token_embd.weight", self.dim, self.n_vocab)]
        for i in range(self.n_layers):
            b = f"blk.{i}."
            out += [(b + "attn_q.weight", self.dim, qd), (b + "attn_k.weight", self.dim, kvd),
                    (b + "attn_v.weight", self.dim, kvd), (b + "attn_output.weight", qd, self.dim),
                    (b + "ffn_gate.weight", self.dim, self.hidden), (b + "ffn_up.weight", self.dim, self.hidden),
                    (b + "ffn_down.weight", self.hidden, self.dim)]
        return out

    def n_params(self) -> int:
        return sum(a * b for _, a, b in self.matrices()) + self.dim * (2 * self.n_layers + 1)


def q4_k_m_types(s: Shape1B) -> dict[str, GGMLType]:
    """llama-quantize's Q4_K_M type for every matrix of the model (tied output: token_embd is the head)."""
    tensors: dict[str, tuple[tuple[int, ...], GGMLType]] = {n: ((a, b), T.F32) for n, a, b in s.matrices()}
    for i in range(s.n_layers):
        tensors[f"blk.{i}.attn_norm.weight"] = ((s.dim,), T.F32)
        tensors[f"blk.{i}.ffn_norm.weight"] = ((s.dim,), T.F32)
    tensors["output_norm.weight"] = ((s.dim,), T.F32)
    shape = ModelShape("llama", s.n_layers, s.n_heads, s.n_kv_heads)
    choice = choose_types(tensors, shape, preset_by_name("Q4_K_M"))
    return {n: choice[n].new for n, _, _ in s.matrices()}


class GgmlQuantizer:
    """ggml's quantize_row_*_ref through ggml_quantize_chunk (no importance matrix): C speed, GIL released."""

    def __init__(self, lib_path: str):
        lib = ctypes.CDLL(lib_path)
        self.fn = lib.ggml_quantize_chunk
        self.fn.restype = ctypes.c_size_t
        self.fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                            ctypes.c_int64, ctypes.c_void_p]
        self.path = lib_path

    def __call__(self, x: np.ndarray, qtype: GGMLType) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        rows, cols = x.shape
        out = np.empty((rows, TYPES[qtype].row_bytes(cols)), np.uint8)
        n = self.fn(int(qtype), x.ctypes.data, out.ctypes.data, 0, rows, cols, None)
        if n != out.nbytes:
            raise RuntimeError(f"ggml_quantize_chunk wrote {n} bytes, expected {out.nbytes}")
        return out


def find_ggml_lib(llama_python: str | None = None) -> str | None:
    globs = list(LLAMA_LIB_GLOBS)
    if llama_python:
        globs.insert(0, str(Path(llama_python).resolve().parents[1] / "lib/python3*/site-packages/llama_cpp/lib/libggml-base.so"))
    for g in globs:
        hits = sorted(glob.glob(g))
        if hits:
            return hits[0]
    return None


def make_quantizer(kind: str = "auto", llama_python: str | None = None) -> Any:
    """The quantizer to use: ggml's C one when found (kind auto|ggml), else engine.quant.quantize."""
    if kind in ("auto", "ggml"):
        lib = find_ggml_lib(llama_python)
        if lib is not None:
            return GgmlQuantizer(lib)
        if kind == "ggml":
            raise SystemExit("libggml-base.so (llama-cpp-python) not found; use --quantizer numpy")
    return quantize


def _chunk(seed: int, t_index: int, c_index: int, rows: int, cols: int) -> np.ndarray:
    rng = np.random.default_rng([seed, t_index, c_index])
    w = rng.standard_normal((rows, cols), dtype=np.float32)
    w *= np.float32(STD)
    return w


def _matrix(pool: ThreadPoolExecutor, quant: Any, seed: int, t_index: int, n_in: int, n_out: int,
            qtype: GGMLType) -> np.ndarray:
    """Random (n_out, n_in) weights quantized to qtype, made a chunk of rows at a time on the pool."""
    step = max(1, CHUNK_WEIGHTS // n_in)
    out = np.empty((n_out, TYPES[qtype].row_bytes(n_in)), np.uint8)

    def job(c: int) -> None:
        r0 = c * step
        r1 = min(n_out, r0 + step)
        out[r0:r1] = quant(_chunk(seed, t_index, c, r1 - r0, n_in), qtype)

    list(pool.map(job, range(-(-n_out // step))))
    return out


def write_1b(path: Path, s: Shape1B = Shape1B(), *, seed: int = 0, threads: int = 2, quantizer: Any = None,
             log: Any = None) -> Path:
    """Write the model to `path` (atomically, with engine.gguf.write_gguf)."""
    quant = quantizer if quantizer is not None else make_quantizer()
    say = log or (lambda msg: None)
    types = q4_k_m_types(s)
    tokens, token_types = _vocab(s.n_vocab)
    a = "llama"
    md: dict[str, Any] = {
        "general.architecture": a, "general.name": "synthetic llama 1.1B Q4_K_M", "general.file_type": 15,
        f"{a}.block_count": s.n_layers, f"{a}.context_length": s.n_ctx, f"{a}.embedding_length": s.dim,
        f"{a}.feed_forward_length": s.hidden, f"{a}.attention.head_count": s.n_heads,
        f"{a}.attention.head_count_kv": s.n_kv_heads, f"{a}.attention.key_length": s.head_dim,
        f"{a}.attention.value_length": s.head_dim, f"{a}.rope.dimension_count": s.head_dim,
        f"{a}.rope.freq_base": s.rope_base, f"{a}.attention.layer_norm_rms_epsilon": s.eps,
        f"{a}.vocab_size": s.n_vocab,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": token_types, "tokenizer.ggml.merges": ["Ġ t"],
        "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.add_bos_token": False,
    }
    # llama.cpp reads these as uint32 (convert_hf_to_gguf writes them so) and refuses an int32
    u32 = (GGUFValueType.UINT32, None)
    md_types = {k: u32 for k, v in md.items() if isinstance(v, int) and not isinstance(v, bool)}
    ones = np.ones(s.dim, np.float32)
    ts: list[tuple[str, GGMLType, tuple[int, ...], np.ndarray]] = []
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for idx, (name, n_in, n_out) in enumerate(s.matrices()):
            qt = types[name]
            ts.append((name, qt, (n_in, n_out), _matrix(pool, quant, seed, idx, n_in, n_out, qt)))
            if name == "token_embd.weight":
                ts.append(("output_norm.weight", T.F32, (s.dim,), ones))
            elif name.endswith("attn_q.weight"):
                ts.append((name.replace("attn_q", "attn_norm"), T.F32, (s.dim,), ones))
            elif name.endswith("ffn_gate.weight"):
                ts.append((name.replace("ffn_gate", "ffn_norm"), T.F32, (s.dim,), ones))
            if name.endswith("ffn_down.weight"):
                say(f"{name.split('.')[1]}/{s.n_layers - 1} layers  {time.perf_counter() - t0:.0f} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(path, md, ts, metadata_types=md_types)
    say(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB, {s.n_params() / 1e9:.3f}B parameters) "
        f"in {time.perf_counter() - t0:.0f} s")
    return path


def default_path(s: Shape1B = Shape1B(), seed: int = 0, folder: Path = DEFAULT_DIR) -> Path:
    return folder / f"llama-1.1b-q4_k_m-v{s.n_vocab}-s{seed}-f{FORMAT}.gguf"


def ensure_1b(path: Path | None = None, s: Shape1B = Shape1B(), *, seed: int = 0, threads: int = 2,
              quantizer: str = "auto", llama_python: str | None = None, log: Any = None) -> Path:
    """The model's path, written first unless a finished file is already there (the writer is atomic)."""
    path = path or default_path(s, seed)
    if path.exists():
        return path
    return write_1b(path, s, seed=seed, threads=threads, quantizer=make_quantizer(quantizer, llama_python), log=log)


def check_quantizers(llama_python: str | None = None) -> bool:
    """ggml's C quantizer and engine.quant.quantize give the same bytes on a chunk of each type used."""
    lib = find_ggml_lib(llama_python)
    if lib is None:
        print("ggml quantizer not found: nothing to compare")
        return True
    g = GgmlQuantizer(lib)
    same = True
    for qt in (T.Q4_K, T.Q6_K):
        x = _chunk(0, 0, 0, 64, 2048)
        ok = np.array_equal(g(x, qt), quantize(x, qt))
        print(f"{qt.name}: ggml_quantize_chunk == engine.quant.quantize: {ok}")
        same &= ok
    return same


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", type=Path, help=f"output file (default under {DEFAULT_DIR}, reused)")
    ap.add_argument("--vocab", type=int, default=Shape1B.n_vocab)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--quantizer", choices=["auto", "ggml", "numpy"], default="auto")
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON"))
    ap.add_argument("--force", action="store_true", help="write even if the file exists")
    ap.add_argument("--check", action="store_true", help="compare the two quantizers on one chunk and exit")
    args = ap.parse_args(argv)
    if args.check:
        return 0 if check_quantizers(args.llama_python) else 1
    s = Shape1B(n_vocab=args.vocab)
    path = args.out or default_path(s, args.seed)
    if args.force and path.exists():
        path.unlink()
    path = ensure_1b(path, s, seed=args.seed, threads=args.threads, quantizer=args.quantizer,
                     llama_python=args.llama_python, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
