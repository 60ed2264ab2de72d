"""`gguf-lens quantize IN OUT --budget-bpw B --calibration-text F [--imatrix F] [--dry-run]`: a searched mix.

The search itself is engine.quality.mix_search; this module reads the options, shows progress on a
terminal, prints the plan (as `--tensor-type` rules a llama-quantize user can paste) and writes the file
through the same writer as `--type` (engine.quality.requantize.quantize_file).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from engine.cli.options import read_text_file
from engine.errors import SettingError

DEFAULT_TOKENS = 64  # half of 128 tokens' cost; the tensors' KLDs rank alike (Spearman 0.98 on SmolLM2)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a searched mix (added to `quantize`)."""
    p.add_argument("--budget-bpw", type=float, default=None, metavar="B",
                   help="search each tensor's type for the least KLD to IN with at most B bits per weight on average")
    p.add_argument("--calibration-text", metavar="F", help="the text the search measures KLD on (with --budget-bpw)")
    p.add_argument("--calibration-tokens", type=int, default=DEFAULT_TOKENS, metavar="N",
                   help=f"use the first N tokens of the calibration text (default {DEFAULT_TOKENS}, at most 256)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the searched plan as --tensor-type rules for llama-quantize and write nothing")
    p.add_argument("--no-verify", action="store_true", help="skip running the whole mix to check its KLD")
    p.add_argument("--min-fill", type=float, default=None, metavar="F",
                   help="the mix is at least F of the budget where the types allow (default 0.99: within 1%%; "
                        "0: as small as is best, which for a budget above the file's size is the file itself)")
    p.add_argument("--group-layers", type=int, default=1, metavar="N",
                   help="measure each tensor role in N neighbouring layers at once (N times fewer runs; default 1)")
    p.add_argument("--no-cache", action="store_true",
                   help="measure every tensor again (by default measured sensitivities are kept in the user cache)")


def _progress(label: str):
    if not sys.stderr.isatty():
        return None

    def show(what: str, frac: float) -> None:
        sys.stderr.write(f"\r{label}: {frac * 100:5.1f}% {what[:70]}\033[K")
        if frac >= 1.0:
            sys.stderr.write("\r\033[K")
    return show


def load_importance(path: str | None):
    """(the importance matrix, {tensor: per-column importance}) from an imatrix file, (None, None) without one."""
    if not path:
        return None, None
    from engine.quality.imatrix import read_imatrix

    imatrix = read_imatrix(path)
    return imatrix, imatrix.quant_weights()


def paste_command(plan: Any, src: str, imatrix: str | None) -> str:
    """The llama-quantize command that writes the same file."""
    parts = ["llama-quantize", "--allow-requantize"]
    if imatrix:
        parts += ["--imatrix", imatrix]
    for rule in plan.rules():
        parts += ["--tensor-type", rule]
    parts += [src, "OUT.gguf", plan.preset()]
    return " ".join(shlex.quote(p) for p in parts)


def cmd_mix(args: argparse.Namespace) -> int:
    """Search the mix, print it, and write it unless --dry-run."""
    from engine.catalog import resolve_model
    from engine.model import load_model
    from engine.quality.mix_search import MIN_FILL, find_mix
    from engine.quality.requantize import check_output_path, quantize_file
    from engine.quality.sensitivity_cache import SensitivityCache, cache_key

    if getattr(args, "type", None):
        raise SettingError("--budget-bpw searches the types itself; it cannot be combined with --type")
    if args.tensor_type:
        raise SettingError("--budget-bpw searches every tensor's type; it cannot be combined with --tensor-type")
    if not args.calibration_text:
        raise SettingError("--budget-bpw needs --calibration-text F (the text the KLD is measured on)")
    if not 1 <= args.group_layers <= 64:
        raise SettingError(f"--group-layers {args.group_layers}: must be between 1 and 64")
    if not 2 <= args.calibration_tokens <= 256:
        raise SettingError(f"--calibration-tokens {args.calibration_tokens}: must be between 2 and 256")
    min_fill = MIN_FILL if args.min_fill is None else args.min_fill
    if not 0.0 <= min_fill <= 1.0:
        raise SettingError(f"--min-fill {min_fill:g}: must be between 0 and 1")
    text = read_text_file(args.calibration_text)
    src = resolve_model(args.input)
    if not args.dry_run:
        check_output_path(src, args.output)
        if not Path(args.output).resolve().parent.is_dir():
            raise SettingError(f"output folder {Path(args.output).parent} does not exist")
    imatrix_path = getattr(args, "imatrix", None)
    imatrix, importance = load_importance(imatrix_path)
    model = load_model(src, warm=False)
    ids = list(model.tokenizer.encode(text, add_special=True, parse_special=False))[: args.calibration_tokens]
    if len(ids) < 2:
        raise SettingError(f"--calibration-text {args.calibration_text}: needs at least 2 tokens")
    cache = None if args.no_cache else SensitivityCache(
        cache_key(src, ids, model.numerics, importance, args.group_layers), label=f"{Path(src).name} on {Path(args.calibration_text).name}")
    t0 = time.perf_counter()
    result = find_mix(model, ids, args.budget_bpw, importance=importance, cache=cache, verify=not args.no_verify,
                      progress=_progress("search"), group_layers=args.group_layers, min_fill=min_fill)
    assert result is not None  # no cancel event from the command line
    seconds = time.perf_counter() - t0
    plan = result.plan
    sens = result.sensitivities
    for note in sens.notes if sens is not None else []:
        print(f"note: {note}", file=sys.stderr)
    model.close()
    if args.dry_run:
        if args.json:
            print(json.dumps(plan.as_dict() | {"seconds": seconds, "command": paste_command(plan, str(src), imatrix_path)}))
        else:
            print(f"# {Path(src).name}: {plan.summary()} ({seconds:.0f} s)")
            print(paste_command(plan, str(src), imatrix_path))
        return 0
    written = quantize_file(src, args.output, plan.preset(), plan.rules(), progress=_progress("quantize"),
                            imatrix=imatrix, imatrix_file=imatrix_path or "")
    assert written is not None
    if args.json:
        print(json.dumps(plan.as_dict() | {"output": str(args.output), "seconds": seconds,
                                           "file_bytes": written.new_bytes, "file_bpw": written.new_bpw}))
    else:
        print(f"wrote {args.output}: {plan.summary()}; search {seconds:.0f} s")
    return 0
