"""A searched mix against llama-quantize's presets at the same size, on a held-out text.

For each model and preset (Q4_K_M, Q3_K_M by default): the preset's size gives the budget, the
search measures sensitivities on assets/calibration_text.txt, and then the preset and the searched
mix are both compared with the file on assets/eval_text.txt (not the calibration text) with the
default ggml numerics. The mix is held within 1% of the preset's size (--min-fill 0.99) where the
candidate types allow. Prints one JSON line per (model, preset) and the search's wall and CPU time.
With --imatrix DIR (a folder of <key>.imatrix.gguf, e.g. tests/fixtures/imatrix: llama-imatrix's own matrices)
the preset is quantized with the model's imatrix, as llama-quantize --imatrix does, and the search measures and
quantizes with it too.

    .venv/bin/python benchmarks/mix_vs_presets.py [MODEL ...] [--presets Q4_K_M,Q3_K_M] [--tokens 64] [--imatrix DIR]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.catalog import resolve_model
from engine.cli.mix import load_importance
from engine.model import load_model
from engine.quality.compare import compare_models
from engine.quality.mix_search import MIN_FILL, find_mix
from engine.quality.requantize import Requantizer
from engine.quality.sensitivity_cache import SensitivityCache, cache_key

IMATRIX_KEYS = {"llama": "smollm2", "gemma3": "gemma3"}  # the fixture's file of each catalog architecture


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["smollm2-135m-instruct", "gemma3-270m"])
    ap.add_argument("--presets", default="Q4_K_M,Q3_K_M")
    ap.add_argument("--tokens", type=int, default=64, help="calibration tokens")
    ap.add_argument("--min-fill", type=float, default=MIN_FILL, help="the mix is at least this share of the budget")
    ap.add_argument("--eval-tokens", type=int, default=512)
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--imatrix", metavar="DIR", help="quantize and search with DIR/<key>.imatrix.gguf")
    ap.add_argument("--group-layers", type=int, default=1, help="measure one role in N neighbouring layers at once")
    args = ap.parse_args()
    calib = (ROOT / "assets" / "calibration_text.txt").read_text(encoding="utf-8")
    held_out = (ROOT / "assets" / "eval_text.txt").read_text(encoding="utf-8")
    for name in args.models:
        path = resolve_model(name)
        base = load_model(path, warm=False)
        other = load_model(path, warm=False)
        ids = base.tokenizer.encode(calib, add_special=True, parse_special=False)[: args.tokens]
        eval_ids = base.tokenizer.encode(held_out, add_special=True, parse_special=False)[: args.eval_tokens]
        key = IMATRIX_KEYS.get(str(base.gguf.metadata.get("general.architecture")), path.stem)
        im_path = Path(args.imatrix) / f"{key}.imatrix.gguf" if args.imatrix else None
        imatrix, importance = load_importance(str(im_path) if im_path else None)
        cache = None if args.no_cache else SensitivityCache(
            cache_key(path, ids, base.numerics, importance, group_layers=args.group_layers), label=path.name)
        rq = Requantizer(other)
        rq.set_imatrix(imatrix, im_path.name if im_path else "")
        for preset in args.presets.split(","):
            plan = rq.plan(preset)
            t0, c0 = time.perf_counter(), time.process_time()
            result = find_mix(other, ids, plan.new_bpw, importance=importance, cache=cache,
                              group_layers=args.group_layers,
                              min_fill=args.min_fill,
                              progress=lambda what, frac: print(f"  {frac * 100:5.1f}% {what}", file=sys.stderr)
                              if int(frac * 1000) % 50 == 0 else None)
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
            assert result is not None
            mix = result.plan
            rq.apply(plan)
            kld_preset = compare_models(base, other, eval_ids).kld_mean
            rq.apply(rq.plan(None, mix.rules()))
            applied = rq.applied
            kld_mix = compare_models(base, other, eval_ids).kld_mean
            rq.reset()
            print(json.dumps({
                "model": path.name, "preset": preset, "imatrix": str(im_path) if im_path else None, "preset_bytes": plan.new_bytes, "preset_bpw": plan.new_bpw,
                "mix_bytes": mix.nbytes, "mix_bpw": mix.bpw, "size_ratio": mix.nbytes / plan.new_bytes,
                "applied_bytes": applied.new_bytes if applied else None,
                "kld_preset": kld_preset, "kld_mix": kld_mix, "ratio": kld_mix / kld_preset if kld_preset else None,
                "calibration_kld_mix": mix.measured_kld, "predicted_kld_mix": mix.predicted_kld,
                "variants": [(v.exponent, v.widened, v.measured_kld) for v in result.variants],
                "search_seconds": seconds, "search_cpu_seconds": cpu, "note": mix.note, "resumed_tensors": result.sensitivities.resumed if result.sensitivities else 0,
                "calibration_tokens": len(ids), "group_layers": args.group_layers, "eval_tokens": len(eval_ids), "counts": mix.counts(),
            }), flush=True)
        base.close()
        other.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
