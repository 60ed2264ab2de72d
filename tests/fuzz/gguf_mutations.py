"""Seeds, a map of their typed fields, and mutators for fuzzing GGUF parsing and model loading (RELIABILITY 23).

A mutation is a tuple of plain ints, (kind, a, b, c), interpreted modulo the sizes of the file it is
applied to, so hypothesis can shrink it and tools/fuzz_gguf.py can draw it from random.Random(seed)
and print it. Kinds: bit flips, byte sets, boundary integers written over typed fields (length-field
maxing with the dictionary 0, 1, -1, 2^31, 2^32, 2^63, 2^64-1 ...), splices from another seed,
truncations, insertions and deletions; and two structured kinds applied to the parsed seed before it is
re-serialized, so the container stays valid and the hostile part reaches the tokenizer and the model:
'retype' sets a metadata key to a boundary value of any type (or an array one item short, retyped...),
'retensor' drops, renames, reshapes, cuts, converts or poisons one tensor.

Each input runs in a child forked from tests/reliability/harness.py's server, under RLIMIT_AS and a
timeout: open_gguf, Tokenizer.from_metadata on its metadata (plus an encode/decode), then
load_model(warm=False), one checked forward pass and a chat-template render. Only LensError
subclasses may escape a stage; a traceback, a signal or a timeout is a crash.
"""
from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.gguf import GGUFValueType as VT
from engine.gguf import write_gguf
from engine.gguf.writer import encode_value, infer_type
from engine.quant.types import GGMLType
from tests.reliability.harness import GIB, LoaderServer, read_tensors
from tests.tiny_models import make_tiny_gemma3, make_tiny_llama

Mutation = tuple[int, int, int, int]  # (kind, a, b, c)
REGRESSIONS = Path(__file__).resolve().parent / "regressions"
CASE_LIMIT = 1 * GIB          # RLIMIT_AS of each case
CASE_TIMEOUT_S = 120.0        # wall clock of each case: a hang guard, not a speed

# boundary integers written over typed fields, masked to the field's width (so -1 is all ones)
DICTIONARY = (0, 1, 2, 3, 4, 7, 13, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 2**31 - 1, 2**31, 2**32 - 1,
              2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1, -1, -2, 0x1D1D1D1D1D1D1D1D)

BITFLIP, BYTESET, FIELD, SPLICE, TRUNCATE, INSERT, DELETE, DUPLICATE, RETYPE, RETENSOR = range(10)
KINDS = ("bitflip", "byteset", "field", "splice", "truncate", "insert", "delete", "duplicate", "retype", "retensor")
_WEIGHTS = (25, 8, 30, 6, 4, 3, 3, 3, 20, 8)  # for random drawing in the long run (field maxing and bit flips first)
_STRUCTURED = (RETYPE, RETENSOR)  # applied to the parsed seed first, then re-serialized: valid containers, hostile contents


@dataclass(frozen=True)
class Field:
    """One typed integer of the header: where it is and how wide."""

    offset: int
    size: int  # bytes: 4 or 8 (1/2 for small scalar values)
    what: str


Parsed = tuple[dict[str, Any], dict[str, Any], list[tuple[str, GGMLType, tuple[int, ...], bytes]]]


@dataclass(frozen=True)
class Seed:
    name: str
    data: bytes
    fields: tuple[Field, ...]
    header_end: int  # where tensor data starts: mutations favour [0, header_end)
    parsed: Parsed   # (metadata, metadata types, tensors) for the structured mutations

    @property
    def values(self) -> tuple[Field, ...]:
        """The scalar metadata values among the fields."""
        return tuple(f for f in self.fields if f.what.endswith(" value"))


