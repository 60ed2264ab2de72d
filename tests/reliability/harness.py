"""Shared by the reliability and fuzz tests: forked children that load models under RLIMIT_AS and a timeout.

The fork server is test_gguf_hostile's, started with engine.model imported too, so each isolated child
costs a fork (milliseconds) instead of an interpreter start. A child ends with exit code 0 (accepted),
3 (ModelFormatError), 4 (another LensError: InferenceError, SettingError, ...); anything else (a
traceback, a signal, a timeout) is a failure of the case.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from engine.gguf import open_gguf, write_gguf
from engine.quant.types import GGMLType
from tests.engine.gguf.test_gguf_hostile import _FORK_SERVER, REPO, ChildResult, ForkServer

ACCEPTED, REJECTED, OTHER_LENS_ERROR = 0, 3, 4
GIB = 1 << 30
DEFAULT_LIMIT = 2 * GIB     # RLIMIT_AS of a child (the server's own mappings count: numpy, BLAS, the engine)
DEFAULT_TIMEOUT_S = 120.0  # a hang guard: a loaded 2-core machine must not reach it

_SERVER_IMPORTS = "import numpy, engine.errors, engine.gguf"
assert _SERVER_IMPORTS in _FORK_SERVER

# argv: [path, limit_bytes, options_json]. Prints one JSON line with what happened.
LOAD_CHILD = r"""
import json, logging, resource, sys, time, tracemalloc
path, limit, opts = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from engine.errors import LensError, ModelFormatError
from engine.model import load_model

class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []
    def emit(self, record):
        self.messages.append(record.getMessage())

collect = _Collect()
logging.getLogger().addHandler(collect)
logging.getLogger().setLevel(logging.WARNING)
if opts.get("trace"):
    tracemalloc.start()
t0, c0 = time.perf_counter(), time.process_time()
out = {}

