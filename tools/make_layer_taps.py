"""Make tests/fixtures/taps/*.npz: llama.cpp's own intermediate tensors, the truth for engine.ops.ggml.

Run with a Python that has llama-cpp-python (a development tool, never a runtime dependency), built from
its sdist for the AVX-512 machine the fixtures describe (see README.md, "Golden fixtures"):

    /path/to/llvenv/bin/python tools/make_layer_taps.py --models-dir DIR

For each catalog model and each KV-cache type (F32, F16) it tokenizes the start of tests/fixtures/prose.txt,
runs it in the batches of PHASES (a 4-token prefill, a 1-token decode, then, after 16 more tokens, a 2-token
chunk and another decode, so that the attention products see more keys than one 16-float lane holds), and
records the tensors of layer 0 and of one later layer through llama.cpp's eval callback (cb_eval: each graph node's
output after it is computed; for the attention products also their inputs, the K and V cache views, in
the cache's type). Saved per phase and layer, as `<phase>/<name>`:

- the F32 nodes of the layer that the op tests read, by llama.cpp's name (`norm-0`, `attn_norm-0`, `Qcur-0#1`
  for the second node of that name, ..., `l_out-0`), plus the layer's input (`l_out` of the layer before,
  or the embeddings), for the prefill with the F32 cache;
- `kq-<i>.src0` / `.src1` and `kqv-<i>.src0`: the operands of the two attention products as ggml hands
  them to mul_mat: K (Hkv, n_used, d), q (Hq, T, d), V^T (Hkv, d, n_used) in the cache's type, cut to
  the filled cells (the rest of the n_kv cells, `meta["n_kv"]`, are zeros); kqv's weights are kq_soft_max;
- for the decode step and for the F16 cache only the attention products (the other ops are the same);
- the norm weights of the layer (`weight/<tensor name>`), token ids, positions and hyper-parameters
  (`meta`, JSON).

Files are written compressed (each model and cache type one file, a few hundred KB).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "taps"
PROSE = ROOT / "tests" / "fixtures" / "prose.txt"
# (name, tokens) in order; None: run but not recorded. Positions follow one another from 0.
PHASES = (("prefill", 4), ("decode", 1), (None, 16), ("chunk", 2), ("decode_long", 1))
N_CTX = 512
MODELS = {  # key: (file, later layer)
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", 20),
    "gemma3": ("gemma-3-270m-q4_k_m.gguf", 5),
}
CACHE_TYPES = {"f32": 0, "f16": 1}
# what each run keeps, by llama.cpp's base name (the part before "-<layer>"); Qcur/Kcur are kept from their
# second node on (the first is the product's output, which the reshape that follows holds as well)
FULL = ("embd", "inp_scaled", "norm", "attn_norm", "Qcur", "Kcur", "Qcur_normed", "Kcur_normed", "kq", "kq_soft_max",
        "kqv", "attn_out", "ffn_inp", "sa_out", "attn_post_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_swiglu",
        "ffn_geglu", "ffn_out", "ffn_post_norm", "l_out")
ATTENTION = ("kq", "kq_soft_max", "kqv")  # the decode step and the F16 cache: the attention products only
GGML_TYPE_F32, GGML_TYPE_F16 = 0, 1


class _Tensor(ctypes.Structure):
    """struct ggml_tensor (ggml.h: GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10, GGML_MAX_NAME 64)."""


_Tensor._fields_ = [
    ("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
    ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(_Tensor) * 10), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
    ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64), ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8),
]


def _read(t: _Tensor) -> np.ndarray | None:
    """The logical contents of a host tensor (views and permutations resolved), F32 or F16; else None."""
    dtype = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16}.get(t.type)
    if dtype is None or not t.data:
        return None
    ne, nb = list(t.ne), list(t.nb)
    itemsize = np.dtype(dtype).itemsize
    span = sum((n - 1) * s for n, s in zip(ne, nb)) + itemsize
    flat = np.frombuffer((ctypes.c_char * span).from_address(t.data), dtype=dtype)
    view = np.lib.stride_tricks.as_strided(flat, shape=ne[::-1], strides=nb[::-1])
    return np.array(view)


class Recorder:
    """cb_eval callback: keeps the outputs of the nodes of the chosen layers, and the attention operands."""

    def __init__(self, layers: tuple[int, ...], keep_input_of: tuple[int, ...]):
        self.layers = {f"-{i}" for i in layers}
        self.inputs = {f"-{i - 1}" for i in keep_input_of if i > 0}
        self.got: dict[str, np.ndarray] = {}
        self.callback = self._make()

    def _wanted(self, name: str) -> bool:
        base = name.split(" ")[0]
        return any(base.endswith(s) for s in self.layers) or base in ("embd", "inp_embd", "inp_scaled") or \
            any(base == f"l_out{s}" for s in self.inputs)

    def _put(self, key: str, arr: np.ndarray) -> None:
        k, i = key, 0
        while k in self.got:
            i += 1
            k = f"{key}#{i}"
        self.got[k] = arr

    def _make(self):
        import llama_cpp

        @llama_cpp.ggml_backend_sched_eval_callback
        def cb(tp, ask, _user):
            t = ctypes.cast(tp, ctypes.POINTER(_Tensor)).contents
            name = t.name.decode()
            if ask:
                return True  # observe every node (each ends a split, so its inputs are still intact)
            if not self._wanted(name) or "(" in name:
                return True
            arr = _read(t)
            if arr is None:
                return True
            self._put(name, arr)
            if name.split("-")[0] in ("kq", "kqv"):
                for j in (0, 1):
                    src = t.src[j]
                    if src:
                        a = _read(src.contents)
                        if a is not None:
                            self.got[f"{name}.src{j}"] = a
            return True

        return cb


def _llama(path: Path, cache_type: int, callback):
    import llama_cpp
    import llama_cpp.llama as L
    from llama_cpp import Llama

    orig = llama_cpp.llama_context_default_params

    def patched():
        p = orig()
        p.cb_eval = callback
        return p

    llama_cpp.llama_context_default_params = patched
    L.llama_cpp.llama_context_default_params = patched
    try:
        return Llama(model_path=str(path), n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, logits_all=True, n_threads=2,
                     verbose=False, type_k=cache_type, type_v=cache_type)
    finally:
        llama_cpp.llama_context_default_params = orig
        L.llama_cpp.llama_context_default_params = orig


def _squeeze(a: np.ndarray) -> np.ndarray:
    """Drop ggml's ne3 (1 here): activations are (1, T, n) or (T, H, d), products (H, rows, cols)."""
    return a[0] if a.ndim == 4 and a.shape[0] == 1 else a


