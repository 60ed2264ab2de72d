"""The tokenizer test corpus (tests/fixtures/tokenizer_corpus.json) expanded to (name, text) pairs, and id digests.

Shared by the tests and by tools/make_tokenizer_fixtures.py (which runs under a Python with llama-cpp-python), so
both tokenize exactly the same strings. Standard library only.

The corpus file holds three kinds of entries:
- `entries`: literal strings (hand-written cases, llama.cpp's models/ggml-vocab-*.inp, tiktoken's test strings,
  hostile strings);
- `generated`: `{"name", "unit", "count", "prefix", "suffix"}`, the text `prefix + unit * count + suffix` (long
  degenerate inputs that would bloat the file);
- `sweep`: every code point of `ranges` (first, last inclusive) dropped into each of `contexts` (`{c}` marks
  the place), `per_entry` code points to an entry.

Fixtures keep, per string, the ids of the four add_special x parse_special combinations and llama_detokenize's
four outputs: short ones inline, long ones as a digest ("n:hash" of the ids as little-endian uint32), repeats
as the index of the first equal one (`pack` / `unpack`); `matches(got, want)` compares either form.
"""
from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "tokenizer_corpus.json"
INLINE_MAX = 64  # id lists up to this long are stored as lists, longer ones as a digest


def load(path: Path = CORPUS) -> dict[str, Any]:
    """The corpus file as JSON."""
    return json.loads(path.read_text(encoding="utf-8"))


def sweep_codepoints(sweep: dict[str, Any]) -> list[int]:
    """The sweep's code points in order."""
    return [cp for first, last in sweep["ranges"] for cp in range(first, last + 1)]


def expand(corpus: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(name, text) for every entry, generated entry and sweep chunk, in file order."""
    for entry in corpus["entries"]:
        yield entry["name"], entry["text"]
    for gen in corpus.get("generated", []):
        yield gen["name"], gen.get("prefix", "") + gen["unit"] * gen["count"] + gen.get("suffix", "")
    sweep = corpus.get("sweep")
    if sweep:
        cps = sweep_codepoints(sweep)
        step = sweep["per_entry"]
        sep = sweep.get("separator", "\n")
        for ctx_i, context in enumerate(sweep["contexts"]):
            for k in range(0, len(cps), step):
                chunk = cps[k:k + step]
                text = sep.join(context.replace("{c}", chr(cp)) for cp in chunk)
                yield f"sweep{ctx_i}_{chunk[0]:06X}", text


def subset(corpus: dict[str, Any], max_chars: int, sweep_every: int) -> list[tuple[str, str]]:
    """The strings under max_chars characters, with only every sweep_every-th sweep chunk."""
    out, k = [], 0
    for name, text in expand(corpus):
        if name.startswith("sweep"):
            k += 1
            if (k - 1) % sweep_every:
                continue
        if len(text) < max_chars:
            out.append((name, text))
    return out


def digest(ids: Sequence[int]) -> str:
    """"n:hash" of an id list: its length and the first 10 hex digits of the SHA-1 of the ids as uint32 LE."""
    raw = struct.pack(f"<{len(ids)}I", *ids)
    return f"{len(ids)}:{hashlib.sha1(raw).hexdigest()[:10]}"


def group_digest(id_lists: Sequence[Sequence[int]]) -> str:
    """One digest for a group of id lists (each prefixed by its length)."""
    flat: list[int] = []
    for ids in id_lists:
        flat.append(len(ids))
        flat.extend(ids)
    return digest(flat)


def bytes_digest(data: bytes) -> str:
    """"n:hash" of a byte string."""
    return f"{len(data)}:{hashlib.sha1(data).hexdigest()[:10]}"


def store_ids(ids: Sequence[int]) -> list[int] | str:
    """The ids as the fixture keeps them: inline when short, else a digest."""
    return list(ids) if len(ids) <= INLINE_MAX else digest(ids)


def store_bytes(data: bytes) -> str:
    """Bytes as the fixture keeps them: "hex" when short, else a digest."""
    return data.hex() if len(data) <= 2 * INLINE_MAX else bytes_digest(data)


def pack(values: list[Any]) -> list[Any]:
    """Stored values with repeats replaced by the index of their first occurrence (fixtures stay small)."""
    out: list[Any] = []
    for v in values:
        out.append(values.index(v) if values.index(v) < len(out) else v)
    return out


def unpack(stored: list[Any], k: int) -> Any:
    """Item k of a packed list, following back-references."""
    v = stored[k]
    return stored[v] if isinstance(v, int) and not isinstance(v, bool) else v


def matches(got: Sequence[int], want: list[int] | str) -> bool:
    """Whether an id list equals a stored one (inline or digest)."""
    return list(got) == want if isinstance(want, list) else digest(got) == want


def bytes_match(got: bytes, want: str) -> bool:
    """Whether bytes equal stored ones (hex or digest)."""
    return bytes_digest(got) == want if ":" in want else got.hex() == want
