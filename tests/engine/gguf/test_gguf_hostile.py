"""RELIABILITY.md cases 2-15 and 25: hostile GGUF files, each opened in its own process under RLIMIT_AS 1 GiB.

A case passes when the child exits with the expected code (3: ModelFormatError, 0: accepted), printed no
traceback, stayed within 1 s and 64 MiB, and the error message names the field and value (regex).
Children are forked from a small server that imported numpy and engine.gguf once, so ~130 isolated
processes cost a few seconds instead of ~130 interpreter start-ups; a crash (SIGBUS, SIGSEGV), an
uncaught exception or a hang still shows up as that case's failure.
"""
from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.gguf_factory import (
    ARRAY,
    FLOAT32,
    INT32,
    INT32_MAX,
    INT64_MAX,
    STRING,
    U64_MAX,
    UINT8,
    UINT32,
    UINT64,
    KV,
    Enc,
    Layout,
    Tensor,
    build_gguf,
    default_tensors,
    kv,
    make_gguf,
)

REPO = Path(__file__).resolve().parents[3]
TIMEOUT_S = 120  # a hang guard: a loaded 2-core machine must not reach it
REJECTED, ACCEPTED = 3, 0

# Opens the file, touches every tensor byte, prints one JSON line. Exit 3 on ModelFormatError; any other
# exception escapes with a traceback (exit 1); a signal (SIGBUS, SIGSEGV) gives a negative code.
_CHILD_PRELUDE = """
import json, resource, sys
import numpy as np
from engine.errors import ModelFormatError
from engine.gguf import open_gguf
_LIMIT = 1 << 30
resource.setrlimit(resource.RLIMIT_AS, (_LIMIT, _LIMIT))
"""
_OPEN_CHILD = _CHILD_PRELUDE + """
import time, tracemalloc
if len(sys.argv) > 2:
    sys.setrecursionlimit(int(sys.argv[2]))
tracemalloc.start()
t0 = time.process_time()  # CPU time: what the parse did, not how busy the machine was
def cost():
    return {"seconds": time.process_time() - t0, "peak_bytes": tracemalloc.get_traced_memory()[1]}
try:
    with open_gguf(sys.argv[1]) as f:
        total = sum(int(f.rows(n).sum()) for n in f.tensors)
        shapes = {n: list(t.shape) for n, t in f.tensors.items()}
        print(json.dumps({"ok": True, "warnings": f.warnings, "shapes": shapes, "checksum": total, **cost()}))
except ModelFormatError as exc:
    print(json.dumps({"error": str(exc), "field": exc.field, **cost()}))
    sys.exit(3)
"""
MAX_PARSE_SECONDS = 10.0         # RELIABILITY.md: bounded resources for malformed tiny files (CPU seconds: a guard
                                 # against a hostile count making the parser loop, some 1000x a parse's cost)
MAX_PEAK_BYTES = 64 * 1024 * 1024


@dataclass
class ChildResult:
    rc: int
    out: dict
    stderr: str


# Reads one JSON request per line, forks a child that runs `script` with sys.argv = ["-c", *args] and its
# stdout/stderr in files, kills it after `timeout` s, answers one JSON line: rc, stdout, stderr.
_FORK_SERVER = r"""
import json, os, signal, sys, tempfile, time, traceback
import numpy, engine.errors, engine.gguf
tmp = tempfile.mkdtemp(prefix="gguf-hostile-")
out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
while line := sys.stdin.readline():
    req = json.loads(line)
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for fd, path in ((1, out_path), (2, err_path)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            sys.argv = ["-c", *req["args"]]
            exec(compile(req["script"], "<child>", "exec"), {"__name__": "__main__"})
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + req["timeout"]
    timed_out = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            timed_out = True
            break
        time.sleep(0.001)
    reply = {"rc": os.waitstatus_to_exitcode(status), "timed_out": timed_out,
             "stdout": open(out_path, errors="replace").read(), "stderr": open(err_path, errors="replace").read()}
    sys.stdout.write(json.dumps(reply) + "\n"); sys.stdout.flush()
"""


