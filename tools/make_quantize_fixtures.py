"""What llama-quantize writes for each preset, for tests/engine/test_presets.py and test_requantize.py.

Runs llama.cpp's own llama_model_quantize (allow_requantize = true, no imatrix, nthread = 2)
through llama-cpp-python's low-level bindings on the two test models and on a tiny model with a
separate output.weight built in code (build_tiny_untied), for every preset and for
a few `--tensor-type` rule sets, and records for each output file:
  - the type of every tensor, in the order llama.cpp wrote them, and a sha256 prefix of its
    bytes (stored once per model for each (tensor, type): the same type gives the same bytes),
  - general.file_type, the metadata keys in order, the sha256 of the whole file,
  - how long llama_model_quantize took (wall seconds, nthread = 2).
The result is tests/fixtures/quantize_presets.json (hashes only, no tensor data).

Run with a Python that has llama-cpp-python (built from source) installed:
  /work/llvenv/bin/python tools/make_quantize_fixtures.py [--models-dir DIR] [--presets Q4_K_M,Q8_0]
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.gguf import open_gguf  # noqa: E402
from engine.quant.types import GGMLType  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "quantize_presets.json"
MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
    "tiny_untied": None,  # built in code by build_tiny_untied: a separate output.weight, 256-wide rows
}
# llama_ftype ids, from enum llama_ftype in llama.h (kept here so the fixture checks presets.py)
FTYPES = {
    "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
    "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15,
    "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "BF16": 32, "IQ4_NL": 25, "IQ4_XS": 30,
}
# `--tensor-type` cases: (name, preset, [(pattern, type), ...]) in the order given on the command line
RULE_CASES = [
    ("q4km_v_q8", "Q4_K_M", [("attn_v", "Q8_0")]),
    ("q4km_first_match", "Q4_K_M", [(r"blk\.1[0-9]\.", "Q2_K"), ("attn_v", "Q5_K"), ("ffn_down", "Q3_K")]),
    ("q8_ffn", "Q8_0", [("ffn_down", "Q6_K"), ("ffn", "Q4_K")]),
    ("q4_0_all_q2k", "Q4_0", [(".*", "Q2_K")]),
    ("q6k_embd", "Q6_K", [("token_embd", "Q4_0"), (r"blk\.[0-4]\.attn_v", "Q4_1")]),
    # overridden tensors do not advance the mix's attn_v / ffn_down counters
    ("q4km_partial", "Q4_K_M", [(r"blk\.[0-9]\.attn_v", "Q8_0"), (r"blk\.[0-9]\.ffn_down", "Q8_0")]),
]


def build_tiny_untied(path: Path) -> Path:
    """A tiny random llama (8 layers, 256 wide, F16, untied output) that llama.cpp's loader accepts."""
    import numpy as np  # noqa: PLC0415

    from tests.tiny_models import make_tiny_llama  # noqa: PLC0415

    dims = {"block_count": 8, "context_length": 256, "embedding_length": 256, "feed_forward_length": 512,
            "attention.head_count": 4, "attention.head_count_kv": 1, "rope.dimension_count": 64}
    u32 = {f"llama.{k}": np.uint32(v) for k, v in dims.items()}  # llama.cpp wants these as uint32
    u32 |= {"tokenizer.ggml.bos_token_id": np.uint32(0), "tokenizer.ggml.eos_token_id": np.uint32(2)}
    return make_tiny_llama(path, n_layers=8, dim=256, n_heads=4, n_kv_heads=1, hidden=512, n_ctx=256,
                           qtype=GGMLType.F16, seed=5, tied=False, overrides=u32)


class TensorOverride(ctypes.Structure):
    """struct llama_model_tensor_override { const char * pattern; enum ggml_type type; }."""

    _fields_ = [("pattern", ctypes.c_char_p), ("type", ctypes.c_int)]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def describe(path: Path) -> dict[str, object]:
    """Types, tensor hashes and metadata of a GGUF file llama.cpp wrote."""
    with open_gguf(path) as g:
        names = list(g.tensors)
        return {
            "tensors": names,
            "types": " ".join(g.tensors[n].qtype.name for n in names),
            "hashes": {n: hashlib.sha256(g.raw(n).tobytes()).hexdigest()[:16] for n in names},
            "file_type": int(g.metadata["general.file_type"]),  # type: ignore[call-overload]
            "file_type_vtype": g.metadata_types["general.file_type"][0].name,
            "quantization_version": int(g.metadata["general.quantization_version"]),  # type: ignore[call-overload]
            "metadata_keys": list(g.metadata),
            "alignment": g.alignment,
            "file_sha256": sha256_file(path),
        }


