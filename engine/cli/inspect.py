"""`gguf-lens inspect`: a GGUF file's metadata and tensors, and whether the engine could run it.

A well-formed file whose hyper-parameters cannot run (attention.head_count = 0, block_count = 100000, an
architecture the engine does not know) is still listed in full, with exit status 0; each reason it cannot run
is one `warning:` line on stderr (`warning: llama.attention.head_count = 0: must be between 1 and 1024; this
model cannot run`) and an item of the JSON report's "problems" list. The reasons come from the same checks
`load_model` runs before `generate` (model_class, Tokenizer.from_metadata, the embedding's shape, the
architecture's args_from_metadata), without touching the weights.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from engine.errors import ModelFormatError

CANNOT_RUN = "this model cannot run"


def _summarize(value: Any, limit: int = 8) -> Any:
    """A metadata value for display: long arrays as their type and first items."""
    if isinstance(value, np.ndarray):
        head = value[:limit].tolist()
        return head if value.size <= limit else {"type": f"{value.dtype}[{value.size}]", "head": head}
    if isinstance(value, list):
        return value if len(value) <= limit else {"type": f"list[{len(value)}]", "head": value[:limit]}
    return value


def _printable(text: str, limit: int = 120) -> str:
    """text with control characters escaped, cut to `limit` characters."""
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}" for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def expert_summary(gguf) -> dict[str, Any] | None:
    """A Mixture-of-Experts file's experts: the counts from its metadata (as they read, checked or not) and the
    share of the weights the expert tensors hold; None for a dense file."""
    arch = gguf.metadata.get("general.architecture")
    count = gguf.metadata.get(f"{arch}.expert_count") if isinstance(arch, str) else None
    exps = [t for t in gguf.tensors.values() if "_exps." in t.name or "_shexp." in t.name]
    if count is None and not exps:
        return None
    used = gguf.metadata.get(f"{arch}.expert_used_count")
    routed = sum(t.nbytes for t in exps if "_exps." in t.name)
    total = sum(t.nbytes for t in gguf.tensors.values())
    out: dict[str, Any] = {"expert_count": _summarize(count), "expert_used_count": _summarize(used),
                           "expert_tensors": len(exps), "expert_bytes": routed, "total_bytes": total}
    if isinstance(count, (int, np.integer)) and isinstance(used, (int, np.integer)) and 0 < used <= count:
        out["bytes_per_token"] = int(total - routed + routed * int(used) // int(count))  # what one token reads
    return out


def run_problems(gguf) -> list[str]:
    """Why load_model would refuse this file, one line per failed check (empty when it would load)."""
    from engine.models.registry import model_class  # noqa: PLC0415 - the models load only for inspect
    from engine.tokenizer.vocab import Tokenizer  # noqa: PLC0415

    problems: list[str] = []
    metadata = gguf.metadata
    arch = metadata.get("general.architecture")
    cls = None
    try:
        if not isinstance(arch, str):
            raise ModelFormatError("general.architecture", "is missing or not a string", arch)
        cls = model_class(arch)
    except ModelFormatError as exc:
        problems.append(str(exc))
    try:
        n_tokens = Tokenizer.from_metadata(metadata).n_vocab
    except ModelFormatError as exc:
        problems.append(str(exc))
        n_tokens = None
    embd = gguf.tensors.get("token_embd.weight")
    if embd is None or len(embd.shape) != 2:
        problems.append("token_embd.weight: is missing or not 2-D")
    elif n_tokens is not None and embd.shape[1] != n_tokens:
        problems.append(f"token_embd.weight: has {embd.shape[1]} rows but the vocabulary has {n_tokens} tokens")
    if cls is not None and embd is not None and len(embd.shape) == 2:
        try:
            cls.args_from_metadata(metadata, embd.shape[1])
        except ModelFormatError as exc:
            problems.append(str(exc))
    return [f"{p}; {CANNOT_RUN}" for p in problems]


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print the file's header, metadata and tensors (or --json), then one warning line per problem."""
    from engine.catalog import resolve_model  # noqa: PLC0415
    from engine.gguf import open_gguf  # noqa: PLC0415

    with open_gguf(resolve_model(args.model)) as g:
        tensors = [
            {"name": t.name, "type": t.qtype.name, "shape": list(t.shape), "bytes": t.nbytes,
             "bpw": round(8.0 * t.nbytes / max(1, t.n_elements), 4)}
            for t in g.tensors.values()
        ]
        total_b = sum(t["bytes"] for t in tensors)
        total_n = sum(t.n_elements for t in g.tensors.values())
        report = {
            "path": str(g.path), "version": g.version, "alignment": g.alignment, "file_size": g.file_size,
            "metadata": {k: _summarize(v) for k, v in g.metadata.items()},
            "tensors": tensors, "n_params": total_n, "tensor_bytes": total_b,
            "bpw": round(8.0 * total_b / max(1, total_n), 4), "warnings": list(g.warnings),
            "problems": run_problems(g), "experts": expert_summary(g),
        }
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=1, default=str))
    else:
        print(f"{report['path']}  GGUF v{report['version']}  {report['file_size']:,} bytes")
        print(f"{len(tensors)} tensors, {total_n:,} weights, {total_b:,} bytes, {report['bpw']:.3f} bits per weight")
        ex = report["experts"]
        if ex is not None:
            line = (f"experts: {ex['expert_count']} per layer, {ex['expert_used_count']} used per token; expert "
                    f"tensors {ex['expert_tensors']}, {ex['expert_bytes']:,} bytes")
            if "bytes_per_token" in ex:
                line += f"; a token reads about {ex['bytes_per_token']:,} of the {ex['total_bytes']:,} bytes"
            print(line)
        print("\nmetadata:")
        for k, v in report["metadata"].items():
            text = _printable(json.dumps(v, ensure_ascii=False, default=str) if not isinstance(v, str) else v)
            print(f"  {k} = {text}")
        print("\ntensors:")
        for t in tensors:
            shape = "x".join(map(str, t["shape"]))
            print(f"  {t['name']:<36} {t['type']:<6} {shape:<14} {t['bytes']:>12,} B  {t['bpw']:.3f} bpw")
    for w in report["warnings"] + report["problems"]:
        print(f"warning: {_printable(w, 400)}", file=sys.stderr)
    return 0