class ForkServer:
    """A warm Python that forks one isolated child per case."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _FORK_SERVER], cwd=REPO, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )

    def run(self, script: str, *args: str) -> ChildResult:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"script": script, "args": list(args), "timeout": TIMEOUT_S}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT_S + 30)
        assert ready, "fork server did not answer"
        reply = json.loads(self.proc.stdout.readline())
        assert not reply["timed_out"], f"child ran past {TIMEOUT_S} s: {reply}"
        lines = reply["stdout"].strip().splitlines()
        return ChildResult(reply["rc"], json.loads(lines[-1]) if lines else {}, reply["stderr"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=120)


_server: ForkServer | None = None


@pytest.fixture(scope="module", autouse=True)
def _fork_server() -> Iterator[None]:
    global _server
    _server = ForkServer()
    yield
    _server.close()
    _server = None


def run_child(script: str, *args: str) -> ChildResult:
    """Run `script` in a fresh forked process (a 120 s hang guard); its last stdout line parsed as JSON."""
    assert _server is not None
    return _server.run(script, *args)


def assert_clean(res: ChildResult, expected_rc: int) -> None:
    """The child ended as expected, and never through an uncaught exception or a signal."""
    assert "Traceback" not in res.stderr, res.stderr
    assert res.rc == expected_rc, f"rc={res.rc} out={res.out} stderr={res.stderr[-2000:]}"


def open_in_child(tmp_path: Path, blob: bytes, *args: str) -> ChildResult:
    path = tmp_path / "case.gguf"
    path.write_bytes(blob)
    return run_child(_OPEN_CHILD, str(path), *args)


def expect_rejected(tmp_path: Path, blob: bytes, pattern: str, *args: str) -> str:
    res = open_in_child(tmp_path, blob, *args)
    assert_clean(res, REJECTED)
    assert res.out["seconds"] < MAX_PARSE_SECONDS and res.out["peak_bytes"] < MAX_PEAK_BYTES, res.out
    message = res.out["error"]
    assert re.search(pattern, message), f"{message!r} does not match {pattern!r}"
    return message


def expect_accepted(tmp_path: Path, blob: bytes) -> dict:
    res = open_in_child(tmp_path, blob)
    assert_clean(res, ACCEPTED)
    return res.out


def tensors_with(i: int, **changes: object) -> list[Tensor]:
    """The default tensors with tensor i changed."""
    ts = default_tensors()
    for k, v in changes.items():
        setattr(ts[i], k, v)
    return ts


def offsets_file(offsets: list[int | None]) -> bytes:
    return make_gguf(tensors=[
        Tensor(t.name, t.dims, t.qtype, offset=o) for t, o in zip(default_tensors(), offsets)
    ])


# Each case: (id, bytes, message regex). Expected exit code 3 (ModelFormatError).
REJECT_CASES: list[tuple[str, bytes, str]] = [
    # 2: data past the end, absurd offsets, offsets off the running padded offset
    ("2-data-past-eof", make_gguf()[:-100],
     r"tensor 'token_embd.weight'.*data \[\d+, \d+\) exceeds file size \d+"),
    ("2-data-past-eof-one-tensor", make_gguf(tensors=[Tensor("a", [64], 0, data=bytes(32))]),
     r"tensor 'a': data \[\d+, \d+\) exceeds file size (\d+); file is truncated \(expected at least \d+ bytes, got \1\)"),
    ("2-offset-u64-max", offsets_file([U64_MAX, None, None]),
     r"tensor 'output_norm.weight' = 18446744073709551615: offset is not a multiple of the alignment 32"),
    ("2-offset-u64-max-aligned", offsets_file([U64_MAX - 31, None, None]),
     r"tensor 'output_norm.weight' = 18446744073709551584: offset leaves a gap"),
    ("2-gap", offsets_file([0, 64, 192]), r"tensor 'blk.0.attn_q.weight' = 64: offset leaves a gap.*expected 32"),
    ("2-overlap", offsets_file([0, 0, 128]), r"tensor 'blk.0.attn_q.weight' = 0: offset overlaps.*expected 32"),
    ("2-overlap-last", offsets_file([0, 32, 96]), r"tensor 'token_embd.weight' = 96: offset overlaps.*expected 128"),
    ("2-reordered", offsets_file([32, 0, 128]), r"tensor 'output_norm.weight' = 32: offset leaves a gap.*expected 0"),
    ("2-misaligned", offsets_file([0, 33, 128]), r"tensor 'blk.0.attn_q.weight' = 33: .*multiple of the alignment 32"),
    # 3: element count overflow, computed in Python ints
    ("3-2^32x2^32", make_gguf(tensors=[Tensor("x", [1 << 32, 1 << 32, 1, 1])]),
     r"tensor 'x'.*element count 18446744073709551616 exceeds 2\^63-1"),
    ("3-cve-2024-21802", make_gguf(tensors=[Tensor("x", [4194305, 4194305, 211106198978564, 1])]),
     r"tensor 'x'.*element count \d+ exceeds 2\^63-1"),
    ("3-int64max-x2", make_gguf(tensors=[Tensor("x", [INT64_MAX, 2, 1, 1])]),
     r"tensor 'x'.*element count \d+ exceeds 2\^63-1"),
    ("3-4xint32max-each", make_gguf(tensors=[Tensor("x", [4 * INT32_MAX] * 4)]),
     r"tensor 'x'.*element count \d+ exceeds 2\^63-1"),
    ("3-2^62x2", make_gguf(tensors=[Tensor("x", [1 << 62, 2])]), r"element count 9223372036854775808 exceeds"),
    # 4: byte sizes that would wrap in 64 bits; sums larger than the file
    ("4-f32-2^62", make_gguf(tensors=[Tensor("x", [1 << 62])]),
     r"tensor 'x'.*data size 18446744073709551616 bytes exceeds file size \d+"),
    ("4-f32-sizemax/4", make_gguf(tensors=[Tensor("x", [U64_MAX // 4])]), r"tensor 'x'.*exceeds file size"),
    ("4-q8_0-bytes-wrap", make_gguf(tensors=[Tensor("x", [1 << 62], 8)]), r"tensor 'x'.*exceeds file size"),
    ("4-f16-2^31x2^31", make_gguf(tensors=[Tensor("x", [1 << 31, 1 << 31], 1)]), r"tensor 'x'.*exceeds file size"),
    ("4-two-i8-huge", make_gguf(tensors=[Tensor("a", [0x7FFFFFFFFFFFFFC0], 24, data=bytes(16)),
                                         Tensor("b", [0x7FFFFFFFFFFFFFC0], 24, data=bytes(16))]),
     r"tensor 'a'.*data size 9223372036854775744 bytes exceeds file size"),
    ("4-sum-exceeds-file", make_gguf(tensors=[Tensor("a", [8], data=bytes(32)), Tensor("b", [64], data=b"")]),
     r"tensor 'b'.*exceeds file size"),
    # 5: counts far beyond what the file can hold
    *[(f"5-{which}-{value:#x}", make_gguf(kvs=[], tensors=[], **{which: value}).ljust(64, b"\0"),
       rf"{which} = {value}: declares {value} (metadata entries|tensors) but only \d+ bytes are left")
      for which in ("n_kv", "n_tensors") for value in (U64_MAX, 1 << 63, 0x1D1D1D1D1D1D1D1D, 0xFFFFFFFF)],
    ("5-n_tensors-after-metadata", make_gguf(n_tensors=1000),
     r"n_tensors = 1000: declares 1000 tensors but only \d+ bytes are left"),
    # 6: string lengths
    ("6-key-length-u64max", make_gguf(kvs=[KV("general.name", STRING, Enc().string("x"), key_length=U64_MAX)]),
     r"metadata key #0 = 18446744073709551615: string length 18446744073709551615 exceeds the 64 KiB limit"),
    ("6-key-900MB", make_gguf(kvs=[KV("k", STRING, b"", key_length=900_000_000)]),
     r"metadata key #0 = 900000000: string length 900000000 exceeds the 64 KiB limit"),
    ("6-key-real-70KiB", make_gguf(kvs=[kv("k" * 70_000, UINT8, 1)]),
     r"metadata key #0 = 70000: .*exceeds the 64 KiB limit"),
    ("6-key-past-eof", make_gguf(kvs=[KV("k", STRING, b"", key_length=5000)]),
     r"metadata key #0.*truncated \(expected at least 5\d+ bytes, got \d+\)"),
    ("6-value-u64max", make_gguf(kvs=[KV("general.name", STRING, Enc().u64(U64_MAX))]),
     r"metadata 'general.name' = 18446744073709551615: string length \d+ exceeds the 64 MiB limit"),
    ("6-template-2GB", make_gguf(kvs=[KV("tokenizer.chat_template", STRING, Enc().u64(2 << 30) + b"{{")]),
     r"metadata 'tokenizer.chat_template' = 2147483648: string length 2147483648 exceeds the 64 MiB limit"),
    ("6-value-past-eof", make_gguf(kvs=[KV("general.name", STRING, Enc().u64(10_000) + b"abc")]),
     r"metadata 'general.name'.*truncated \(expected at least 10\d+ bytes, got \d+\)"),
    ("6-string-item-u64max", make_gguf(kvs=[KV("tokenizer.ggml.tokens", ARRAY,
                                               Enc().u32(STRING) + Enc().u64(1) + Enc().u64(U64_MAX))]),
     r"tokenizer.ggml.tokens' item 0 = 18446744073709551615: string length \d+ exceeds the 64 MiB limit"),
    # 7: array lengths and item types
    *[(f"7-array-len-{n:#x}", make_gguf(kvs=[KV("tokenizer.ggml.scores", ARRAY, Enc().u32(FLOAT32) + Enc().u64(n))]),
       rf"metadata 'tokenizer.ggml.scores' = {n}: array declares {n} items, file has room for \d+")
      for n in (1 << 62, U64_MAX // 64, U64_MAX, 1000)],
    ("7-string-array-n*8", make_gguf(kvs=[KV("tokenizer.ggml.tokens", ARRAY, Enc().u32(STRING) + Enc().u64(200))]),
     r"metadata 'tokenizer.ggml.tokens' = 200: array declares 200 items, file has room for \d+"),
    ("7-item-type-13", make_gguf(kvs=[KV("a", ARRAY, Enc().u32(13) + Enc().u64(1) + b"\0" * 8)]),
     r"metadata 'a' item type = 13: unknown value type 13"),
    ("7-item-type-ffffffff", make_gguf(kvs=[KV("a", ARRAY, Enc().u32(0xFFFFFFFF) + Enc().u64(1) + b"\0" * 8)]),
     r"metadata 'a' item type = -1: unknown value type -1"),
    ("7-array-16M-items", make_gguf(kvs=[KV("a", ARRAY, Enc().u32(UINT8) + Enc().u64((1 << 24) + 1))]),
     r"array declares 16777217 items, file has room for"),
    # 10: n_dims
    *[(f"10-n_dims-{n}", make_gguf(tensors=tensors_with(0, n_dims=n)),
       rf"tensor 'output_norm.weight' = {n}: has {n} dims \(must be 1 to 4\)")
      for n in (0, 5, 1_000_000, 0xFFFFFFFF)],
    # 11: negative dims
    ("11-dim-minus-1", make_gguf(tensors=tensors_with(0, dims=[-1])), r"tensor 'output_norm.weight'.*dim 0 is negative \(-1\)"),
    ("11-dim1-minus-1", make_gguf(tensors=tensors_with(1, dims=[32, -1])), r"tensor 'blk.0.attn_q.weight'.*dim 1 is negative"),
    ("11-dim-int64-min", make_gguf(tensors=tensors_with(0, dims=[8, 1, 1, -(1 << 63)])), r"dim 3 is negative \(-9223372036854775808\)"),
    # 12: tensor types
    *[(f"12-type-{t}", make_gguf(tensors=tensors_with(0, qtype=t)), rf"tensor 'output_norm.weight'.*uses type {t} \(unknown\)")
      for t in (40, 99, -1, 4, 5, 31, INT32_MAX)],
    *[(f"12-unsupported-{name}", make_gguf(tensors=[Tensor("blk.0.ffn_up.weight", [256], t, data=b"")]),
       rf"tensor 'blk.0.ffn_up.weight'.*type {name} is not supported by GGUF Lens")
      for t, name in ((35, "TQ2_0"), (34, "TQ1_0"), (15, "Q8_K"))],
    ("12-q4_k-row-100", make_gguf(tensors=tensors_with(2, dims=[100, 2])),
     r"tensor 'token_embd.weight'.*row size 100 is not a multiple of Q4_K block size 256"),
    ("12-q8_0-row-33", make_gguf(tensors=tensors_with(1, dims=[33, 2])),
     r"row size 33 is not a multiple of Q8_0 block size 32"),
    # 13: alignment
    *[(f"13-align-{a}", make_gguf(extra_kvs=[kv("general.alignment", UINT32, a)]),
       rf"general.alignment = {a}: alignment must be a power of two between 1 and 1 MiB \(1048576\), stored as UINT32")
      for a in (0, 13, 1 << 31, 1 << 21, 0xFFFFFFFF, 48)],
    ("13-align-int32", make_gguf(extra_kvs=[kv("general.alignment", INT32, 32)]),
     r"general.alignment = 32: stored as INT32; alignment must be a power of two"),
    ("13-align-uint64", make_gguf(extra_kvs=[kv("general.alignment", UINT64, 32)]), r"stored as UINT64"),
    ("13-align-string", make_gguf(extra_kvs=[kv("general.alignment", STRING, "32")]),
     r"general.alignment = '32': stored as STRING"),
    # 14: keys and names
    ("14-duplicate-key", make_gguf(extra_kvs=[kv("general.name", STRING, "again")]),
     r"metadata 'general.name': duplicate key \(entries #1 and #7\)"),
    ("14-duplicate-tensor", make_gguf(tensors=tensors_with(1, name="output_norm.weight")),
     r"tensor 'output_norm.weight': duplicate tensor name \(tensor #1\)"),
    ("14-empty-key", make_gguf(extra_kvs=[kv("", UINT8, 1)]), r"metadata key #7: metadata key is empty"),
    ("14-empty-tensor-name", make_gguf(tensors=tensors_with(0, name="")), r"tensor #0 name: tensor name is empty"),
    ("14-name-64-bytes", make_gguf(tensors=tensors_with(0, name="n" * 64)), r"tensor #0 name = b'n+': name is 64 bytes \(max 63\)"),
    ("14-name-huge", make_gguf(tensors=tensors_with(0, name="n" * 5000)), r"tensor #0 name.*name is 5000 bytes \(max 63\)"),
    ("14-name-length-u64max", make_gguf(tensors=tensors_with(0, name_length=U64_MAX)),
     r"tensor #0 name = 18446744073709551615: string length \d+ exceeds"),
    ("14-key-not-utf8", make_gguf(extra_kvs=[kv(b"general.\xff\xfe", UINT8, 1)]),
     r"metadata key #7 = b'general.\\xff\\xfe': metadata key is not valid UTF-8"),
    ("14-name-not-utf8", make_gguf(tensors=tensors_with(0, name=b"blk.\xc3\x28.w")),
     r"tensor #0 name = b'blk.\\xc3\(.w': tensor name is not valid UTF-8"),
    ("14-kv-type-13", make_gguf(extra_kvs=[KV("x", 13, b"\0" * 8)]), r"metadata 'x' = 13: unknown value type 13"),
    ("14-kv-type-minus-1", make_gguf(extra_kvs=[KV("x", 0xFFFFFFFF, b"\0" * 8)]), r"metadata 'x' = -1: unknown value type -1"),
    # 15: magic and version
    *[(f"15-magic-{name}", magic.ljust(64, b"\0"), r"magic = b'.*': not a GGUF file")
      for name, magic in (("FUGG", b"FUGG\x03\0\0\0"), ("GGML", b"GGML"), ("GGJT", b"GGJT\x03\0\0\0"),
                          ("lmgg", b"lmgg"), ("png", b"\x89PNG\r\n\x1a\n"), ("zeros", b"\0" * 8),
                          ("text", b"hello world"))],
    ("15-magic-short", b"PK", r"magic = b'PK': not a GGUF file"),
    ("15-version-0", make_gguf(version=0), r"version = 0: file is version 0; GGUF Lens supports versions 2-3"),
    ("15-version-1", make_gguf(version=1), r"version = 1: GGUF v1 is no longer supported"),
    ("15-version-4", make_gguf(version=4), r"version = 4: file is version 4; GGUF Lens supports versions 2-3"),
    ("15-version-ffffffff", make_gguf(version=0xFFFFFFFF), r"file is version 4294967295"),
    ("15-version-byteswapped", make_gguf(version=0x03000000), r"version = 50331648: looks byte-swapped; big-endian"),
    ("15-big-endian-file", make_gguf(order=">", kvs=[kv("general.name", STRING, "be", order=">")],
                                     tensors=[Tensor("a", [8])]),
     r"big-endian GGUF files are not supported"),
]


@pytest.mark.parametrize(("blob", "pattern"), [c[1:] for c in REJECT_CASES], ids=[c[0] for c in REJECT_CASES])
def test_rejected(tmp_path: Path, blob: bytes, pattern: str) -> None:
    """RELIABILITY.md cases 2-7 and 10-15: a clear ModelFormatError, nothing else."""
    expect_rejected(tmp_path, blob, pattern)


def _nested(depth: int) -> KV:
    """An array nested `depth` deep: ARRAY of ARRAY of ... of one empty UINT8 array."""
    enc = Enc()
    payload = enc.u32(UINT8) + enc.u64(0)
    for _ in range(depth - 1):
        payload = enc.u32(ARRAY) + enc.u64(1) + payload
    return KV("deep", ARRAY, payload)


@pytest.mark.parametrize("depth", [3, 10, 5000])
@pytest.mark.parametrize("recursion_limit", [None, 10**6])
def test_case8_nesting_too_deep(tmp_path: Path, depth: int, recursion_limit: int | None) -> None:
    """Case 8: deep array nesting is rejected by a depth cap, even with a huge recursion limit."""
    blob = make_gguf(extra_kvs=[_nested(depth)])
    args = () if recursion_limit is None else (str(recursion_limit),)
    expect_rejected(tmp_path, blob, r"metadata 'deep': array nesting too deep \(max 2\)", *args)


def test_case8_two_levels_accepted(tmp_path: Path) -> None:
    """Case 8: an array of arrays (depth 2) is still read."""
    expect_accepted(tmp_path, make_gguf(extra_kvs=[_nested(2)]))


_TRUNCATION_CHILD = _CHILD_PRELUDE + """
import os
src = open(sys.argv[1], "rb").read()
out = []
for n in json.loads(sys.argv[2]):
    path = sys.argv[1] + ".cut"
    with open(path, "wb") as fh:
        fh.write(src[:n])
    try:
        with open_gguf(path) as f:
            for name in f.tensors:
                f.rows(name).sum()
        out.append([n, None])
    except ModelFormatError as exc:
        out.append([n, str(exc)])
