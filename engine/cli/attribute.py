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


def cmd_attribute(args: argparse.Namespace) -> int:
    from engine.attribute.api import attribute, check_method  # noqa: PLC0415
    from engine.cli.main import _load  # noqa: PLC0415 - the CLI's loader: numerics, progress, notes

    check_method(args.method)  # refused before the model loads
    if args.top < 0:
        raise SettingError(f"--top {args.top}: must be 0 or more")
    model = _load(args)
    try:
        got = attribute(model, args.prompt, args.target, args.contrast, args.position)
    finally:
        model.close()
    if args.json:
        print(json.dumps(got.to_json(), ensure_ascii=False))
        return 0
    what = f"{got.target.text!r}" + (f" - {got.contrast.text!r}" if got.contrast else "")
    cap = " (before the soft-cap)" if got.softcap is not None else ""
    print(f"logit {what} at position {got.position}: {got.logit_diff:.4f}{cap}, {got.numerics} numerics")
    for kind, layer, index, value in got.top(args.top):
        where = "" if layer is None else f" L{layer}" + ("" if index is None else f".{index}")
        print(f"  {value:+9.4f}  {kind}{where}")
    rest = got.values[got.kinds == "remainder"]
    print(f"  {got.remainder():+9.4f}  remainder: rounding and quantization, all layers and the head (the largest "
          f"single one {rest[np.argmax(np.abs(rest))]:+.4f})")
    return 0


def add_command(sub: Any, add_model: Callable[[argparse.ArgumentParser], None]) -> None:
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
    p.add_argument("--method", default=None, choices=["ig", "ixg", "patching"],
                   help="input attributions or a patching map: not built yet (refused)")
    p.add_argument("--top", type=int, default=TOP, help="parts listed without --json")
    p.add_argument("--json", action="store_true", help="one JSON object: target, contrast, position, logit_diff, "
                   "components [{kind, layer, index, value}] summing to logit_diff")
    add_numerics(p)
    p.set_defaults(func=cmd_attribute)
