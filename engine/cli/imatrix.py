"""`gguf-lens imatrix MODEL --text-file F -o OUT`: an importance matrix in llama.cpp's file format.

The options follow llama-imatrix's: `-c/--ctx-size` is the chunk length (512), `--chunks N` the most
chunks to run, `--chunk N` the chunks to skip at the start, `--output-format gguf|dat`. The numbers are
engine.quality.imatrix_collect's; `--show` prints the statistics of an existing file instead.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from engine.cli.options import add_numerics, read_text_file
from engine.errors import SettingError


def _progress():
    if not sys.stderr.isatty():
        return None

    def show(what: str, frac: float) -> None:
        sys.stderr.write(f"\rimatrix: {what} {frac * 100:5.1f}%\033[K")
        if frac >= 1.0:
            sys.stderr.write("\r\033[K")
    return show


def _summary(im) -> list[dict[str, object]]:
    """Per tensor: columns, tokens, and the mean / max of the mean squared activation."""
    rows = []
    for name in im.names():
        v = im.values(name)
        rows.append({"tensor": name, "columns": int(im.sums[name].shape[1]), "tokens": int(im.counts[name].max()),
                     "mean": float(np.mean(v)), "max": float(np.max(v))})
    return rows


def cmd_imatrix(args: argparse.Namespace) -> int:
    from engine.quality.imatrix import read_imatrix, write_imatrix, write_imatrix_legacy  # noqa: PLC0415

    if args.show:
        im = read_imatrix(args.show)
        rows = _summary(im)
        if args.json:
            print(json.dumps({"file": args.show, "chunk_count": im.chunk_count, "chunk_size": im.chunk_size,
                              "datasets": im.datasets, "legacy": im.legacy, "tensors": rows}))
            return 0
        print(f"{args.show}: {len(im)} tensors, {im.chunk_count} chunks of {im.chunk_size}, datasets {im.datasets}")
        for r in rows:
            print(f"  {r['tensor']:<36} {r['columns']:6d} cols  mean {r['mean']:.4g}  max {r['max']:.4g}")
        return 0
    if not args.model or not args.text_file or not args.output:
        raise SettingError("imatrix needs MODEL --text-file F -o OUT (or --show FILE)")
    out = Path(args.output)
    if not out.resolve().parent.is_dir():
        raise SettingError(f"output folder {out.parent} does not exist")
    from engine.model import load_model  # noqa: PLC0415
    from engine.quality.imatrix_collect import compute_imatrix  # noqa: PLC0415

    text = read_text_file(args.text_file)
    t0 = time.perf_counter()
    model = load_model(args.model, numerics=args.numerics, flash_attn=args.flash_attn)
    im = compute_imatrix(model, text, n_ctx=args.ctx_size, skip_chunks=args.chunk, max_chunks=args.chunks,
                         parse_special=args.parse_special, dataset=args.text_file, progress=_progress())
    assert im is not None  # no cancel from the command line
    legacy = args.output_format == "dat"
    (write_imatrix_legacy if legacy else write_imatrix)(out, im)
    seconds = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"output": str(out), "format": args.output_format, "tensors": len(im),
                          "chunks": im.chunk_count, "chunk_size": im.chunk_size, "seconds": seconds}))
    else:
        print(f"wrote {out}: {len(im)} tensors over {im.chunk_count} chunks of {im.chunk_size} tokens "
              f"in {seconds:.1f} s")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add `imatrix` to the gguf-lens subcommands."""
    p = sub.add_parser("imatrix", help="an importance matrix of a model over a text, in llama.cpp's imatrix format")
    p.add_argument("model", nargs="?", help="a .gguf path or catalog name")
    p.add_argument("--text-file", metavar="F", help="the calibration text")
    p.add_argument("-o", "--output", metavar="OUT", help="the imatrix file to write")
    p.add_argument("-c", "--ctx-size", type=int, default=512, metavar="N",
                   help="tokens per chunk, each run from an empty cache (default 512, as llama-imatrix)")
    p.add_argument("--chunks", type=int, default=-1, metavar="N", help="run at most N chunks (default: all)")
    p.add_argument("--chunk", type=int, default=0, metavar="N", help="skip the first N chunks (as llama-imatrix)")
    p.add_argument("--parse-special", action="store_true", help="parse special tokens in the text")
    p.add_argument("--output-format", choices=["gguf", "dat"], default="gguf",
                   help="gguf: llama.cpp's current format (default); dat: the legacy format")
    p.add_argument("--show", metavar="FILE", help="print the tensors of an existing imatrix file (GGUF or .dat)")
    p.add_argument("--json", action="store_true")
    add_numerics(p)
    p.set_defaults(func=cmd_imatrix)