print(json.dumps({"results": out}))
"""
_TRUNCATED = r"truncated.*\(expected at least (\d+) bytes, got (\d+)\); re-download it"


def test_case9_truncated_at_every_byte(tmp_path: Path) -> None:
    """Case 9: every prefix of a small valid file (header, metadata, tensor infos, data, 0 bytes) is rejected."""
    layout = Layout()
    blob = make_gguf(layout=layout)
    assert layout.tensor_ends[-1] == layout.size  # the last tensor ends at EOF: any cut loses data
    src = tmp_path / "valid.gguf"
    src.write_bytes(blob)
    lengths = list(range(0, layout.size))
    res = run_child(_TRUNCATION_CHILD, str(src), json.dumps(lengths))
    assert_clean(res, 0)
    results = dict(res.out["results"])
    assert sorted(results) == lengths
    for n, message in results.items():
        assert message is not None, f"a file cut to {n} bytes was accepted"
        m = re.search(_TRUNCATED, message)
        assert m, f"cut to {n} bytes: {message!r}"
        assert int(m.group(2)) == n and int(m.group(1)) > n, message
    # the region boundaries the table names, spelled out
    assert "got 0)" in results[0]
    assert f"exceeds file size {layout.size - 1}" in results[layout.size - 1]  # 1 byte short of the data
    assert "token_embd.weight" in results[layout.size - 1]


def test_case9_header_only_file_accepted(tmp_path: Path) -> None:
    """Case 9: a file with no tensors (upstream HEADER_EMPTY) is accepted, with or without final padding."""
    assert expect_accepted(tmp_path, build_gguf())["shapes"] == {}  # 24 bytes: magic, version, counts
    layout = Layout()
    blob = make_gguf(tensors=[], layout=layout)
    assert expect_accepted(tmp_path, blob)["shapes"] == {}
    assert expect_accepted(tmp_path, blob[: layout.tensor_infos_start])["shapes"] == {}


def test_case11_zero_dims_accepted(tmp_path: Path) -> None:
    """Case 11: a zero dim is an empty tensor, not a ZeroDivisionError."""
    tensors = [Tensor("a", [0]), Tensor("b", [8, 0]), Tensor("c", [0, 4], 12), Tensor("d", [8])]
    out = expect_accepted(tmp_path, make_gguf(tensors=tensors))
    assert out["shapes"] == {"a": [0], "b": [8, 0], "c": [0, 4], "d": [8]}


def test_case13_legal_alignments_accepted(tmp_path: Path) -> None:
    """Case 13: the limit does not reject legal alignments (1, 64, 1 MiB)."""
    for a in (1, 64, 1 << 20):
        blob = make_gguf(extra_kvs=[kv("general.alignment", UINT32, a)], alignment=a)
        assert expect_accepted(tmp_path, blob)["ok"]


def test_case14_name_63_bytes_accepted(tmp_path: Path) -> None:
    """Case 14: a 63-byte tensor name (GGML_MAX_NAME - 1) is legal."""
    out = expect_accepted(tmp_path, make_gguf(tensors=tensors_with(0, name="n" * 63)))
    assert "n" * 63 in out["shapes"]


def test_case14_non_utf8_values_replaced(tmp_path: Path) -> None:
    """Case 14: non-UTF-8 string values are kept with replacement characters and a warning."""
    blob = make_gguf(extra_kvs=[
        kv("general.description", STRING, b"caf\xe9"),
        kv("tokenizer.ggml.merges", ARRAY, [b"a b", b"\xff \xfe", b"c d"], STRING),
    ])
    warnings = expect_accepted(tmp_path, blob)["warnings"]
    assert any("general.description" in w and "not valid UTF-8" in w for w in warnings), warnings
    assert any("tokenizer.ggml.merges" in w and "1 of 3" in w for w in warnings), warnings


def test_case15_short_gguf_prefix_is_truncated(tmp_path: Path) -> None:
    """Case 15: 'GG' could be the start of a GGUF file: it is reported as truncated, not as bad magic."""
    expect_rejected(tmp_path, b"GG", _TRUNCATED)


# -- case 25: the file changes under an open GGUFFile -----------------------------------------------

_CHANGE_CHILD = _CHILD_PRELUDE + """
import os, time
path, action, touch_first = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
f = open_gguf(path)
name = list(f.tensors)[-1]
if touch_first:
    f.raw(name).sum()  # the mapping exists before the change