def quantize(llama_cpp, src: Path, dst: Path, ftype: int, rules: list[tuple[str, str]], nthread: int) -> float:
    """Run llama_model_quantize; returns its wall time in seconds."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = nthread
    params.ftype = ftype
    params.allow_requantize = True
    keep = None
    if rules:
        arr = (TensorOverride * (len(rules) + 1))()
        for i, (pattern, tname) in enumerate(rules):
            arr[i].pattern = pattern.encode()
            arr[i].type = int(GGMLType[tname])
        arr[len(rules)].pattern = None
        keep = arr
        params.tt_overrides = ctypes.cast(arr, type(params.tt_overrides))
    t0 = time.perf_counter()
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    dt = time.perf_counter() - t0
    del keep
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed ({rc}) for {src.name} ftype {ftype} rules {rules}")
    return dt


def silence_llama(llama_cpp) -> object:
    """Drop llama.cpp's log lines (hundreds per file)."""
    cb_type = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    cb = cb_type(lambda level, text, user: None)
    llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))
    return cb


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models-dir", default=os.environ.get("GGUF_LENS_MODELS_DIR", "/work/models"))
    ap.add_argument("--presets", default=",".join(FTYPES), help="comma-separated preset names")
    ap.add_argument("--nthread", type=int, default=2)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    import llama_cpp  # noqa: PLC0415 - only this tool needs it

    cb = silence_llama(llama_cpp)
    version = next((p.name for p in Path(llama_cpp.__file__).parent.parent.glob("llama_cpp_python-*.dist-info")), "?")
    result: dict[str, object] = {
        "source": f"llama_model_quantize from {version.removesuffix('.dist-info')}, allow_requantize, "
                  f"no imatrix, nthread={args.nthread}",
        "ftypes": {k: FTYPES[k] for k in args.presets.split(",")},
        "models": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        out_path = Path(tmp) / "out.gguf"
        for key, fname in MODELS.items():
            src = Path(args.models_dir) / fname if fname else build_tiny_untied(Path(tmp) / f"{key}.gguf")
            entry: dict[str, object] = {"file": fname, "source_sha256": sha256_file(src), "presets": {}, "rules": {}}
            for preset in args.presets.split(","):
                dt = quantize(llama_cpp, src, out_path, FTYPES[preset], [], args.nthread)
                entry["presets"][preset] = describe(out_path) | {"llama_seconds": round(dt, 3)}  # type: ignore[index]
                print(f"{key} {preset}: {dt:.2f} s", file=sys.stderr)
            for name, preset, rules in RULE_CASES:
                dt = quantize(llama_cpp, src, out_path, FTYPES[preset], rules, args.nthread)
                entry["rules"][name] = describe(out_path) | {  # type: ignore[index]
                    "preset": preset, "rules": [f"{p}={t}" for p, t in rules], "llama_seconds": round(dt, 3)}
                print(f"{key} {name}: {dt:.2f} s", file=sys.stderr)
            result["models"][key] = compact(entry)  # type: ignore[index]
    del cb
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def compact(entry: dict[str, object]) -> dict[str, object]:
    """Store the tensor order and metadata keys once per model, and each tensor's hash once per type."""
    outs = list(entry["presets"].values()) + list(entry["rules"].values())  # type: ignore[union-attr]
    for field in ("tensors", "metadata_keys"):
        first = outs[0][field]
        if any(o[field] != first for o in outs):
            raise SystemExit(f"llama.cpp wrote a different {field} list for different presets")
        entry[field] = first
        for o in outs:
            del o[field]
    hashes: dict[str, dict[str, str]] = {}
    for o in outs:
        for name, qtype in zip(entry["tensors"], o["types"].split()):  # type: ignore[union-attr]
            known = hashes.setdefault(name, {}).setdefault(qtype, o["hashes"][name])
            if known != o["hashes"][name]:
                raise SystemExit(f"{name} as {qtype} came out different in two runs")
        del o["hashes"]
    entry["hashes"] = hashes  # {tensor: {type: sha256 prefix of its bytes}}
    return entry


if __name__ == "__main__":
    raise SystemExit(main())
