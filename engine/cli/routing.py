"""`gguf-lens routing`: which experts a Mixture-of-Experts model chose for each token of a text, as JSON."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

from engine.cli.options import add_numerics, read_text_file
from engine.errors import SettingError


def cmd_routing(args: argparse.Namespace) -> int:
    from engine.generate import prefill  # noqa: PLC0415
    from engine.observe.recorder import Recorder  # noqa: PLC0415
    from engine.observe.routing import routing_layers, routing_report  # noqa: PLC0415

    model = args.load(args)
    text = args.text if args.text is not None else read_text_file(args.text_file)
    ids = model.tokenizer.encode(text, add_special=True, parse_special=False)  # a whole document, as `logits`
    if not ids:
        raise SettingError("no tokens to run")
    if len(ids) > model.args.n_ctx:
        raise SettingError(f"the text is {len(ids)} tokens, longer than the model's context {model.args.n_ctx}")
    if not getattr(model.args, "n_expert", 0):
        raise SettingError(f"{model.path.name} is a dense model: it has no experts to route to")
    rec = Recorder(capture_q=False)
    prefill(model, ids, model.new_cache(len(ids)), recorder=rec, chunk_size=args.chunk)
    report = routing_report(routing_layers(rec, model.args.n_layers), [model.tokenizer.token_text(t) for t in ids])
    out = json.dumps(report, ensure_ascii=False, indent=None if args.compact else 1)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(out + "\n")
        print(f"wrote {args.out}: {report['n_positions']} positions x {len(report['moe_layers'])} MoE layers", file=sys.stderr)
    else:
        print(out)
    return 0


def add_command(sub: argparse._SubParsersAction, add_model: Callable[[argparse.ArgumentParser], None],
                load: Callable[[argparse.Namespace], Any]) -> None:
    """The `routing` subcommand; `load` loads args.model as the other commands do (engine.cli.main)."""
    p = sub.add_parser("routing", help="the experts a Mixture-of-Experts model chose for each token, as JSON")
    add_model(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--text")
    g.add_argument("--text-file")
    p.add_argument("--out", default=None, help="write the JSON here instead of stdout")
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--compact", action="store_true", help="one line of JSON")
    add_numerics(p)
    p.set_defaults(func=cmd_routing, load=load)