time.sleep(0.01)
if action == "truncate":
    os.truncate(path, f.data_offset + 1)
elif action == "truncate-to-zero":
    os.truncate(path, 0)
elif action == "replace":
    tmp = path + ".new"
    with open(tmp, "wb") as fh:
        fh.write(open(path, "rb").read())
    os.replace(tmp, path)
elif action == "delete":
    os.unlink(path)
elif action == "append":
    with open(path, "ab") as fh:
        fh.write(b"x")
elif action == "touch":
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
try:
    data = f.raw(name)
    print(json.dumps({"ok": True, "sum": int(data.sum())}))  # would SIGBUS on a truncated mapping
except ModelFormatError as exc:
    print(json.dumps({"error": str(exc), "field": exc.field}))
    sys.exit(3)
"""


@pytest.mark.parametrize("touch_first", [False, True], ids=["unmapped", "mapped"])
@pytest.mark.parametrize("action", ["truncate", "truncate-to-zero", "replace", "delete", "append", "touch"])
def test_case25_file_changed_after_open(tmp_path: Path, action: str, touch_first: bool) -> None:
    """Case 25: raw() notices a truncated/replaced/deleted file before touching its pages (no SIGBUS)."""
    path = tmp_path / "model.gguf"
    path.write_bytes(make_gguf())
    res = run_child(_CHANGE_CHILD, str(path), action, "1" if touch_first else "0")
    assert_clean(res, REJECTED)
    assert re.search(r"^file = '.*model.gguf': model file changed on disk; reload it$", res.out["error"])


def test_case25_unchanged_file_still_reads(tmp_path: Path) -> None:
    """Case 25 control: with no change, raw() returns the bytes."""
    path = tmp_path / "model.gguf"
    path.write_bytes(make_gguf())
    res = run_child(_CHANGE_CHILD, str(path), "none", "1")
    assert_clean(res, ACCEPTED)
    assert res.out["ok"]


# -- the harness itself ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "rc", "stderr"), [
    ("raise ValueError('boom')", 1, "Traceback"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGBUS)", -7, ""),
    ("bytearray(2 << 30)", 1, "MemoryError"),
    ("print('{}'); sys.exit(3)", 3, ""),
])
def test_harness_reports_crashes(body: str, rc: int, stderr: str) -> None:
    """The children really are isolated and limited: a traceback, a signal or a 2 GiB allocation shows up."""
    res = run_child(_CHILD_PRELUDE + body)
    assert res.rc == rc and stderr in res.stderr, res
