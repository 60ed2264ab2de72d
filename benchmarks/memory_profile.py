"""Where a model's resident memory goes: RSS after each stage of loading and running it, anonymous vs file-backed.

    .venv/bin/python benchmarks/memory_profile.py [MODEL] [-p 128] [-n 32] [--try CHANGE ...] [--json]

MODEL is a catalog name or a .gguf path (default smollm2-135m-instruct). Stages, each measured in this one
process from /proc/self/smaps_rollup (Rss split into Anonymous and file-backed) and /proc/self/status (VmHWM,
the peak so far, which is what `gguf-lens bench` reports as peak_rss_mb):

  python          the bare interpreter
  numpy           import numpy
  numba           import numba + llvmlite (the JIT's Python modules and libllvmlite's pages)
  kernel modules  engine.kernels' modules, as dispatch imports them
  warm_up         the model's kernels compiled or loaded from numba's cache (dispatch.warm_up)
  load_model      engine.model.load_model(path), split by its progress steps (header + metadata, tokenizer,
                  weights, kernels)
  first token     the first forward of one token: builds the BlockProducts (the repacked legacy-type copies,
                  the fused q/k/v and gate/up stacks)
  prefill         a forward of -p random tokens (tile dequantization + BLAS)
  decode          -n greedy steps

After the stages it lists the largest mappings (the GGUF file, libraries, anonymous memory) and what the
model's own arrays hold (repacked weights, raw copies, KV cache).

--try applies a proposed change to this process only (monkeypatches here, no shared file is edited), so
its saving is measured against a plain run of the same command:

  trim         engine.kernels.pages.trim_heap (glibc's malloc_trim) after the load and after the first token
  lazy-kernels import only the kernel modules the model's weight types use

What the engine itself does (measured with this script, 2026-12-04): a legacy quant's GGUF blocks leave the process
after each batch that read them (one-row products read the repacked planes), a tied model's embedding look-ups read
the output head's repacked copy, and LLVM's code pages go once the kernels are loaded, before the copies are made
(engine.kernels.pages, engine.runtime.warmup).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

T0 = time.perf_counter()
MIB = 1 << 20


def _kib_fields(path: str, keys: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    with open(path) as f:
        for line in f:
            k, _, rest = line.partition(":")
            if k in keys:
                out[k] = int(rest.split()[0]) / 1024
    return out


def snapshot() -> dict[str, float]:
    """RSS, anonymous, file-backed and the peak so far, in MiB."""
    r = _kib_fields("/proc/self/smaps_rollup", ("Rss", "Anonymous", "Shmem", "Pss_File"))
    s = _kib_fields("/proc/self/status", ("VmHWM", "VmRSS"))
    return {"rss": r["Rss"], "anon": r["Anonymous"], "file": r["Rss"] - r["Anonymous"] - r.get("Shmem", 0.0),
            "peak": s["VmHWM"]}


def mappings(top: int = 12) -> list[tuple[str, float, float]]:
    """(mapping, Rss MiB, Anonymous MiB) of the largest mappings, grouped by file (anonymous ones together)."""
    groups: dict[str, list[float]] = {}
    name = "?"
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=5)
            if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
                name = head[5].strip() if len(head) > 5 else "[anonymous]"
                if name.startswith("/"):
                    parts = Path(name).parts
                    name = "/".join(parts[-3:]) if "site-packages" in name else name
            elif head and head[0] in ("Rss:", "Anonymous:"):
                g = groups.setdefault(name, [0.0, 0.0])
                g[0 if head[0] == "Rss:" else 1] += int(head[1]) / 1024
    rows = sorted(((k, v[0], v[1]) for k, v in groups.items()), key=lambda r: -r[1])
    return rows[:top]


class Report:
    def __init__(self, as_json: bool):
        self.rows: list[dict[str, Any]] = []
        self.prev: dict[str, float] | None = None
        self.as_json = as_json
        if not as_json:
            print(f"{'stage':44s} {'rss':>7s} {'anon':>7s} {'file':>7s} {'peak':>7s}  {'d rss':>7s} {'d anon':>7s} "
                  f"{'d file':>7s}  {'s':>6s}   (MiB)")

    def mark(self, stage: str) -> None:
        gc.collect()
        s = snapshot()
        d = {k: s[k] - (self.prev or {k: 0.0})[k] for k in s}
        self.prev = s
        row = {"stage": stage, **{k: round(v, 1) for k, v in s.items()}, "t_s": round(time.perf_counter() - T0, 2)}
        self.rows.append(row)
        if not self.as_json:
            print(f"{stage:44s} {s['rss']:7.1f} {s['anon']:7.1f} {s['file']:7.1f} {s['peak']:7.1f}  {d['rss']:+7.1f} "
                  f"{d['anon']:+7.1f} {d['file']:+7.1f}  {row['t_s']:6.1f}", flush=True)


# ---- the proposed changes, applied to this process only


def try_lazy_kernels(model_path: str) -> None:
    """The change for dispatch._find_kernels: import only the modules with the kernels of the model's types."""
    import pkgutil  # noqa: PLC0415

    import engine.kernels as pkg  # noqa: PLC0415
    from engine.gguf import open_gguf  # noqa: PLC0415
    from engine.quant.types import GGMLType  # noqa: PLC0415

    with open_gguf(model_path) as g:
        kinds = {GGMLType(t.qtype) for t in g.tensors.values()}
    legacy = {GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0}
    floats = {GGMLType.F16, GGMLType.BF16}
    k = {GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K}
    want = {"activations", "simd", "q8k"}
    if kinds & legacy:
        want |= {"legacy", "legacy_dot", "legacy_dequant", "legacy_products", "legacy_repack"}
    if kinds & (floats | {GGMLType.F32}):
        want |= {"legacy_floats"}
    if kinds & k:
        want |= {"kquants", "kquant_dot", "kquant_dequant", "kquant_lanes"}
    real = pkgutil.iter_modules

    def only_needed(path=None, prefix=""):  # type: ignore[no-untyped-def]
        for m in real(path, prefix):
            if path != pkg.__path__ or m.name in want or m.name.endswith("_ref"):
                yield m

    pkgutil.iter_modules = only_needed


