"""Make the flash-attention fixtures: llama.cpp's logits with flash attention on, and off, over the same batches.

llama-cli and llama-server attend with flash attention by default (`-fa auto` resolves to on for the CPU), and
ggml_flash_attn_ext's CPU kernels round and sum differently from the mul_mat / soft_max graph the other goldens
hold. Run with the development Python that has llama-cpp-python (README.md, "Golden fixtures"):

    /tmp/llvenv/bin/python tools/make_flash_fixtures.py [--models-dir ~/.cache/gguf-lens/models] [--work DIR]
    /tmp/llvenv/bin/python tools/make_flash_fixtures.py --kv q8_0     # and --kv q4_0: a quantized K and V cache
    /tmp/llvenv2/bin/python tools/make_flash_fixtures.py --isa avx2   # an AVX2-only build: NAME_avx2.*

Every model runs its tokens as llama.cpp would see a short prompt, a long one and then a reply, so each of the
CPU kernel's paths is in the fixture: PHASES[0] tokens as one batch (under 64 queries: the one-row kernel with
Q in fp16 and an fp16 accumulator), PHASES[1] more as a second batch (64 queries or more: the tiled kernel with
Q in float32), then one token per step (the one-row kernel while the cache holds up to 256 cells; past that n_kv
is 512 and one token takes the split-KV path, one chunk of cells per thread: its bits depend on --threads, kept in
the JSON). The random-weight models stop at 200 tokens, the real ones run the whole prose (330-333 tokens).

Models: SmolLM2 and Gemma 3 (the golden files, over tests/fixtures/prose.txt from its first token), and small
random-weight files built in code (tools/make_arch_models.py's builder and ids; Q8_0, quantized by llama.cpp; the
suite requantizes our writer's file byte for byte: the sha256 says so): `llama3` (GQA 4:1), `gemma2` (soft-cap 50,
window 32) and `gemma3_swa` (RANDOM: window 16, head_dim 80). Per model, tests/fixtures/flash/NAME.npz holds
for each of flash on and off the top-K ids and their raw float32 logits per position (compact, and compared bit
for bit), and NAME.json how far apart
llama.cpp's two runs are over the whole vocabulary (mean KLD, same top token, perplexity of each). With --isa avx2
the same from a llama-cpp-python built with the AVX2 flags only (checked from its system info): NAME_avx2.npz and
.json (NAME.kv_TYPE_avx2.* with --kv), the AVX2 build's order (vec_dot_f16's 4 x 8 lanes, the 8-wide softmax chunks).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.gguf import write_gguf  # noqa: E402
from tools.make_arch_models import SPECS, U32, ArchSpec, build_spec, quantize_llama_cpp, sha256_file  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "flash"
PHASES = (40, 100)  # the first batch (one-row kernel), the second (tiled kernel); the rest one token per step
N_CTX = 1024
TOP_K = 32
REAL = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
N_RANDOM = 200  # tokens the random-weight models run (tools.make_arch_models.token_ids)
# Gemma 3: q/k norms, post-norms, a window of 16 on layers 0-4 (layer 5 global), head_dim 80 (the fp16
# accumulator's and vec_dot_f16's scalar tails past the 64-wide steps)
RANDOM = {"llama3": SPECS["llama3"], "gemma2": SPECS["gemma2"],
          "gemma3_swa": ArchSpec("gemma3", n_heads=4, n_kv_heads=2, head_dim=80, n_layers=6,
                                 extras=("qk_norm", "post_norms"), logit_std=1.6,
                                 metadata={"attention.sliding_window": U32(16)})}
SEED = 1234
Q8_0_FTYPE = 7
KV_TYPES = {"q8_0": 8, "q4_0": 2}  # --kv: GGML_TYPE_* of a quantized K and V cache (llama.cpp needs flash for V)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))


def write_random(path: Path, name: str) -> Path:
    """Random-weight model `name` of RANDOM (F32 weights, tools.make_arch_models' seed) written to `path`."""
    md, ts = build_spec(RANDOM[name], SEED)
    write_gguf(path, md, ts)
    return path


def run(path: Path, ids: list[int], flash: bool, threads: int, kv: str = "f16") -> np.ndarray:
    """llama.cpp's logits at every position, an F16 KV cache (or `kv`'s type for K and V), in PHASES' batches then
    one token per step."""
    from llama_cpp import Llama  # noqa: PLC0415 - the development venv only

    types = {} if kv == "f16" else {"type_k": KV_TYPES[kv], "type_v": KV_TYPES[kv]}
    llm = Llama(model_path=str(path), n_ctx=N_CTX, n_batch=512, n_ubatch=512, logits_all=True, n_threads=threads,
                verbose=False, flash_attn=flash, **types)
    llm.reset()
    first, second = PHASES
    llm.eval(ids[:first])
    llm.eval(ids[first : first + second])
    for tok in ids[first + second :]:
        llm.eval([tok])
    out = np.array(llm.scores[: len(ids)], dtype=np.float32)
    del llm
    return out


def difference(ids: list[int], on: np.ndarray, off: np.ndarray) -> dict[str, float]:
    """Flash against non-flash over the whole vocabulary: KL(off || on) mean, same top token, both perplexities."""
    lp_on, lp_off = log_softmax(on), log_softmax(off)
    kl = (np.exp(lp_off) * (lp_off - lp_on)).sum(-1)
    nxt = np.arange(len(ids) - 1), np.asarray(ids[1:])
    return {"kld_mean": float(kl.mean()), "same_top": float((on.argmax(-1) == off.argmax(-1)).mean()),
            "ppl_flash": math.exp(float(-lp_on[nxt].mean())), "ppl_no_flash": math.exp(float(-lp_off[nxt].mean()))}


def model_files(args: argparse.Namespace) -> list[tuple[str, Path, list[int], dict[str, Any]]]:
    """(name, file, ids, what to record about the file) for every model whose file is at hand."""
    from gguf import GGUFReader  # noqa: PLC0415
    from llama_cpp import Llama  # noqa: PLC0415

    from tools.make_arch_models import token_ids  # noqa: PLC0415

    out = []
    prose = (ROOT / "tests" / "fixtures" / "prose.txt").read_text(encoding="utf-8")
    for name, filename in REAL.items():
        path = args.models_dir / filename
        if not path.exists():
            print(f"skip {name}: {path} missing", file=sys.stderr)
            continue
        add_bos = bool(GGUFReader(str(path)).fields["tokenizer.ggml.add_bos_token"].contents())
        vocab = Llama(model_path=str(path), vocab_only=True, verbose=False)
        ids = vocab.tokenize(prose.encode("utf-8"), add_bos=add_bos, special=False)
        del vocab
        out.append((name, path, ids, {"model": filename, "add_bos": add_bos}))
    for name in RANDOM:
        base = write_random(args.work / f"{name}.F32.gguf", name)
        path = args.work / f"{name}.Q8_0.gguf"
        quantize_llama_cpp(base, path, Q8_0_FTYPE)
        out.append((name, path, token_ids()[:N_RANDOM], {"quant": "Q8_0", "seed": SEED, "sha256": sha256_file(path)}))
    return out


def write_kv_fixture(name: str, path: Path, ids: list[int], about: dict[str, Any], args: argparse.Namespace,
                     suffix: str = "") -> None:
    """FIXTURES/NAME.kv_TYPE.npz: the top-K ids and raw logits of llama.cpp with flash attention over a quantized K
    and V cache (every batch takes ggml's one-row kernel: Q converted to K's vec_dot type, V rows to float); the
    JSON: how far that run is from the F16 cache's (`difference`, with 'flash' the quantized cache)."""
    import llama_cpp  # noqa: PLC0415

    quant, f16 = run(path, ids, True, args.threads, args.kv), run(path, ids, True, args.threads)
    top = np.argsort(-quant, axis=-1, kind="stable")[:, :TOP_K]
    np.savez_compressed(FIXTURES / f"{name}.kv_{args.kv}{suffix}.npz", ids=np.asarray(ids, np.int32),
                        top_ids=top.astype(np.int32), top_logits=np.take_along_axis(quant, top, axis=-1))
    summary = {"name": name, **about, "kv": args.kv, "llama_cpp_python": llama_cpp.__version__, "n_ctx": N_CTX,
               "phases": list(PHASES), "n_tokens": len(ids), "top_k": TOP_K, "threads": args.threads,
               "system_info": llama_cpp.llama_print_system_info().decode().strip(),
               "against_f16_cache": difference(ids, quant, f16)}
    (FIXTURES / f"{name}.kv_{args.kv}{suffix}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(name, args.kv, json.dumps(summary["against_f16_cache"]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-dir", type=Path, default=Path.home() / ".cache" / "gguf-lens" / "models")
    ap.add_argument("--work", type=Path, default=Path("/tmp/flash_models"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv", default="f16", choices=["f16", *KV_TYPES], help="q8_0 / q4_0: flash attention over a K "
                    "and V cache of that type (FIXTURES/NAME.kv_TYPE.*), compared with the F16 cache's flash run")
    ap.add_argument("--isa", default="native", choices=["native", "avx2"], help="avx2: this Python's llama.cpp must be "
                    "an AVX2-only build; the fixtures are NAME_avx2.*")
    ap.add_argument("names", nargs="*", help="only these models (default: all)")
    args = ap.parse_args()
    suffix = "_avx2" if args.isa == "avx2" else ""
    if args.isa == "avx2":
        import llama_cpp  # noqa: PLC0415

        info = llama_cpp.llama_print_system_info().decode()
        if "AVX2 = 1" not in info or "AVX512" in info:
            raise SystemExit("--isa avx2 needs a llama-cpp-python built with the AVX2 flags only")
    args.work.mkdir(parents=True, exist_ok=True)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    import llama_cpp  # noqa: PLC0415

    for name, path, ids, about in model_files(args):
        if args.names and name not in args.names:
            continue
        if args.kv != "f16":
            try:
                write_kv_fixture(name, path, ids, about, args, suffix)
            except ValueError as e:  # a head size that is not a whole number of the type's blocks (gemma3_swa: 80)
                print(f"skip {name} --kv {args.kv}: llama.cpp refuses the context ({e})", file=sys.stderr)
            continue
        out: dict[str, np.ndarray] = {"ids": np.asarray(ids, np.int32)}
        logits = {}
        for tag, flash in (("flash", True), ("no_flash", False)):
            logits[tag] = run(path, ids, flash, args.threads)
            top = np.argsort(-logits[tag], axis=-1, kind="stable")[:, :TOP_K]
            out[f"{tag}_top_ids"] = top.astype(np.int32)
            out[f"{tag}_top_logits"] = np.take_along_axis(logits[tag], top, axis=-1)
        summary = {"name": name, **about, "llama_cpp_python": llama_cpp.__version__, "n_ctx": N_CTX,
                   "phases": list(PHASES), "n_tokens": len(ids), "top_k": TOP_K, "threads": args.threads,
                   "system_info": llama_cpp.llama_print_system_info().decode().strip(),
                   **difference(ids, logits["flash"], logits["no_flash"])}
        np.savez_compressed(FIXTURES / f"{name}{suffix}.npz", **out)
        (FIXTURES / f"{name}{suffix}.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(name, json.dumps({k: v for k, v in summary.items() if k != "system_info"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