_CHAT = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
         "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def build_seeds(folder: Path) -> list[Seed]:
    """The 3 small valid files: a tiny llama (with a chat template), a tiny gemma3, and the llama's header alone."""
    folder.mkdir(parents=True, exist_ok=True)
    llama = make_tiny_llama(folder / "seed-llama.gguf", n_layers=1, dim=16, n_heads=2, n_kv_heads=1, hidden=32,
                            n_ctx=64, chat_template=_CHAT)
    gemma = make_tiny_gemma3(folder / "seed-gemma3.gguf", n_layers=1, dim=16, n_heads=2, n_kv_heads=1, head_dim=8,
                             hidden=32, n_ctx=64, window=8)
    md, types, _ = read_tensors(llama)
    write_gguf(folder / "seed-header-only.gguf", md, [], metadata_types=types)  # metadata, no tensors
    out = []
    for name, path in (("llama", llama), ("gemma3", gemma), ("header-only", folder / "seed-header-only.gguf")):
        data = path.read_bytes()
        fields, end = field_map(data)
        out.append(Seed(name, data, tuple(fields), end, read_tensors(path)))
    return out


# -- the field map of a valid file ---------------------------------------------------------------------

_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_KEEP_ITEMS = 3  # per array, the typed fields of the first few and the last string item are recorded