def cost():
    peak = tracemalloc.get_traced_memory()[1] if tracemalloc.is_tracing() else None
    # cpu_seconds: this process's own CPU time, the bound the tests check (wall time depends on the machine's load)
    return {"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0, "peak_bytes": peak,
            "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "log": collect.messages}

try:
    kw = {"dense_budget": opts["dense_budget"]} if "dense_budget" in opts else {}
    model = load_model(path, warm=False, **kw)
    out.update(cost())
    tok = model.tokenizer
    out.update(ok=True, warnings=model.warnings, arch=model.arch, n_vocab=tok.n_vocab, bos=tok.bos_id,
               eos=tok.eos_id, add_bos=tok.add_bos, eog=sorted(tok.eog_ids), version=model.gguf.version,
               alignment=model.gguf.alignment, offsets={n: t.offset for n, t in model.gguf.tensors.items()})
    if "text" in opts:
        ids = tok.encode(opts["text"], add_special=True)
        out.update(ids=ids[:64], n_ids=len(ids), decoded=tok.decode(ids, skip_special=True),
                   texts=[tok.token_text(i) for i in ids[:64]])
    if "decode" in opts:
        out["decode"] = [tok.decode([i]) for i in opts["decode"]]
    if "chat" in opts:
        r = model.chat.render(opts["chat"])
        out.update(chat_text=r.text[-2000:], chat_len=len(r.text), chat_fallback=r.used_fallback,
                   chat_warning=r.warning, chat_builtin=model.chat.is_builtin)
    if opts.get("scan"):
        from engine.memory import scan_small_tensors
        out["scan"] = scan_small_tensors(model.gguf)
    if "generate" in opts:
        from engine.generate import GenerationConfig, generate
        from engine.sampler import SamplerSettings
        cfg = GenerationConfig(max_tokens=opts["generate"], sampler=SamplerSettings(temperature=0.0))
        prompt = tok.encode(opts.get("prompt", "hello"), add_special=True) or [0]
        steps = []
        try:
            for step in generate(model, prompt, cfg, cache=model.new_cache(64)):
                steps.append([step.token_id, step.finish_reason])
        except LensError as exc:
            out["generate_error"] = f"{type(exc).__name__}: {exc}"
        out["steps"] = steps
    out["log"] = collect.messages
    print(json.dumps(out, default=str))
except ModelFormatError as exc:
    print(json.dumps({"error": str(exc), "cls": type(exc).__name__, "field": exc.field, **cost()}, default=str))
    sys.exit(3)
except LensError as exc:
    print(json.dumps({"error": str(exc), "cls": type(exc).__name__, **cost()}, default=str))
    sys.exit(4)
"""


class LoaderServer(ForkServer):
    """test_gguf_hostile's fork server with engine.model (and so the tokenizer and chat) imported once."""

    def __init__(self, extra_imports: str = "engine.model, engine.memory, engine.generate") -> None:
        # every architecture module is imported now too (the registry imports them lazily otherwise), so all
        # children run one consistent snapshot of the engine even while its files are being edited
        script = _FORK_SERVER.replace(
            _SERVER_IMPORTS,
            f"{_SERVER_IMPORTS}, {extra_imports}\nfrom engine.models.registry import model_class; model_class('llama')",
        )
        env = {**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script], cwd=REPO, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )

    def request(self, script: str, *args: str, timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
        """The server's raw reply: rc, timed_out, stdout, stderr."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"script": script, "args": list(args), "timeout": timeout}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout + 30)
        if not ready:
            raise RuntimeError("fork server did not answer")
        return json.loads(self.proc.stdout.readline())

    def run(self, script: str, *args: str, timeout: float = DEFAULT_TIMEOUT_S) -> ChildResult:  # type: ignore[override]
        """Run script in a fresh child; fails the test on a timeout; its last stdout line parsed as JSON."""
        reply = self.request(script, *args, timeout=timeout)
        assert not reply["timed_out"], f"child ran past {timeout} s: {reply}"
        lines = reply["stdout"].strip().splitlines()
        return ChildResult(reply["rc"], json.loads(lines[-1]) if lines else {}, reply["stderr"])

    def load(self, path: Path, *, limit: int = DEFAULT_LIMIT, timeout: float = DEFAULT_TIMEOUT_S,
             **opts: Any) -> ChildResult:
        """load_model(path, warm=False) in a child, then the actions in opts (text, chat, generate, scan, ...)."""
        return self.run(LOAD_CHILD, str(path), str(limit), json.dumps(opts), timeout=timeout)


def assert_exit(res: ChildResult, expected_rc: int) -> None:
    """The child ended with expected_rc, and never through a traceback or a signal."""
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    assert res.rc == expected_rc, f"rc={res.rc} out={str(res.out)[:2000]} stderr={res.stderr[-2000:]}"


# -- building variants of a GGUF file ---------------------------------------------------------------

TensorSpec = tuple[str, GGMLType, tuple[int, ...], "bytes | np.ndarray"]


def read_tensors(path: Path) -> tuple[dict[str, Any], dict, list[TensorSpec]]:
    """(metadata, metadata_types, tensors as write_gguf specs with their raw bytes) of a GGUF file."""
    with open_gguf(path) as f:
        md = dict(f.metadata)
        types = dict(f.metadata_types)
        tensors = [(n, GGMLType(t.qtype), tuple(t.shape), bytes(f.raw(n))) for n, t in f.tensors.items()]
    md.pop("general.alignment", None)
    types.pop("general.alignment", None)
    return md, types, tensors


def rewrite_gguf(
    src: Path,
    dst: Path,
    *,
    set_md: dict[str, Any] | None = None,
    del_md: tuple[str, ...] = (),
    types: dict | None = None,
    drop: tuple[str, ...] = (),
    replace: dict[str, TensorSpec] | None = None,
    add: list[TensorSpec] | None = None,
    alignment: int = 32,
    version: int = 3,
) -> Path:
    """Copy a GGUF with metadata set/deleted and tensors dropped/replaced/added; types kept unless a value is set."""
    md, md_types, tensors = read_tensors(src)
    set_md = set_md or {}
    for key in del_md:
        md.pop(key, None)
    md.update(set_md)
    md_types = {k: v for k, v in md_types.items() if k in md and k not in set_md} | (types or {})
    replace = replace or {}
    out = [replace.get(t[0], t) for t in tensors if t[0] not in drop] + list(add or [])
    write_gguf(dst, md, out, metadata_types=md_types, alignment=alignment, version=version)
    return dst


def f32_tensor(name: str, values: np.ndarray) -> TensorSpec:
    """An F32 tensor spec; `values` in numpy order (rows, row length), ggml shape reversed."""
    v = np.ascontiguousarray(values, dtype=np.float32)
    return (name, GGMLType.F32, tuple(reversed(v.shape)), v)


def f16_tensor(name: str, values: np.ndarray) -> TensorSpec:
    """An F16 tensor spec (NaN and Inf kept as fp16 NaN and Inf)."""
    v = np.ascontiguousarray(values, dtype=np.float16)
    return (name, GGMLType.F16, tuple(reversed(v.shape)), v)