def _trim_cache_view(name: str, a: np.ndarray, n_used: int) -> np.ndarray:
    """The K view (Hkv, n_kv, d) or V^T view (Hkv, d, n_kv) cut to the n_used filled cells.

    The cells past them are the fresh cache's zeros (checked): the tests pad them back."""
    axis = 1 if name.startswith("kq-") else 2
    rest = np.take(a, np.arange(n_used, a.shape[axis]), axis=axis)
    if np.any(rest != 0):
        raise SystemExit(f"{name}: cache cells past {n_used} are not zero")
    return np.take(a, np.arange(n_used), axis=axis)


def _metadata(path: Path) -> dict:
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    arch = r.fields["general.architecture"].contents()
    md = {}
    for key in ("attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.freq_base_swa", "rope.dimension_count",
                "attention.key_length", "attention.head_count", "attention.head_count_kv", "embedding_length",
                "attention.sliding_window"):
        f = r.fields.get(f"{arch}.{key}")
        if f is not None:
            md[key] = f.contents()
    md["arch"] = arch
    weights = {t.name: np.array(t.data, dtype=np.float32).reshape(-1) for t in r.tensors
               if t.name.endswith("norm.weight")}
    return {"md": md, "weights": weights}


def tap(path: Path, later: int, cache: str, text: str) -> dict[str, np.ndarray]:
    layers = (0, later)
    rec = Recorder(layers, layers)
    llm = _llama(path, CACHE_TYPES[cache], rec.callback)
    n_total = sum(n for _, n in PHASES)
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)[:n_total]
    out: dict[str, np.ndarray] = {}
    llm.reset()
    n_kv = {}
    starts, start = {}, 0
    for phase, count in PHASES:
        rec.got = {}
        llm.eval(ids[start : start + count])
        if phase is not None:
            starts[phase] = [start, count]
        start += count
        n_used = llm.n_tokens
        if phase is None:
            continue
        keep = FULL if (phase == "prefill" and cache == "f32") else ATTENTION
        for name, arr in rec.got.items():
            base = name.rsplit("-", 1)[0]
            if base not in keep or (base in ("Qcur", "Kcur") and "#" not in name):
                continue
            arr = _squeeze(arr)
            if name.endswith(".src0"):
                n_kv[phase] = arr.shape[1] if name.startswith("kq-") else arr.shape[2]
                arr = _trim_cache_view(name, arr, n_used)
            if name.startswith("kqv-") and name.endswith(".src1"):
                soft = rec.got.get(name.replace("kqv-", "kq_soft_max-").replace(".src1", ""))
                if soft is not None and np.array_equal(_squeeze(soft), arr):
                    continue  # the softmax output itself
            out[f"{phase}/{name}"] = arr
    info = _metadata(path)
    for name, w in info["weights"].items():
        if any(name.startswith(f"blk.{i}.") for i in layers) or name == "output_norm.weight":
            out[f"weight/{name}"] = w
    meta = {"model": path.name, "cache": cache, "ids": [int(i) for i in ids], "phases": starts, "n_ctx": N_CTX,
            "n_kv": n_kv,
            "layers": list(layers), "hparams": {k: (v if not isinstance(v, np.generic) else v.item())
                                                 for k, v in info["md"].items()}}
    import llama_cpp

    meta["llama_cpp_python"] = llama_cpp.__version__
    out["meta"] = np.array(json.dumps(meta))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-dir", required=True, type=Path)
    ap.add_argument("--isa", choices=("avx512", "avx2"), default="avx512",
                    help="the build the llama.cpp in use must be; avx2 writes tests/fixtures/taps_avx2 by default")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from tools.make_golden import check_isa

    check_isa(args.isa)
    args.out = args.out or (OUT if args.isa == "avx512" else OUT.with_name(f"taps_{args.isa}"))
    args.out.mkdir(parents=True, exist_ok=True)
    text = PROSE.read_text(encoding="utf-8")
    for key, (filename, later) in MODELS.items():
        path = args.models_dir / filename
        if not path.exists():
            print(f"skip {key}: {path} missing", file=sys.stderr)
            continue
        for cache in CACHE_TYPES:
            arrays = tap(path, later, cache, text)
            dest = args.out / f"{key}_{cache}.npz"
            np.savez_compressed(dest, **arrays)
            print(f"{dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}: {len(arrays)} arrays, "
                  f"{dest.stat().st_size / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