# ---- the run


def owned_arrays(model: Any) -> dict[str, float]:
    """MiB held by the model's own arrays: repacked copies, anonymous raw blocks, KV cache (mapped ones apart)."""
    import numpy as np  # noqa: PLC0415

    from engine.kernels.dispatch import BlockProduct  # noqa: PLC0415

    out = {"repacked": 0.0, "raw blocks (anonymous)": 0.0, "raw blocks (mapped)": 0.0}
    seen: set[int] = set()
    for obj in gc.get_objects():
        if not isinstance(obj, BlockProduct):
            continue
        w = obj.weight
        planes = getattr(w, "planes", None)
        if planes is not None and id(planes) not in seen:
            seen.add(id(planes))
            out["repacked"] += planes.nbytes / MIB
        b = obj.blocks
        if isinstance(b, np.ndarray) and id(b) not in seen:
            seen.add(id(b))
            root = b
            while isinstance(root.base, np.ndarray):
                root = root.base
            out["raw blocks (mapped)" if isinstance(root, np.memmap) else "raw blocks (anonymous)"] += b.nbytes / MIB
    return {k: round(v, 1) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--try", dest="changes", action="append", default=[],
                    choices=["trim", "lazy-kernels"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rep = Report(args.json)
    rep.mark("python")
    import numpy as np  # noqa: PLC0415

    rep.mark("numpy")
    import llvmlite.binding  # noqa: F401, PLC0415
    import numba  # noqa: F401, PLC0415

    rep.mark("numba + llvmlite")
    from engine.catalog import resolve_model  # noqa: PLC0415

    path = str(resolve_model(args.model)) if not args.model.endswith(".gguf") else args.model
    if "lazy-kernels" in args.changes:
        try_lazy_kernels(path)
    from engine.kernels import dispatch  # noqa: PLC0415
    from engine.kernels.pages import trim_heap  # noqa: PLC0415

    dispatch._load()
    rep.mark(f"kernel modules ({'numba' if dispatch.compiled() else 'numpy fallback'})")
    from engine.gguf import open_gguf  # noqa: PLC0415
    from engine.quant.types import GGMLType  # noqa: PLC0415

    with open_gguf(path) as g:
        qtypes = {GGMLType(t.qtype) for t in g.tensors.values()}
    dispatch.warm_up(qtypes)
    rep.mark("warm_up: kernels compiled / cache loaded")

    from engine.model import load_model  # noqa: PLC0415

    last = [""]

    def progress(what: str, frac: float) -> None:
        if what != last[0]:
            if last[0]:
                rep.mark(f"  load: {last[0][:36]}")
            last[0] = what

    model = load_model(path, progress=progress)
    rep.mark("load_model done")
    if "trim" in args.changes:
        trim_heap()
        rep.mark("  malloc_trim")
    rng = np.random.default_rng(1234)
    ids = rng.integers(0, model.args.n_vocab, size=args.p).tolist()
    n_ctx = max(args.p, args.n) + 1
    model.forward(ids[:1], model.new_cache(n_ctx))
    rep.mark("first token (BlockProducts, repacks built)")
    if "trim" in args.changes:
        trim_heap()
        rep.mark("  malloc_trim")
    cache = model.new_cache(n_ctx)
    t = time.perf_counter()
    model.forward(ids, cache)
    pp = time.perf_counter() - t
    rep.mark(f"prefill {args.p} ({args.p / pp:.1f} tok/s)")
    cache = model.new_cache(n_ctx)
    tok = ids[0]
    t = time.perf_counter()
    for _ in range(args.n):
        tok = model.greedy_step(tok, cache)
    tg = time.perf_counter() - t
    rep.mark(f"decode {args.n} ({args.n / tg:.1f} tok/s)")
    file_mb = os.path.getsize(path) / MIB
    owned = owned_arrays(model)
    kv = sum(getattr(a, "nbytes", 0) for a in vars(cache).values() if isinstance(a, np.ndarray)) / MIB
    maps = mappings()
    result = {"model": args.model, "file_mb": round(file_mb, 1), "tries": args.changes, "stages": rep.rows,
              "peak_rss_mb": rep.rows[-1]["peak"], "owned_mb": owned, "kv_cache_mb": round(kv, 1),
              "released_mb": round(RELEASED[0] / MIB, 1), "top_mappings": [
                  {"mapping": m, "rss": round(r, 1), "anon": round(a, 1)} for m, r, a in maps]}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"\nfile {file_mb:.1f} MiB   peak {result['peak_rss_mb']:.1f} MiB ({result['peak_rss_mb'] / file_mb:.2f}x)   "
          f"model arrays {owned}   KV cache {kv:.1f} MiB" + (f"   released {result['released_mb']} MiB" if RELEASED[0] else ""))
    print("largest mappings (MiB):")
    for m, r, a in maps:
        print(f"  {r:7.1f} rss {a:7.1f} anon  {m}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
