"""gguf-lens attribute: why the model gives this token at a position, split over the embedding, every head, FFN and
expert (engine.attribute)."""
from __future__ import annotations

import argparse
import json
from typing import Any, Callable

import numpy as np

from engine.cli.options import add_numerics
from engine.errors import SettingError

TOP = 15  # parts listed without --json


def cmd_attribute(args: argparse.Namespace, load: Callable[[argparse.Namespace], Any]) -> int:
    from engine.attribute.api import attribute, check_method  # noqa: PLC0415
    from engine.attribute.inputs import IG_STEPS  # noqa: PLC0415

    check_method(args.method, args.corrupt)  # refused before the model loads
    if args.top < 0:
        raise SettingError(f"--top {args.top}: must be 0 or more")
    model = load(args)  # the CLI's loader (engine.cli.main._load): numerics, progress, notes
    try:
        got = attribute(model, args.prompt, args.target, args.contrast, args.position, args.method, args.corrupt,
                        IG_STEPS if args.steps is None else args.steps, args.ig_rule, decoder=args.decoder)
    finally:
        model.close()
    if args.json:
        print(json.dumps(got.to_json(), ensure_ascii=False))
        return 0
    what = f"{got.target.text!r}" + (f" - {got.contrast.text!r}" if got.contrast else "")
    cap = " (before the soft-cap)" if got.softcap is not None else ""
    where = "decoder position" if got.decoder_tokens else "position"
    print(f"logit {what} at {where} {got.position}: {got.logit_diff:.4f}{cap}, {got.numerics} numerics")
    for kind, layer, index, value in got.top(args.top):
        where = "" if layer is None else f" L{layer}" + ("" if index is None else f".{index}")
        print(f"  {value:+9.4f}  {kind}{where}")
    rest = got.values[got.kinds == "remainder"]
    print(f"  {got.remainder():+9.4f}  remainder: rounding and quantization, all layers and the head (the largest "
          f"single one {rest[np.argmax(np.abs(rest))]:+.4f})")
    if got.inputs is not None:
        _print_inputs(got.inputs, got.token_texts)
    if got.patching is not None:
        _print_patching(got.patching, args.top)
    return 0


def _print_inputs(inputs: Any, texts: tuple[str, ...]) -> None:
    name = {"ixg": "input x gradient", "ig": f"integrated gradients ({inputs.steps} points)"}[inputs.method]
    print(f"{name} per input token (float32 reference gradient of {inputs.value:.4f}):")
    for p, (text, value) in enumerate(zip(texts, inputs.values)):
        print(f"  {value:+9.4f}  {p:4d} {text!r}")
    if inputs.completeness_error is not None:
        gap = inputs.value - inputs.baseline_value
        print(f"  sum {float(np.sum(inputs.values)):+.4f} vs f(x) - f(0) = {gap:+.4f}: "
              f"completeness error {inputs.completeness_error:.4f}")


def _print_patching(est: Any, top: int) -> None:
    print(f"attribution patching: answer #{est.answer} - wrong #{est.wrong}, clean {est.clean_diff:+.4f}, corrupted "
          f"{est.corrupt_diff:+.4f}; estimated share of the difference restored per head (all positions):")
    per_head = est.per_head()
    real = est.checks["heads"].real if "heads" in est.checks else None
    for flat in np.argsort(-np.abs(per_head), axis=None, kind="stable")[:top]:
        layer, head = np.unravel_index(flat, per_head.shape)
        shown = "" if real is None else f"  (real patching {real[layer, head]:+.4f})"
        print(f"  {per_head[layer, head]:+9.4f}  L{layer}.{head}{shown}")
    for name, check in est.checks.items():
        print(f"  against real patching ({name}): Spearman {check.spearman:.3f}, "
              f"top-10 overlap {check.top_overlap:.0%}")


def add_command(sub: Any, add_model: Callable[[argparse.ArgumentParser], None],
                load: Callable[[argparse.Namespace], Any]) -> None:
    """Register the `attribute` sub-command."""
    p = sub.add_parser("attribute", help="why this token: its logit split over the embedding, heads, FFNs, experts",
                       description="Direct logit attribution: the logit of TOKEN (minus the contrast's) at a position "
                                   "of the prompt, split exactly into what the embedding, every attention head, FFN, "
                                   "expert and shared expert wrote to the residual stream, with the final norm's scale "
                                   "as the run computed it; a remainder per layer and one for the head carry what the "
                                   "run's rounding and 8-bit activations leave (float32 numerics: almost nothing). "
                                   "Soft-capped logits are attributed before the cap.")
    add_model(p)
    p.add_argument("--prompt", required=True, help="the text the model reads (BOS added as the model's metadata says)")
    p.add_argument("--target", required=True, metavar="TOKEN", help="the token whose logit is explained: its text "
                   "(one token of the vocabulary, e.g. ' Paris') or #id")
    p.add_argument("--contrast", default=None, metavar="TOKEN", help="explain target minus this token's logit (why X "
                   "rather than Y)")
    p.add_argument("--position", type=int, default=None, metavar="N",
                   help="the prompt position whose next-token logits are explained (default: the last; -1 counts from "
                        "the end)")
    p.add_argument("--decoder", default=None, metavar="TEXT", help="encoder-decoder models (T5): the --prompt is the "
                   "encoder's input and this the decoder's text after its start token (default: none: the first "
                   "token of the reply is explained); --position then counts the decoder's tokens")
    p.add_argument("--method", default=None, choices=["ig", "ixg", "patching"],
                   help="add gradient attributions: per prompt token (ixg: input x gradient, ig: integrated gradients "
                        "from zero embeddings, with its completeness error) or attribution patching per head and "
                        "position (patching, needs --corrupt), checked against real activation patching")
    p.add_argument("--corrupt", default=None, metavar="TEXT", help="--method patching: the corrupted prompt (as many "
                   "tokens as --prompt); the wrong token is --contrast, else the corrupted run's top token")
    p.add_argument("--steps", type=int, default=None, help="--method ig: points on the path (default 32, Inseq's)")
    p.add_argument("--ig-rule", default="uniform", choices=["uniform", "log"], help="--method ig: Gauss-Legendre on "
                   "[0, 1] (Inseq's) or on log-spaced panels down to 1e-7 (steps a multiple of 8; see the completeness "
                   "error printed)")
    p.add_argument("--top", type=int, default=TOP, help="parts listed without --json")
    p.add_argument("--json", action="store_true", help="one JSON object: target, contrast, position, logit_diff, "
                   "components [{kind, layer, index, value}] summing to logit_diff; with --method, `inputs` "
                   "(tokens [{position, id, text, value}], completeness_error) or `patching` (heads [layer][head]"
                   "[position], resid_pre [layer][position], validation {heads: {spearman, top10_overlap, real}})")
    add_numerics(p)
    p.set_defaults(func=lambda args: cmd_attribute(args, load))
