"""Options several gguf-lens subcommands share."""
from __future__ import annotations

import argparse


def add_numerics(p: argparse.ArgumentParser) -> None:
    """--numerics ggml|float32: llama.cpp's numbers on the blocks (default), or the float32 textbook reference."""
    p.add_argument("--numerics", default="ggml", choices=["ggml", "float32"],
                   help="ggml: compute on the GGUF blocks with 8-bit activations and an F16 KV cache, as llama.cpp "
                        "does (default); float32: dequantized weights and float32 activations (the reference)")
