"""Options several gguf-lens subcommands share: --numerics, --ablate-head, --lora, and reading --text-file as the bytes
it holds."""
from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

from engine.errors import SettingError


def add_numerics(p: argparse.ArgumentParser) -> None:
    """--numerics ggml|float32: llama.cpp's numbers on the blocks (default), or the float32 textbook reference;
    --flash-attn on|off: llama.cpp's flash attention kernels or its mul_mat graph (default)."""
    p.add_argument("--numerics", default="ggml", choices=["ggml", "float32"],
                   help="ggml: compute on the GGUF blocks with 8-bit activations and an F16 KV cache, as llama.cpp "
                        "does (default); float32: dequantized weights and float32 activations (the reference)")
    p.add_argument("--flash-attn", default="off", choices=["on", "off"],
                   help="on: attend as llama.cpp does with flash attention (its -fa on; -fa auto resolves to on for "
                        "the CPU), bit for bit with ggml numerics; off: its mul_mat / soft_max graph (default)")
    p.add_argument("--cache-type", default=None, type=str.upper, choices=["F16", "F32", "Q8_0", "Q4_0"],
                   help="the KV cache's rows, as llama.cpp's -ctk and -ctv together (default F16 with ggml numerics, "
                        "F32 with float32); a quantized V cache is llama.cpp's with --flash-attn on")


def add_interventions(p: argparse.ArgumentParser) -> None:
    """--ablate-head LAYER:HEAD (repeatable): that head's output zeroed before the attention output product (or its
    mean with --ablate-mean); --ablate-attn / --ablate-ffn LAYER, --ablate-expert LAYER:EXPERT; and add_steering's."""
    p.add_argument("--ablate-head", action="append", default=[], metavar="LAYER:HEAD",
                   help="switch attention head HEAD of layer LAYER off (its output set to zero); repeatable")
    p.add_argument("--ablate-mean", action="store_true",
                   help="ablated heads output their mean over the input's tokens instead of zero")
    p.add_argument("--ablate-attn", action="append", default=[], metavar="LAYER",
                   help="leave out layer LAYER's attention output (what it adds to the residual stream); repeatable")
    p.add_argument("--ablate-ffn", action="append", default=[], metavar="LAYER",
                   help="leave out layer LAYER's FFN output; repeatable")
    p.add_argument("--ablate-expert", action="append", default=[], metavar="LAYER:EXPERT",
                   help="never route to expert EXPERT of layer LAYER (a Mixture-of-Experts model); repeatable")
    add_steering(p)


def add_steering(p: argparse.ArgumentParser) -> None:
    """--control-vector FILE[:SCALE] (repeatable): llama.cpp's control vectors, summed; --lora FILE[:SCALE]
    (repeatable): LoRA adapters in llama.cpp's GGUF format."""
    p.add_argument("--control-vector", action="append", default=[], metavar="FILE[:SCALE]",
                   help="add a control vector (llama.cpp's format) to the layers' outputs, times SCALE (1); "
                        "repeatable: the files are summed, as llama.cpp's --control-vector-scaled does")
    p.add_argument("--lora", action="append", default=[], metavar="FILE[:SCALE]",
                   help="apply a LoRA adapter (llama.cpp's GGUF format) at SCALE (1); repeatable, as llama.cpp's "
                        "--lora / --lora-scaled")


TEXT_FILE_CAP = 256 * 1024 * 1024  # bytes; a text beyond this is surely a mistake (and would not fit a context)


def read_text_file(path_text: str, flag: str = "--text-file", cap: int = TEXT_FILE_CAP) -> str:
    """A file's text exactly as its bytes say (UTF-8, line endings kept, as llama.cpp reads a prompt file).

    Refuses with a SettingError: a missing path, anything but a regular file (a FIFO, a device such as
    /dev/urandom, a folder), a file larger than `cap` bytes, and invalid UTF-8 (naming the byte offset).
    """
    path = Path(path_text)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; the fstat below refuses it
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise SettingError(f"{flag} {path}: no such file") from None
    except OSError as exc:
        raise SettingError(f"{flag} {path}: cannot open it ({exc.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > cap:
        os.close(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SettingError(f"{flag} {path}: not a regular file")
        raise SettingError(f"{flag} {path}: {info.st_size:,} bytes, more than the {cap:,}-byte cap")
    with os.fdopen(fd, "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise SettingError(f"{flag} {path}: more than the {cap:,}-byte cap")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SettingError(f"{flag} {path}: not valid UTF-8 at byte offset {exc.start} "
                           f"(byte 0x{data[exc.start]:02X})") from None
