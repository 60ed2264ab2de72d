"""`gguf-lens cvector`: a control vector from pairs of contrasting prompts (llama-cvector-generator's mean method)."""
from __future__ import annotations

import argparse
import re
import sys
from typing import Any, Callable

from engine.cli.options import add_numerics, read_text_file
from engine.errors import SettingError

_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|.)")
_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b", "f": "\f", "v": "\v",
           "?": "?"}


def prompt_lines(path: str, flag: str) -> list[str]:
    """A prompt file as llama-cvector-generator reads one: one prompt per line, empty lines skipped, escapes such
    as \\n processed (common.cpp's string_process_escapes)."""
    def unescape(m: re.Match[str]) -> str:
        c = m.group(1)
        if c.startswith("x") and len(c) == 3:
            return chr(int(c[1:], 16))
        return _SIMPLE.get(c, "\\" + c)

    return [_ESCAPE.sub(unescape, line) for line in read_text_file(path, flag).split("\n") if line]


def cmd_cvector(args: argparse.Namespace) -> int:
    from engine.intervene.control_vector import save  # noqa: PLC0415
    from engine.intervene.cvector_mean import mean_directions  # noqa: PLC0415

    pos = prompt_lines(args.positive_file, "--positive-file")
    neg = prompt_lines(args.negative_file, "--negative-file")
    if len(pos) != len(neg):
        raise SettingError(f"{len(pos)} positive and {len(neg)} negative prompts: they go in pairs, one per line")
    model = args.load(args)
    progress = None
    if sys.stderr.isatty():
        def progress(frac: float) -> None:
            sys.stderr.write(f"\rprompt pairs {frac * 100:5.1f}%\033[K")
    directions = mean_directions(model, list(zip(pos, neg)), progress)
    path = save(args.output, directions, model.arch, model.args.n_layers - 1)
    print(f"wrote {path}: {len(directions)} directions of {model.args.dim} from {len(pos)} prompt pairs", file=sys.stderr)
    return 0


def add_command(sub: argparse._SubParsersAction, add_model: Callable[[argparse.ArgumentParser], None],
                load: Callable[[argparse.Namespace], Any]) -> None:
    """The `cvector` subcommand; `load` loads args.model as the other commands do (engine.cli.main)."""
    p = sub.add_parser("cvector", help="make a control vector from contrasting prompt pairs (the mean method)")
    add_model(p)
    p.add_argument("--positive-file", required=True, help="one prompt per line (\\n and other escapes processed)")
    p.add_argument("--negative-file", required=True, help="as many prompts, the negative of each")
    p.add_argument("-o", "--output", required=True, help="the control vector file to write (llama.cpp's format)")
    add_numerics(p)
    p.set_defaults(func=cmd_cvector, load=load)
