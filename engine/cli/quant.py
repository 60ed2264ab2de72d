"""The `quantize` and `compare` subcommands of gguf-lens (added to its parser by engine.cli.main)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from engine.cli.mix import add_arguments as add_mix_arguments
from engine.cli.options import add_numerics, read_text_file
from engine.errors import SettingError
from engine.quant.presets import PRESETS
from engine.quant.rules import parse_rules


def _progress(label: str):
    """A one-line progress display on a terminal, nothing otherwise."""
    if not sys.stderr.isatty():
        return None

    def show(what: str, frac: float) -> None:
        sys.stderr.write(f"\r{label}: {what} {frac * 100:5.1f}%\033[K")
        if frac >= 1.0:
            sys.stderr.write("\r\033[K")
    return show


def _warn_fallbacks(plan) -> None:
    """One line per kind of fallback: how many tensors, why, and the first few names."""
    groups: dict[str, list[str]] = {}
    for tp in plan.fallbacks:
        groups.setdefault(tp.reason.rsplit("; ", 1)[-1], []).append(tp.name)
    for why, names in groups.items():
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        print(f"warning: {len(names)} tensor{'s' * (len(names) > 1)} ({shown}): {why}", file=sys.stderr)


def cmd_quantize(args: argparse.Namespace) -> int:
    from engine.catalog import resolve_model  # noqa: PLC0415
    from engine.quant.presets import preset_by_name  # noqa: PLC0415
    from engine.quality.requantize import check_output_path, quantize_file  # noqa: PLC0415

    if args.budget_bpw is not None:
        from engine.cli.mix import cmd_mix  # noqa: PLC0415

        return cmd_mix(args)
    if not args.type:
        raise SettingError("quantize needs --type T (a preset) or --budget-bpw B --calibration-text F")
    preset = preset_by_name(args.type)
    rules = parse_rules(args.tensor_type or [])
    src = resolve_model(args.input)
    check_output_path(src, args.output)
    if not Path(args.output).resolve().parent.is_dir():
        raise SettingError(f"output folder {Path(args.output).parent} does not exist")
    if args.threads < 1:
        raise SettingError(f"--threads {args.threads}: must be at least 1")
    imatrix = None
    if args.imatrix:
        from engine.quality.imatrix import read_imatrix  # noqa: PLC0415

        imatrix = read_imatrix(args.imatrix)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.threads) if args.threads > 1 else nullcontext() as pool:
        plan = quantize_file(src, args.output, preset, rules, progress=_progress("quantize"), executor=pool,
                             imatrix=imatrix, imatrix_file=args.imatrix or "")
    assert plan is not None  # no cancel event from the command line
    _warn_fallbacks(plan)
    if args.json:
        print(json.dumps(plan.as_dict() | {"output": str(args.output), "seconds": time.perf_counter() - t0}))
    else:
        print(f"wrote {args.output}: {plan.summary()} in {time.perf_counter() - t0:.1f} s")
    return 0


def _other_model(args: argparse.Namespace, base_path: Path):
    """The model to compare against: another file, or this one requantized in memory."""
    from engine.model import load_model  # noqa: PLC0415
    from engine.quality.requantize import Requantizer  # noqa: PLC0415

    if args.against:
        return load_model(args.against, numerics=args.numerics, flash_attn=args.flash_attn), f"{Path(args.against).name}"
    if args.against_numerics and not (args.type or args.tensor_type):
        return load_model(base_path, numerics=args.against_numerics), f"{base_path.name} ({args.against_numerics} numerics)"
    other = load_model(base_path, warm=False, numerics=args.against_numerics or args.numerics,
                       flash_attn="off" if args.against_numerics else args.flash_attn)
    rq = Requantizer(other)
    plan = rq.plan(args.type, args.tensor_type or [])
    _warn_fallbacks(plan)
    if not plan.changed:
        print("warning: the rules change no tensor; both runs use the same weights", file=sys.stderr)
    rq.apply(plan, progress=_progress("requantize"))
    return other, plan.label()


def cmd_compare(args: argparse.Namespace) -> int:
    from engine.quality.compare import compare_models  # noqa: PLC0415
    from engine.model import load_model  # noqa: PLC0415

    if not args.against and not args.tensor_type and not args.type and not args.against_numerics:
        raise SettingError("compare needs --tensor-type REGEX=TYPE (or --type PRESET), --against OTHER.gguf "
                           "or --against-numerics ggml|float32")
    if args.against and (args.tensor_type or args.type):
        raise SettingError("--against cannot be combined with --tensor-type or --type")
    if args.tensor_type:
        parse_rules(args.tensor_type)  # bad rules fail before any model is loaded
    if args.type:
        from engine.quant.presets import preset_by_name  # noqa: PLC0415

        preset_by_name(args.type)
    text = read_text_file(args.text_file)
    base = load_model(args.model, numerics=args.numerics, flash_attn=args.flash_attn)
    ids = base.tokenizer.encode(text, add_special=True, parse_special=False)
    if args.max_tokens:
        ids = ids[: args.max_tokens]
    if len(ids) < 2:
        raise SettingError(f"--text-file {args.text_file}: needs at least 2 tokens, has {len(ids)}")
    if len(ids) > base.args.n_ctx:
        raise SettingError(f"the text is {len(ids)} tokens, longer than the model's context {base.args.n_ctx}")
    other, label = _other_model(args, base.path)
    cmp = compare_models(base, other, ids, progress=_progress("compare"))
    report: dict[str, Any] = cmp.as_dict() | {"base": base.path.name, "other": label}
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{report['base']}  vs  {label}   ({cmp.n_tokens} tokens)")
    print(f"  KLD        mean {cmp.kld_mean:.6f}  median {cmp.kld_median:.6f}  p99 {cmp.kld_p99:.6f}  max {cmp.kld_max:.6f}")
    print(f"  same top token  {cmp.same_top_pct:.2f} %")
    if (worst := cmp.routing_most_changed) is not None:
        print(f"  routing         {cmp.routing_changed_pct:.1f} % of token-layer pairs choose other experts "
              f"(most in layer {worst.layer}: {worst.changed_pct:.1f} %)")
    print(f"  PPL        base {cmp.ppl_base:.4f}  other {cmp.ppl_other:.4f}  ratio {cmp.ppl_ratio:.4f}")
    print("  per layer  (relative L2 of the residual stream, mean cosine)")
    for layer in cmp.per_layer:
        print(f"    {layer.layer:3d}  {layer.rel_l2:.5f}  {layer.cosine:.6f}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add `quantize` and `compare` to the gguf-lens subcommands."""
    presets = ", ".join(PRESETS)
    p = sub.add_parser("quantize", help="requantize a GGUF to a preset (as llama-quantize) and write it")
    p.add_argument("input", metavar="IN", help="the .gguf to read (or a catalog name)")
    p.add_argument("output", metavar="OUT", help="the .gguf to write")
    p.add_argument("--type", metavar="T", help=f"preset: {presets} (or search a mix with --budget-bpw)")
    p.add_argument("--tensor-type", action="append", metavar="REGEX=TYPE",
                   help="give tensors matching REGEX this type (the first matching rule wins, as llama.cpp)")
    p.add_argument("--threads", type=int, default=1, help="requantize this many tensors at once (default 1)")
    p.add_argument("--imatrix", metavar="F", help="an importance matrix (llama.cpp's GGUF or .dat format), as "
                   "llama-quantize --imatrix")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_mix_arguments(p)
    p.set_defaults(func=cmd_quantize)

    p = sub.add_parser("compare", help="KL divergence, top-token agreement and perplexity of two versions of a model")
    p.add_argument("model", help="a .gguf path or catalog name")
    p.add_argument("--text-file", required=True)
    p.add_argument("--tensor-type", action="append", metavar="REGEX=TYPE",
                   help="compare with this model requantized by these rules (the first matching rule wins)")
    p.add_argument("--type", default=None, metavar="T", help=f"with a preset as the base of the rules: {presets}")
    p.add_argument("--against", metavar="OTHER.gguf", help="compare with another file of the same model")
    p.add_argument("--max-tokens", type=int, default=0, help="use only the first N tokens of the text")
    add_numerics(p)
    p.add_argument("--against-numerics", default=None, choices=["ggml", "float32"],
                   help="B in these numerics (alone: the same file, so the KLD is what the numerics change)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compare)