def field_map(data: bytes) -> tuple[list[Field], int]:
    """Every count, length, type id, dim and offset of a valid GGUF (trusted input), and where its data starts."""
    fields: list[Field] = []
    pos = 0

    def u(size: int, what: str) -> int:
        nonlocal pos
        fields.append(Field(pos, size, what))
        value = int.from_bytes(data[pos : pos + size], "little")
        pos += size
        return value

    pos = 4
    u(4, "version")
    n_tensors, n_kv = u(8, "n_tensors"), u(8, "n_kv")
    alignment = 32

    def value(vtype: int, what: str, record: bool = True) -> Any:
        nonlocal pos
        if vtype == 8:
            n = u(8, f"{what} length") if record else _skip(8)
            raw = data[pos : pos + n]
            pos += n
            return raw
        if vtype == 9:
            item = u(4, f"{what} item type")
            n = u(8, f"{what} count")
            for i in range(n):
                value(item, f"{what}[{i}]", record=i < _KEEP_ITEMS or i == n - 1)
            return None
        size = _SCALAR[vtype]
        if record and size >= 1:
            return u(size, f"{what} value")
        pos += size
        return None

    def _skip(size: int) -> int:
        nonlocal pos
        v = int.from_bytes(data[pos : pos + size], "little")
        pos += size
        return v

    for i in range(n_kv):
        key = value(8, f"key #{i}").decode()
        vtype = u(4, f"'{key}' type")
        v = value(vtype, f"'{key}'")
        if key == "general.alignment" and isinstance(v, int) and v > 0 and v & (v - 1) == 0:
            alignment = v
    for i in range(n_tensors):
        name = value(8, f"tensor #{i} name").decode()
        n_dims = u(4, f"'{name}' n_dims")
        for d in range(n_dims):
            u(8, f"'{name}' ne[{d}]")
        u(4, f"'{name}' type")
        u(8, f"'{name}' offset")
    end = -(-pos // alignment) * alignment
    return fields, min(end, len(data))


# -- applying mutations ----------------------------------------------------------------------------

def _pos(x: int, data: bytes | bytearray, header_end: int) -> int:
    """A position: 7 draws in 8 land in the header (metadata and tensor infos), the rest anywhere."""
    if not data:
        return 0
    if x % 8 and header_end > 0:
        return (x >> 3) % min(header_end, len(data))
    return (x >> 3) % len(data)


def apply_mutations(seed: Seed, mutations: Sequence[Mutation], seeds: Sequence[Seed]) -> bytes:
    """The seed's bytes with each mutation applied: structured ones on the parsed seed first, then byte-level ones."""
    structured = [m for m in mutations if m[0] % len(KINDS) in _STRUCTURED]
    if structured:
        seed = restructure(seed, structured)
    data = bytearray(seed.data)
    for kind, a, b, c in mutations:
        kind %= len(KINDS)
        if kind == BITFLIP and data:
            p = _pos(a, data, seed.header_end)
            data[p] ^= 1 << (b % 8)
        elif kind == BYTESET and data:
            data[_pos(a, data, seed.header_end)] = (0x00, 0xFF, 0x7F, 0x80, b & 0xFF)[c % 5]
        elif kind == FIELD and seed.fields:
            # one draw in three rewrites a metadata value (block_count, an id...), which parsing lets through
            pool = seed.values if c % 3 == 1 and seed.values else seed.fields
            f = pool[a % len(pool)]
            value = DICTIONARY[b % len(DICTIONARY)]
            if c % 4 == 0:  # near the bytes that are left: off-by-one territory
                value = len(data) - f.offset + (b % 5) - 2
            if f.offset + f.size <= len(data):
                data[f.offset : f.offset + f.size] = (value & ((1 << (8 * f.size)) - 1)).to_bytes(f.size, "little")
        elif kind == SPLICE:
            other = seeds[b % len(seeds)].data
            if other and data:
                src = _pos(c, other, len(other))
                n = 1 + (a >> 16) % 64
                dst = _pos(a, data, seed.header_end)
                data[dst : dst + n] = other[src : src + n]
        elif kind == TRUNCATE:
            data = data[: (a % (len(data) + 1)) if b % 2 else _pos(a, data, seed.header_end)]
        elif kind == INSERT and len(data) < 1 << 20:
            p = _pos(a, data, seed.header_end)
            chunk = struct.pack("<Q", DICTIONARY[b % len(DICTIONARY)] & (2**64 - 1))[: 1 + c % 8]
            data[p:p] = chunk * (1 + (c >> 3) % 4)
        elif kind == DELETE and data:
            p = _pos(a, data, seed.header_end)
            del data[p : p + 1 + b % 16]
        elif kind == DUPLICATE and data and len(data) < 1 << 20:
            p = _pos(a, data, seed.header_end)
            n = 1 + b % 64
            data[p:p] = data[p : p + n]
    return bytes(data)


# -- structured mutations: hostile values in a valid container -------------------------------------------

_INT_TYPES = ((VT.UINT8, 0, 2**8 - 1), (VT.INT8, -(2**7), 2**7 - 1), (VT.UINT16, 0, 2**16 - 1),
              (VT.INT16, -(2**15), 2**15 - 1), (VT.UINT32, 0, 2**32 - 1), (VT.INT32, -(2**31), 2**31 - 1),
              (VT.UINT64, 0, 2**64 - 1), (VT.INT64, -(2**63), 2**63 - 1))


def _replacements() -> list[tuple[Any, tuple[VT, VT | None]]]:
    """Typed values a metadata key can be set to: boundary integers of every width, odd floats, strings, arrays."""
    out: list[tuple[Any, tuple[VT, VT | None]]] = []
    for vt, lo, hi in _INT_TYPES:
        for v in sorted({0, 1, 2, 13, lo, hi, -1, 2**31, 2**32, 2**63}):
            if lo <= v <= hi:
                out.append((v, (vt, None)))
    out += [(x, (VT.FLOAT32, None)) for x in (0.0, -1.0, float("nan"), float("inf"), -float("inf"), 1e-40, 3e38)]
    out += [(1e308, (VT.FLOAT64, None)), (True, (VT.BOOL, None)), (False, (VT.BOOL, None))]
    out += [(x, (VT.STRING, None)) for x in ("", "0", "llama", "gpt2", "gemma3", "x" * 3000, "\u2581", "<0xZZ>", "{{ x")]
    out += [(np.zeros(0, np.int32), (VT.ARRAY, VT.INT32)), ([], (VT.ARRAY, VT.STRING)),
            (np.array([1, 2**63], np.uint64), (VT.ARRAY, VT.UINT64)), (["a b", "", "<0x41>"], (VT.ARRAY, VT.STRING))]
    return out


REPLACEMENTS = _replacements()
_EXTRA_KEYS = ("{a}.expert_count", "{a}.expert_used_count", "{a}.attention.key_length", "{a}.attention.value_length",
               "{a}.attention.sliding_window", "{a}.rope.dimension_count", "{a}.rope.freq_base_swa",
               "tokenizer.ggml.eot_token_id", "tokenizer.ggml.scores", "tokenizer.ggml.add_space_prefix",
               "tokenizer.ggml.pre", "tokenizer.ggml.unknown_token_id", "tokenizer.chat_template", "general.alignment")
_ODD_STRINGS = ("", "<0x-1>", "<0xZZ>", "<0x100>", "a b c", "\u0000", "\u2581" * 90, "<|im_end|>", "x" * 70_000)


def _array_variant(old: Any, b: int, c: int) -> tuple[Any, VT | None] | None:
    """A mutated copy of an array value: one item fewer or more, an item replaced, or another item type."""
    items = list(old)
    op = b % 5
    if op == 0 and items:
        return items[:-1], None
    if op == 1 and items:
        return items + items[-1:], None
    if op == 2 and items:
        i = c % len(items)
        if isinstance(items[i], str):
            items[i] = _ODD_STRINGS[(c >> 8) % len(_ODD_STRINGS)]
        else:
            items[i] = type(items[i])(0)
        return items, None
    if op == 3 and isinstance(old, np.ndarray):
        dtype = (np.int8, np.uint32, np.float64, np.int64, np.float32)[c % 5]
        return old.astype(dtype), None
    if op == 4 and items:
        return items[: 1 + c % len(items)], None
    return None


def _retype(md: dict[str, Any], types: dict[str, Any], arch: str, a: int, b: int, c: int) -> None:
    """Set one metadata key (existing, or one the engine reads) to a hostile typed value, or delete it."""
    keys = sorted(md) + [k.format(a=arch) for k in _EXTRA_KEYS]
    key = keys[a % len(keys)]
    if key in md and isinstance(md[key], (list, np.ndarray)) and c % 3 == 0:
        variant = _array_variant(md[key], b, c >> 2)
        if variant is not None:
            md[key] = variant[0]
            if isinstance(variant[0], np.ndarray):
                types[key] = (VT.ARRAY, infer_type(variant[0])[1])
            return
    if c % 17 == 1:
        md.pop(key, None)
        types.pop(key, None)
        return
    value, vtype = REPLACEMENTS[b % len(REPLACEMENTS)]
    md[key] = value
    types[key] = vtype


def _retensor(tensors: list[tuple[str, GGMLType, tuple[int, ...], bytes]], a: int, b: int, c: int) -> None:
    """Change one tensor consistently (drop, rename, reshape, cut a row, F32<->F16, poison, add an empty one)."""
    if not tensors:
        return
    i = a % len(tensors)
    name, qtype, shape, data = tensors[i]
    op = b % 8
    if op == 0:
        del tensors[i]
    elif op == 1:
        tensors[i] = (("blk.7." + name.split(".", 2)[-1]) if c % 2 else name + "x", qtype, shape, data)
    elif op == 2 and len(shape) == 2 and qtype in (GGMLType.F32, GGMLType.F16):
        tensors[i] = (name, qtype, (shape[1], shape[0]), data)
    elif op == 3 and len(shape) == 2 and shape[1] > 1:
        row = len(data) // shape[1]
        tensors[i] = (name, qtype, (shape[0], shape[1] - 1), data[:-row])
    elif op == 4 and qtype == GGMLType.F32:
        tensors[i] = (name, GGMLType.F16, shape, np.frombuffer(data, np.float32).astype(np.float16).tobytes())
    elif op == 5 and qtype in (GGMLType.F32, GGMLType.F16) and data:
        dtype = np.float32 if qtype == GGMLType.F32 else np.float16
        arr = np.frombuffer(data, dtype).copy()
        arr[c % arr.size] = (np.nan, np.inf, -np.inf, 65504.0)[(c >> 8) % 4]
        tensors[i] = (name, qtype, shape, arr.tobytes())
    elif op == 6:
        tensors.insert(i, (f"blk.0.empty{c % 3}.weight", GGMLType.F32, ((0,), (8, 0), (0, 8))[c % 3], b""))
    elif op == 7 and len(shape) == 1:
        tensors[i] = (name, qtype, (shape[0], 2), data + data)


def serialize(md: dict[str, Any], types: dict[str, Any], tensors: Sequence[tuple[str, GGMLType, tuple[int, ...], bytes]],
              alignment: int = 32) -> bytes:
    """A GGUF v3 file in memory, laid out as engine.gguf.write_gguf lays it out."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(md)))
    for key, value in md.items():
        vtype, item = types.get(key) or infer_type(value)
        raw = key.encode()
        out += struct.pack("<Q", len(raw)) + raw + struct.pack("<i", int(vtype)) + encode_value(value, VT(vtype),
                                                                                            None if item is None else VT(item), key)
    offset = 0
    for name, qtype, shape, data in tensors:
        raw = name.encode()
        out += struct.pack("<Q", len(raw)) + raw + struct.pack(f"<I{len(shape)}qiQ", len(shape), *shape, int(qtype), offset)
        offset += -(-len(data) // alignment) * alignment
    out += bytes(-len(out) % alignment)
    for *_, data in tensors:
        out += data
        out += bytes(-len(out) % alignment)
    return bytes(out)


def restructure(seed: Seed, mutations: Sequence[Mutation]) -> Seed:
    """The seed with the structured mutations applied to its parsed form, re-serialized (and re-mapped)."""
    md, types, tensors = seed.parsed
    md, types, tensors = dict(md), dict(types), list(tensors)
    arch = md.get("general.architecture", "llama")
    for kind, a, b, c in mutations:
        if kind % len(KINDS) == RETYPE:
            _retype(md, types, arch if isinstance(arch, str) else "llama", a, b, c)
        else:
            _retensor(tensors, a, b, c)
    try:
        data = serialize(md, types, tensors)
    except (ValueError, OverflowError, TypeError, struct.error):  # a value that does not fit its type: skip the lot
        return seed
    fields, end = field_map(data)
    return Seed(seed.name, data, tuple(fields), end, seed.parsed)


def describe(mutations: Sequence[Mutation]) -> list[str]:
    """Readable names for a mutation list (for the regression manifest and failure messages)."""
    return [f"{KINDS[k % len(KINDS)]}({a}, {b}, {c})" for k, a, b, c in mutations]


def random_mutations(rng: Any, max_ops: int = 4) -> list[Mutation]:
    """1-4 mutations drawn from random.Random, field maxing and bit flips most often."""
    n = 1 + min(rng.randrange(max_ops), rng.randrange(max_ops))  # mostly 1-2
    kinds = rng.choices(range(len(KINDS)), weights=_WEIGHTS, k=n)
    return [(k, rng.getrandbits(40), rng.getrandbits(32), rng.getrandbits(32)) for k in kinds]


# -- running one input -----------------------------------------------------------------------------

FUZZ_CHILD = r"""
import json, resource, sys
path, limit = sys.argv[1], int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import logging
logging.disable(logging.CRITICAL)
from engine.errors import LensError
from engine.gguf import open_gguf
from engine.tokenizer.vocab import Tokenizer
from engine.model import load_model
from engine.generate import run_checked
out = {"stages": [], "errors": {}}
def stage(name, fn):
    try:
        result = fn()
        out["stages"].append(name)
        return result
    except LensError as exc:
        out["errors"][name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        return None

def tokenizer():
    with open_gguf(path) as f:
        md = f.metadata
    tok = Tokenizer.from_metadata(md)
    ids = tok.encode("Hello wörld <|im_end|> 123 ▁x", add_special=True, parse_special=True)
    tok.decode(ids)
    tok.decode([0, 1, tok.n_vocab - 1, tok.n_vocab, -1])

stage("open", lambda: open_gguf(path).close())
if "open" in out["stages"]:
    stage("tokenizer", tokenizer)
    model = stage("load", lambda: load_model(path, warm=False))
    if model is not None:
        n = model.tokenizer.n_vocab
        stage("forward", lambda: run_checked(model, [0, 1 % n, n - 1], model.new_cache(8), None))
        stage("chat", lambda: model.chat.render([{"role": "user", "content": "hi"}]))
        model.close()
print(json.dumps(out))
"""


_ENGINE_FRAME = re.compile(r'File "[^"]*/engine/([^"]+)", line (\d+), in (\S+)')


@dataclass(frozen=True)
class Outcome:
    """What one input did: the stages it passed, or how it crashed."""

    crashed: bool
    reason: str        # '' when fine; else 'signal -11', 'timeout', 'exit 1', the exception line ...
    stages: tuple[str, ...]
    rejected: str      # the first stage that raised a LensError ('' if none)
    stderr: str

    @property
    def key(self) -> str:
        """The crash class without line numbers or values: 'ValueError @ engine/models/gemma3.py in from_metadata'."""
        exc = self.reason.split(":", 1)[0]
        frames = _ENGINE_FRAME.findall(self.stderr)
        return f"{exc} @ engine/{frames[-1][0]} in {frames[-1][2]}" if frames else exc

    @property
    def signature(self) -> str:
        """A short crash class for grouping: the exception line and the deepest engine frame."""
        frames = _ENGINE_FRAME.findall(self.stderr)
        if not frames:
            return self.reason
        file, line, func = frames[-1]
        return f"{self.reason} @ engine/{file}:{line} in {func}"


def run_input(server: LoaderServer, path: Path, blob: bytes, *, limit: int = CASE_LIMIT,
              timeout: float = CASE_TIMEOUT_S) -> Outcome:
    """Write blob to path and run the fuzz child on it."""
    path.write_bytes(blob)
    reply = server.request(FUZZ_CHILD, str(path), str(limit), timeout=timeout)
    lines = reply["stdout"].strip().splitlines()
    try:
        out = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        out = {}
    stderr = reply["stderr"]
    if reply["timed_out"]:
        reason = f"timeout after {timeout} s"
    elif reply["rc"] < 0:
        reason = f"signal {-reply['rc']}"
    elif reply["rc"] != 0 or "Traceback" in stderr:
        last = [ln for ln in stderr.strip().splitlines() if ln and not ln.startswith(" ")]
        reason = last[-1][:200] if last else f"exit {reply['rc']}"
    else:
        reason = ""
    errors = out.get("errors", {})
    return Outcome(bool(reason), reason, tuple(out.get("stages", ())), next(iter(errors), ""), stderr[-4000:])


def owner_of(key: str) -> str:
    """Who fixes a crash class: the tokenizer/chat helper for engine/tokenizer*.py and engine/chat.py, else the lead."""
    return "tokenizer helper" if "engine/tokenizer" in key or "engine/chat" in key else "lead"


def open_regression_keys(folder: Path = REGRESSIONS) -> set[str]:
    """Crash classes the saved regressions mark "open" (known, not fixed yet)."""
    keys = set()
    for note in folder.glob("*.json"):
        info = json.loads(note.read_text())
        if info.get("status") == "open" and info.get("key"):
            keys.add(info["key"])
    return keys


def save_regression(blob: bytes, outcome: Outcome, info: dict[str, Any], folder: Path = REGRESSIONS) -> Path:
    """Keep a crashing input as tests/fuzz/regressions/<sha1>.gguf with a JSON note next to it."""
    folder.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha1(blob).hexdigest()[:16]
    path = folder / f"{name}.gguf"
    path.write_bytes(blob)
    note = {"crash": outcome.reason, "signature": outcome.signature, "key": outcome.key, "status": "open", **info,
            "stderr_tail": outcome.stderr[-1500:]}
    (folder / f"{name}.json").write_text(json.dumps(note, indent=2) + "\n")
    return path
