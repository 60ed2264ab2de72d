"""RELIABILITY.md cases 16-20, 30 (load-time part) and 35: valid GGUF containers with hostile model contents.

Every variant is a tiny model (tests/tiny_models.py, then edited) loaded with load_model(path, warm=False)
in a forked child under RLIMIT_AS 2 GiB and a 120 s hang guard (tests/reliability/harness.py). A rejected
file must end the child with a ModelFormatError (exit 3) whose message names the key or tensor and the
value, within 1 s and 64 MiB; an accepted one must load, tokenize and generate without any other
exception. Tracebacks, signals and timeouts fail the case.
"""
from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.gguf import GGUFValueType as VT
from engine.gguf import write_gguf
from engine.quant import quantize
from engine.quant.types import GGMLType
from tests.conftest import GEMMA3_FILE, SMOLLM2_FILE, model_path
from tests.reliability.harness import (
    ACCEPTED,
    GIB,
    OTHER_LENS_ERROR,
    REJECTED,
    LoaderServer,
    assert_exit,
    f16_tensor,
    f32_tensor,
    read_tensors,
    rewrite_gguf,
)
from tests.tiny_models import make_tiny_gemma3, make_tiny_llama, tiny_vocab

N_VOCAB = len(tiny_vocab()[0])  # 269: 3 specials, 256 byte tokens, 10 merges
MAX_CPU_SECONDS = 30.0          # RELIABILITY.md: bounded resources for small malformed files (CPU time: no count
                                # in a hostile header may make the loader loop; wall time would depend on the load)
MAX_PEAK_BYTES = 64 << 20
K = "tokenizer.ggml."

Builder = Callable[[Path], Path]


def params(cases: list[tuple]) -> list[Any]:
    """(id, *values[, mark]) rows -> pytest.param(*values, id=id, marks=mark)."""
    out = []
    for name, *values in cases:
        marks = [values.pop()] if values and isinstance(values[-1], pytest.MarkDecorator) else []
        out.append(pytest.param(*values, id=name, marks=marks))
    return out


@pytest.fixture(scope="module")
def server() -> Iterator[LoaderServer]:
    srv = LoaderServer()
    yield srv
    srv.close()


# -- building variants ------------------------------------------------------------------------------

def llama(overrides: dict[str, Any] | None = None, **kw: Any) -> Builder:
    """A tiny llama with metadata overrides (make_tiny_llama's keyword arguments pass through)."""
    return lambda dst: make_tiny_llama(dst, overrides=overrides, **kw)


def edit(base: str = "llama", **changes: Any) -> Builder:
    """A tiny llama or gemma3 rewritten with rewrite_gguf(**changes) (metadata deleted, tensors replaced...)."""

    def build(dst: Path) -> Path:
        src = dst.with_name("src-" + dst.name)
        (make_tiny_llama if base == "llama" else make_tiny_gemma3)(src)
        return rewrite_gguf(src, dst, **changes)

    return build


def _tensor_table() -> dict[str, dict[str, tuple[GGMLType, tuple[int, ...], bytes]]]:
    """(type, shape, bytes) of every tensor of the tiny llama and gemma3 (seed 0), for edits."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for base, make in (("llama", make_tiny_llama), ("gemma3", make_tiny_gemma3)):
            _, _, tensors = read_tensors(make(Path(tmp) / f"{base}.gguf"))
            out[base] = {n: (q, s, d) for n, q, s, d in tensors}
    return out


_TENSORS = _tensor_table()
_Q = _TENSORS["llama"]["blk.0.attn_q.weight"]


def norm(name: str, n: int = 64, qtype: GGMLType = GGMLType.F32, poison: float | None = None, at: int = 0):
    """A norm weight of n ones in qtype, optionally with one NaN/Inf at index `at`."""
    v = np.ones(n, np.float32)
    if poison is not None:
        v[at] = poison
    if qtype == GGMLType.F32:
        return f32_tensor(name, v)
    if qtype == GGMLType.F16:
        return f16_tensor(name, v)
    return (name, qtype, (n,), quantize(v.reshape(1, n), qtype))


def matrix(name: str, shape: tuple[int, ...], qtype: GGMLType = GGMLType.F32, poison: float | None = None):
    """A (ggml shape) matrix of small values in F32/F16, optionally with one NaN/Inf."""
    v = np.full(tuple(reversed(shape)), 0.01, np.float32)
    if poison is not None:
        v.reshape(-1)[7] = poison
    return f32_tensor(name, v) if qtype == GGMLType.F32 else f16_tensor(name, v)


def expect_rejected(server: LoaderServer, path: Path, pattern: str) -> str:
    """A ModelFormatError whose message matches pattern, within the time and memory bounds."""
    res = server.load(path, trace=True)
    assert_exit(res, REJECTED)
    message = res.out["error"]
    assert res.out["cls"] == "ModelFormatError", res.out
    assert re.search(pattern, message), f"{message!r} does not match {pattern!r}"
    assert res.out["cpu_seconds"] < MAX_CPU_SECONDS and res.out["peak_bytes"] < MAX_PEAK_BYTES, res.out
    return message


def expect_loaded(server: LoaderServer, path: Path, **opts: Any) -> dict[str, Any]:
    """load_model accepted the file; the actions in opts ran without an exception."""
    res = server.load(path, **opts)
    assert_exit(res, ACCEPTED)
    assert res.out["ok"], res.out
    return res.out


def run_rejected(server: LoaderServer, tmp_path: Path, build: Builder, pattern: str) -> str:
    return expect_rejected(server, build(tmp_path / "case.gguf"), pattern)


# -- case 16: metadata type confusion in the vocabulary ---------------------------------------------

CASE16: list[tuple] = [
    ("scores-int8", llama({K + "scores": np.zeros(N_VOCAB, np.int8)}),
     rf"tokenizer\.ggml\.scores: must be float32\[{N_VOCAB}\], got int8\[{N_VOCAB}\]"),
    ("scores-uint8", llama({K + "scores": np.zeros(N_VOCAB, np.uint8)}), r"scores: must be float32\[269\], got uint8\[269\]"),
    ("scores-float64", llama({K + "scores": np.zeros(N_VOCAB, np.float64)}), r"scores: must be float32\[269\], got float64\[269\]"),
    ("scores-int8-8", llama({K + "scores": np.zeros(8, np.int8)}), r"scores: must be float32\[269\], got int8\[8\]"),
    ("scores-short", llama({K + "scores": np.zeros(N_VOCAB - 1, np.float32)}), r"scores: must be float32\[269\], got float32\[268\]"),
    ("scores-long", llama({K + "scores": np.zeros(N_VOCAB + 7, np.float32)}), r"scores: must be float32\[269\], got float32\[276\]"),
    ("scores-strings", llama({K + "scores": ["0.5"] * N_VOCAB}), r"scores: must be float32\[269\], got list\[269\] of str"),
    ("scores-scalar", llama({K + "scores": 1.5}), r"scores: must be float32\[269\], got float"),
    ("token-type-int8", llama({K + "token_type": np.ones(N_VOCAB, np.int8)}),
     r"tokenizer\.ggml\.token_type: must be int32\[269\], got int8\[269\]"),
    ("token-type-float32", llama({K + "token_type": np.ones(N_VOCAB, np.float32)}), r"token_type: must be int32\[269\], got float32\[269\]"),
    ("token-type-short", llama({K + "token_type": np.ones(100, np.int32)}), r"token_type: must be int32\[269\], got int32\[100\]"),
    ("token-type-long", llama({K + "token_type": np.ones(N_VOCAB + 1, np.int32)}), r"token_type: must be int32\[269\], got int32\[270\]"),
    ("tokens-int32", llama({K + "tokens": np.arange(N_VOCAB, dtype=np.int32)}),
     r"tokenizer\.ggml\.tokens: must be an array of strings, got int32\[269\]"),
    ("tokens-uint8", llama({K + "tokens": np.zeros(N_VOCAB, np.uint8)}), r"tokens: must be an array of strings, got uint8\[269\]"),
    ("tokens-string", llama({K + "tokens": "hello"}), r"tokens: must be an array of strings, got str"),
    ("tokens-empty", edit(set_md={K + "tokens": []}, types={K + "tokens": (VT.ARRAY, VT.STRING)}),
     r"tokenizer\.ggml\.tokens: must hold 1 to \d+ tokens, holds 0"),
    ("tokens-missing", edit(del_md=(K + "tokens",)), r"tokenizer\.ggml\.tokens: missing"),
    ("merges-int32", llama({K + "merges": np.arange(10, dtype=np.int32)}),
     r"tokenizer\.ggml\.merges: must be an array of strings, got int32\[10\]"),
    ("merges-missing", edit(del_md=(K + "merges",)), r"tokenizer\.ggml\.merges: must be an array of strings, got NoneType"),
    ("model-int", llama({K + "model": 5}), r"tokenizer\.ggml\.model = 5: unsupported tokenizer"),
    ("model-unknown", llama({K + "model": "bert"}), r"tokenizer\.ggml\.model = 'bert': unsupported tokenizer"),
    ("model-missing", edit(del_md=(K + "model",)), r"tokenizer\.ggml\.model: missing"),
    ("model-int32-array", llama({K + "model": np.array([1, 2], np.int32)}), r"tokenizer\.ggml\.model.*unsupported tokenizer"),
    ("model-empty-array", llama({K + "model": np.zeros(0, np.int32)}), r"tokenizer\.ggml\.model.*unsupported tokenizer"),
    ("tokens-longer-than-embd", llama({K + "tokens": tiny_vocab()[0] + ["extra"],
                                       K + "token_type": np.ones(N_VOCAB + 1, np.int32)}),
     r"token_embd\.weight: has 269 rows but the vocabulary has 270 tokens"),
]


@pytest.mark.parametrize(("build", "pattern"), params(CASE16))
def test_case16_vocab_type_confusion_rejected(server: LoaderServer, tmp_path: Path, build: Builder, pattern: str) -> None:
    """Case 16: vocabulary arrays of the wrong type or length are rejected naming the key, never cast."""
    run_rejected(server, tmp_path, build, pattern)


@pytest.mark.parametrize("value", [
    pytest.param(5, id="int"),
    pytest.param(2.5, id="float"),
    pytest.param(np.array([1, 2], np.int32), id="int32-array"),
    pytest.param(["llama3", "default"], id="string-array"),
    pytest.param(np.zeros(0, np.float32), id="empty-array"),
])
def test_case16_pre_tokenizer_of_the_wrong_type(server: LoaderServer, tmp_path: Path, value: Any) -> None:
    """Case 16: tokenizer.ggml.pre that is not a string is ignored with a warning or rejected naming the key."""
    res = server.load(llama({K + "pre": value})(tmp_path / "m.gguf"), text="hello")
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.rc in (ACCEPTED, REJECTED), res
    if res.rc == REJECTED:
        assert "tokenizer.ggml.pre" in res.out["error"], res.out
    else:
        assert any("tokenizer.ggml.pre" in m for m in res.out["log"]), res.out["log"]


def test_case16_non_bool_flags_ignored(server: LoaderServer, tmp_path: Path) -> None:
    """Case 16: a flag of the wrong type (add_bos_token = 'true') is ignored with a warning, not cast."""
    path = llama({K + "add_bos_token": "true", K + "add_eos_token": 1})(tmp_path / "m.gguf")
    out = expect_loaded(server, path, text="hello")
    assert not out["add_bos"]
    assert any(re.search(r"add_bos_token should be a bool, got str; ignoring it", m) for m in out["log"]), out["log"]
    assert any(re.search(r"add_eos_token should be a bool, got int", m) for m in out["log"]), out["log"]


# -- case 17: special token ids outside the vocabulary --------------------------------------------------

CASE17: list[tuple[str, dict[str, Any], str, str]] = [
    # (id, overrides, role whose id must end up disabled, the warning naming key and value)
    ("eos-u32-max", {K + "eos_token_id": np.uint32(2**32 - 1)}, "eos",
     r"tokenizer\.ggml\.eos_token_id = 4294967295 is not a token id below 269; disabling eos"),
    ("eos-u64-max", {K + "eos_token_id": np.uint64(2**64 - 1)}, "eos", r"eos_token_id = 18446744073709551615 is not a token id"),
    ("eos-minus-1", {K + "eos_token_id": np.int32(-1)}, "eos", r"eos_token_id = -1 is not a token id below 269"),
    ("eos-n-vocab", {K + "eos_token_id": N_VOCAB}, "eos", r"eos_token_id = 269 is not a token id below 269"),
    ("eos-string", {K + "eos_token_id": "2"}, "eos", r"eos_token_id = '2' is not a token id"),
    ("eos-float", {K + "eos_token_id": 2.0}, "eos", r"eos_token_id = 2.0 is not a token id"),
    ("eos-bool", {K + "eos_token_id": True}, "eos", r"eos_token_id = True is not a token id"),
    ("bos-n-vocab", {K + "bos_token_id": N_VOCAB, K + "add_bos_token": True}, "bos",
     r"tokenizer\.ggml\.bos_token_id = 269 is not a token id below 269; disabling bos"),
    ("bos-int64-min", {K + "bos_token_id": np.int64(-(2**63))}, "bos", r"bos_token_id = -9223372036854775808 is not a token id"),
    ("eot-huge", {K + "eot_token_id": 10**6}, "", r"eot_token_id = 1000000 is not a token id below 269; disabling eot"),
    ("eom-n-vocab", {K + "eom_token_id": N_VOCAB}, "", r"eom_token_id = 269 is not a token id"),
    ("fim-pad-negative", {K + "fim_pad_token_id": np.int32(-5)}, "", r"fim_pad_token_id = -5 is not a token id"),
    ("padding-2^31", {K + "padding_token_id": np.uint32(2**31)}, "", r"padding_token_id = 2147483648 is not a token id"),
    ("unknown-u32-max", {K + "unknown_token_id": np.uint32(2**32 - 1)}, "", r"unknown_token_id = 4294967295 is not a token id"),
    ("all-at-once", {K + "eos_token_id": np.uint32(2**32 - 1), K + "bos_token_id": N_VOCAB,
                     K + "eot_token_id": 10**9, K + "add_bos_token": True, K + "add_eos_token": True}, "eos",
     r"bos_token_id = 269 is not a token id"),
]


@pytest.mark.parametrize(("overrides", "role", "warning"), params(CASE17))
def test_case17_special_ids_out_of_range_disabled(
    server: LoaderServer, tmp_path: Path, overrides: dict[str, Any], role: str, warning: str
) -> None:
    """Case 17: an id outside the vocabulary is disabled with a warning; encode and the stop check still work."""
    path = llama(overrides)(tmp_path / "m.gguf")
    out = expect_loaded(server, path, text="hello world", generate=4)
    assert any(re.search(warning, m) for m in out["log"]), out["log"]
    if role:
        assert out[role] is None, out
    assert all(0 <= i < out["n_vocab"] for i in out["eog"]), out["eog"]
    assert all(0 <= i < out["n_vocab"] for i in out["ids"])
    assert out["steps"] and out["steps"][-1][1] in ("length", "eos"), out
    if overrides.get(K + "add_bos_token") and role == "bos":
        assert not out["add_bos"]
        assert any("add_bos is set but the model has no valid BOS token" in m for m in out["log"]), out["log"]


def tiny_vocab_model(n: int, tokenizer: str) -> Builder:
    """The tiny llama cut to its first n tokens (embedding rows too), with no special-token ids: defaults apply."""

    def build(dst: Path) -> Path:
        src = make_tiny_llama(dst.with_name("src-" + dst.name))
        qtype, (dim, _), data = _TENSORS["llama"]["token_embd.weight"]
        tokens, types, _ = tiny_vocab()
        specials = {K + "tokens": tokens[:n], K + "token_type": types[:n], K + "model": tokenizer}
        if tokenizer == "llama":
            specials[K + "scores"] = -np.arange(n, dtype=np.float32)
        return rewrite_gguf(
            src, dst, set_md=specials, del_md=(K + "bos_token_id", K + "eos_token_id", K + "add_bos_token"),
            replace={"token_embd.weight": ("token_embd.weight", qtype, (dim, n), data[: n * dim * 4])},
        )

    return build


@pytest.mark.parametrize("tokenizer", ["llama", "gpt2"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_case17_tiny_vocab_default_ids(server: LoaderServer, tmp_path: Path, n: int, tokenizer: str) -> None:
    """Case 17: a 1-3 token vocabulary whose default bos/eos/unk ids do not exist loads, encodes and generates."""
    out = expect_loaded(server, tiny_vocab_model(n, tokenizer)(tmp_path / "m.gguf"), text="hello", generate=4,
                        decode=list(range(n)) + [n, -1, 2**31])
    assert out["n_vocab"] == n
    for role in ("bos", "eos"):
        assert out[role] is None or 0 <= out[role] < n, out
    assert all(0 <= i < n for i in out["eog"]) and all(0 <= i < n for i in out["ids"]), out
    assert out["decode"][n:] == ["", "", ""]  # ids outside the vocabulary decode to nothing
    assert out["steps"] and all(0 <= t < n for t, _ in out["steps"] if t >= 0), out


# -- case 18: hyper-parameters out of range ---------------------------------------------------------

L = "llama."
CASE18: list[tuple] = [
    ("block-count-0", llama({L + "block_count": 0}), r"llama\.block_count = 0: must be between 1 and 512"),
    ("block-count-513", llama({L + "block_count": 513}), r"llama\.block_count = 513: must be between 1 and 512"),
    ("block-count-u32-max", llama({L + "block_count": np.uint32(2**32 - 1)}), r"llama\.block_count = 4294967295: must be between"),
    ("block-count-u64-max", llama({L + "block_count": np.uint64(2**64 - 1)}), r"llama\.block_count = 18446744073709551615: must"),
    ("block-count-minus-1", llama({L + "block_count": -1}), r"llama\.block_count = -1: must be between 1 and 512"),
    ("block-count-string", llama({L + "block_count": "2"}), r"llama\.block_count = '2': must be an integer, got str"),
    ("block-count-float", llama({L + "block_count": 2.0}), r"llama\.block_count = 2.0: must be an integer, got float"),
    ("block-count-bool", llama({L + "block_count": True}), r"llama\.block_count = True: must be an integer, got bool"),
    ("block-count-array", llama({L + "block_count": np.array([2, 2], np.int32)}), r"llama\.block_count.*must be an integer, got ndarray"),
    ("block-count-missing", edit(del_md=(L + "block_count",)), r"llama\.block_count: required metadata key is missing"),
    ("block-count-more-than-tensors", llama({L + "block_count": 3}), r"blk\.2\.attn_norm\.weight: required tensor is missing"),
    ("head-count-0", llama({L + "attention.head_count": 0}), r"llama\.attention\.head_count = 0"),
    ("head-count-5-of-64", llama({L + "attention.head_count": 5}),
     r"llama\.attention\.head_count = 5: does not divide embedding_length 64"),
    ("head-count-2048", llama({L + "attention.head_count": 2048, L + "attention.head_count_kv": 2048, L + "attention.key_length": 16}),
     r"llama\.attention\.head_count = 2048: must be between 1 and 1024"),
    ("head-count-kv-above-head-count", llama({L + "attention.head_count_kv": 8}),
     r"llama\.attention\.head_count_kv = 8: must be between 1 and 4"),
    ("head-count-kv-0", llama({L + "attention.head_count_kv": 0}), r"llama\.attention\.head_count_kv = 0: must be between 1 and 4"),
    ("head-count-kv-3-of-4", llama({L + "attention.head_count_kv": 3}),
     r"llama\.attention\.head_count_kv = 3: does not divide head_count 4"),
    ("context-length-0", llama({L + "context_length": 0}), r"llama\.context_length = 0: must be between 1 and 16777216"),
    ("context-length-2^32", llama({L + "context_length": 2**32}), r"llama\.context_length = 4294967296: must be between 1 and"),
    ("context-length-minus", llama({L + "context_length": -8}), r"llama\.context_length = -8: must be between"),
    ("rope-dim-above-head-dim", llama({L + "rope.dimension_count": 32}),
     r"llama\.rope\.dimension_count = 32: must be between 2 and 16"),
    ("rope-dim-0", llama({L + "rope.dimension_count": 0}), r"llama\.rope\.dimension_count = 0: must be between 2 and 16"),
    ("embedding-length-2^40", llama({L + "embedding_length": 2**40}), r"llama\.embedding_length = 1099511627776: must be between"),
    ("embedding-length-0", llama({L + "embedding_length": 0}), r"llama\.embedding_length = 0|head_count = 4: does not divide"),
    ("ffn-length-0", llama({L + "feed_forward_length": 0}), r"llama\.feed_forward_length = 0: must be between"),
    ("ffn-length-2^40", llama({L + "feed_forward_length": 2**40}), r"llama\.feed_forward_length = 1099511627776: must be between"),
    ("key-length-odd", llama({L + "attention.key_length": 15}), r"llama\.attention\.key_length = 15: must be even"),
    ("key-length-2^20", llama({L + "attention.key_length": 2**20}), r"llama\.attention\.key_length = 1048576: must be between"),
    ("rms-eps-0", llama({L + "attention.layer_norm_rms_epsilon": 0.0}), r"layer_norm_rms_epsilon = 0.0: must be in \(0, 1\)"),
    ("rms-eps-nan", llama({L + "attention.layer_norm_rms_epsilon": float("nan")}), r"layer_norm_rms_epsilon = nan: must be finite"),
    ("rms-eps-string", llama({L + "attention.layer_norm_rms_epsilon": "1e-5"}), r"layer_norm_rms_epsilon = '1e-5': must be a number"),
    ("rope-base-0", llama({L + "rope.freq_base": 0.0}), r"llama\.rope\.freq_base = 0.0: must be in \[1, 1e12\)"),
    ("rope-base-inf", llama({L + "rope.freq_base": float("inf")}), r"llama\.rope\.freq_base = inf: must be finite"),
    ("architecture-unknown", llama({"general.architecture": "mamba"}), r"general\.architecture = 'mamba': is not supported"),
    ("architecture-int", llama({"general.architecture": 7}), r"general\.architecture = 7: is missing or not a string"),
    ("gemma3-head-count-0", edit("gemma3", set_md={"gemma3.attention.head_count": 0}),
     r"gemma3\.attention\.head_count = 0: must be between 1 and 1024"),
    ("gemma3-block-count-600", edit("gemma3", set_md={"gemma3.block_count": 600}), r"gemma3\.block_count = 600: must be between 1 and 512"),
    ("gemma3-kv-above-heads", edit("gemma3", set_md={"gemma3.attention.head_count_kv": 4}),
     r"gemma3\.attention\.head_count_kv = 4: must be between 1 and 2"),
    ("gemma3-key-length-0", edit("gemma3", set_md={"gemma3.attention.key_length": 0}), r"gemma3\.attention\.key_length = 0: must be"),
    ("gemma3-key-length-negative", edit("gemma3", set_md={"gemma3.attention.key_length": -16}),
     r"gemma3\.attention\.key_length = -16: must be"),
    ("gemma3-key-length-odd", edit("gemma3", set_md={"gemma3.attention.key_length": 15}), r"gemma3\.attention\.key_length = 15: must be even"),
    ("gemma3-context-2^32", edit("gemma3", set_md={"gemma3.context_length": 2**32}), r"gemma3\.context_length = 4294967296"),
    ("expert-count-2000", llama({L + "expert_count": 2000, L + "expert_used_count": 2}), r"llama\.expert_count = 2000"),
    ("expert-count-u32-max", llama({L + "expert_count": np.uint32(2**32 - 1)}), r"llama\.expert_count = 4294967295"),
]


@pytest.mark.parametrize(("build", "pattern"), params(CASE18))
def test_case18_hyperparameters_rejected(server: LoaderServer, tmp_path: Path, build: Builder, pattern: str) -> None:
    """Case 18: out-of-range or mistyped hyper-parameters are rejected before any allocation, naming the key."""
    run_rejected(server, tmp_path, build, pattern)


@pytest.mark.parametrize("window", [0, -5, 2**40])
def test_case18_gemma3_odd_sliding_window_accepted(server: LoaderServer, tmp_path: Path, window: int) -> None:
    """Case 18: a sliding window of 0, negative (none) or larger than the context still loads and runs."""
    path = edit("gemma3", set_md={"gemma3.attention.sliding_window": window})(tmp_path / "m.gguf")
    out = expect_loaded(server, path, generate=2)
    assert out["steps"][-1][1] == "length"


# -- case 19: valid container, wrong architecture tensors ------------------------------------------

def _with(name: str, qtype: GGMLType, shape: tuple[int, ...], data: bytes | np.ndarray) -> dict[str, Any]:
    return {"replace": {name: (name, qtype, shape, data)}}


CASE19: list[tuple[str, Builder, str]] = [
    ("token-embd-wrong-dim", llama({L + "embedding_length": 32, L + "rope.dimension_count": 8}),
     r"token_embd\.weight: has wrong shape; expected 32x269, got 64x269"),
    ("token-embd-extra-row", edit(**_with("token_embd.weight", GGMLType.F32, (64, 270),
                                          _TENSORS["llama"]["token_embd.weight"][2] + bytes(256))),
     r"token_embd\.weight: has 270 rows but the vocabulary has 269 tokens"),
    ("token-embd-missing", llama(drop_tensors=("token_embd.weight",)), r"token_embd\.weight: is missing or not 2-D"),
    ("token-embd-1d", edit(**_with("token_embd.weight", GGMLType.F32, (64 * 269,), _TENSORS["llama"]["token_embd.weight"][2])),
     r"token_embd\.weight: is missing or not 2-D"),
    ("token-embd-3d", edit(**_with("token_embd.weight", GGMLType.F32, (64, 269, 1), _TENSORS["llama"]["token_embd.weight"][2])),
     r"token_embd\.weight: is missing or not 2-D"),
    ("ffn-up-missing", llama(drop_tensors=("blk.1.ffn_up.weight",)), r"blk\.1\.ffn_up\.weight: required tensor is missing"),
    ("attn-norm-missing", llama(drop_tensors=("blk.0.attn_norm.weight",)), r"blk\.0\.attn_norm\.weight: required tensor is missing"),
    ("output-norm-missing", llama(drop_tensors=("output_norm.weight",)), r"output_norm\.weight: required tensor is missing"),
    ("gemma3-q-norm-missing", edit("gemma3", drop=("blk.3.attn_q_norm.weight",)),
     r"blk\.3\.attn_q_norm\.weight: required tensor is missing"),
    ("gemma3-post-ffw-norm-missing", edit("gemma3", drop=("blk.5.post_ffw_norm.weight",)),
     r"blk\.5\.post_ffw_norm\.weight: required tensor is missing"),
    ("attn-q-wrong-shape", edit(**_with("blk.0.attn_q.weight", GGMLType.F32, (64, 32), _Q[2][: 64 * 32 * 4])),
     r"blk\.0\.attn_q\.weight: has wrong shape; expected 64x64, got 64x32"),
    ("attn-q-transposed", edit(**_with("blk.1.ffn_up.weight", GGMLType.F32, (128, 64), _TENSORS["llama"]["blk.1.ffn_up.weight"][2])),
     r"blk\.1\.ffn_up\.weight: has wrong shape; expected 64x128, got 128x64"),
    ("attn-q-3d", edit(**_with("blk.0.attn_q.weight", GGMLType.F32, (64, 32, 2), _Q[2])),
     r"blk\.0\.attn_q\.weight: has wrong shape; expected 64x64, got 64x32x2"),
    ("attn-norm-short", edit(replace={"blk.0.attn_norm.weight": norm("blk.0.attn_norm.weight", 32)}),
     r"blk\.0\.attn_norm\.weight: has wrong shape; expected 64, got 32"),
    ("attn-norm-2d", edit(replace={"blk.0.attn_norm.weight": f32_tensor("blk.0.attn_norm.weight", np.ones((2, 64)))}),
     r"blk\.0\.attn_norm\.weight: has wrong shape; expected 64, got 64x2"),
    ("kv-heads-disagree-with-tensors", llama({L + "attention.head_count_kv": 4}),
     r"blk\.0\.attn_k\.weight: has wrong shape; expected 64x64, got 64x32"),
    ("ffn-length-disagrees", llama({L + "feed_forward_length": 96}), r"blk\.0\.ffn_gate\.weight: has wrong shape; expected 64x96, got 64x128"),
    ("output-wrong-shape", edit(add=[f32_tensor("output.weight", np.zeros((268, 64)))]),
     r"output\.weight: has wrong shape; expected 64x269, got 64x268"),
    ("norm-type-i32", edit(replace={"blk.0.attn_norm.weight": ("blk.0.attn_norm.weight", GGMLType.I32, (64,),
                                                                np.ones(64, np.int32))}),
     r"tensor 'blk\.0\.attn_norm\.weight': type I32 is not supported by GGUF Lens"),
]


@pytest.mark.parametrize(("build", "pattern"), params(CASE19))
def test_case19_wrong_tensors_rejected(server: LoaderServer, tmp_path: Path, build: Builder, pattern: str) -> None:
    """Case 19: a missing, mis-shaped or unusable tensor is named with the shape expected and the one found."""
    run_rejected(server, tmp_path, build, pattern)


def test_case19_extra_tensors_ignored_with_warning(server: LoaderServer, tmp_path: Path) -> None:
    """Case 19: tensors the architecture does not use are ignored with a warning naming them."""
    # (rope_freqs.weight is no extra: llama applies it as Llama 3's frequency factors, see test_arch_rope)
    extra = [norm("blk.0.extra_norm.weight", 8), matrix("blk.0.extra_proj.weight", (16, 2)), norm("blk.9.attn_norm.weight")]
    out = expect_loaded(server, edit(add=extra)(tmp_path / "m.gguf"), generate=2)
    [warning] = [w for w in out["warnings"] if "not used" in w]
    assert re.search(r"3 tensors not used by the llama architecture, ignored: blk\.0\.extra_norm\.weight, "
                     r"blk\.0\.extra_proj\.weight, blk\.9\.attn_norm\.weight", warning), warning
    assert out["steps"][-1][1] == "length"


@pytest.mark.parametrize("qtype", [GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.MXFP4])
def test_case19_other_dtypes_for_norms_accepted(server: LoaderServer, tmp_path: Path, qtype: GGMLType) -> None:
    """Case 19: a norm stored as F16/BF16/Q8_0/Q4_0/MXFP4 (not F32) is dequantized like any weight and runs."""
    names = ("blk.0.attn_norm.weight", "blk.1.ffn_norm.weight", "output_norm.weight")
    path = edit(replace={n: norm(n, 64, qtype) for n in names})(tmp_path / "m.gguf")
    out = expect_loaded(server, path, generate=3, scan=True)
    assert out["scan"] == [] and out["steps"][-1][1] == "length", out


def test_case19_trailing_unit_dims_accepted(server: LoaderServer, tmp_path: Path) -> None:
    """Case 19: a matrix stored with a trailing dimension of 1 (64x64x1) is the same matrix."""
    path = edit(**_with("blk.0.attn_q.weight", GGMLType.F32, (64, 64, 1), _Q[2]))(tmp_path / "m.gguf")
    assert expect_loaded(server, path, generate=2)["steps"]


# -- case 20: malformed vocabulary entries ----------------------------------------------------------

_BAD_BYTE_TOKENS = ["<0x-1>", "<0xZZ>", "<0x100>", "<0x>", "<0xGG>", "<0x0A", "0x41", "<0X41>"]


def _vocab_edit(tokenizer: str, edits: dict[int, tuple[str, int]], **md: Any) -> Builder:
    """The tiny vocabulary with tokens[i] = text and token_type[i] = type for each i in edits."""
    tokens, types, _ = tiny_vocab()
    tokens, types = list(tokens), types.copy()
    for i, (text, ttype) in edits.items():
        tokens[i], types[i] = text, ttype
    overrides = {K + "tokens": tokens, K + "token_type": types, K + "model": tokenizer, **md}
    if tokenizer == "llama":
        overrides[K + "scores"] = -np.arange(len(tokens), dtype=np.float32)
    return llama(overrides)


@pytest.mark.parametrize("tokenizer", ["llama", "gpt2"])
def test_case20_bad_byte_tokens_ignored(server: LoaderServer, tmp_path: Path, tokenizer: str) -> None:
    """Case 20: BYTE tokens that are not <0xXX> ('<0x-1>', '<0xZZ>', '<0x100>', ...) are ignored with a warning."""
    edits = {100 + i: (text, 6) for i, text in enumerate(_BAD_BYTE_TOKENS)}
    edits[150] = ("<0x41>", 6)  # a good one stays usable
    path = _vocab_edit(tokenizer, edits)(tmp_path / "m.gguf")
    out = expect_loaded(server, path, text="A " + " ".join(_BAD_BYTE_TOKENS), generate=3, decode=[*edits, 150])
    for i, text in enumerate(_BAD_BYTE_TOKENS):
        assert any(re.search(rf"byte token {100 + i} '{re.escape(text)}' is not of the form <0xXX>; ignoring it", m)
                   for m in out["log"]), (text, out["log"])
    assert out["decode"][: len(_BAD_BYTE_TOKENS)] == [""] * len(_BAD_BYTE_TOKENS)
    assert out["decode"][-1] == "A"


def test_case20_malformed_merges_ignored(server: LoaderServer, tmp_path: Path) -> None:
    """Case 20: merges that are not 'left right' are skipped with a count; merges of unknown tokens are harmless."""
    _, _, merges = tiny_vocab()
    bad = ["abc", "", " ", " a", "Ġ", "a\tb"]
    weird = ["a  b", "a b c", "zz qq", "\u0000 \u0000", "h e"]  # odd but parseable: split at the first space
    path = llama({K + "merges": bad + merges + weird})(tmp_path / "m.gguf")
    out = expect_loaded(server, path, text="the cat sat in the sun; abc zz qq", generate=2)
    assert any(re.search(r"tokenizer\.ggml\.merges: ignored 6 entries that are not 'left right'", m) for m in out["log"]), out["log"]
    assert out["decoded"] == "the cat sat in the sun; abc zz qq"


@pytest.mark.parametrize("tokenizer", ["llama", "gpt2"])
def test_case20_empty_and_duplicate_tokens(server: LoaderServer, tmp_path: Path, tokenizer: str) -> None:
    """Case 20: empty token strings and duplicates load with warnings; encode and decode stay in range."""
    edits = {10: ("", 1), 11: ("", 3), 12: ("", 6), 20: ("a", 1), 21: ("<|im_end|>", 3), 30: ("x", 99), 31: ("y", -4)}
    path = _vocab_edit(tokenizer, edits)(tmp_path / "m.gguf")
    out = expect_loaded(server, path, text="a<|im_end|>xy", generate=3, decode=list(edits))
    assert any("empty token at index 10" in m for m in out["log"]), out["log"]
    assert any(re.search(r"tokenizer\.ggml\.tokens has \d+ duplicate strings", m) for m in out["log"]), out["log"]
    assert all(0 <= i < N_VOCAB for i in out["ids"])


def test_case20_all_tokens_empty(server: LoaderServer, tmp_path: Path) -> None:
    """Case 20: a vocabulary of nothing but empty strings does not crash encode (bytes it cannot map are dropped)."""
    tokens, types, _ = tiny_vocab()
    path = llama({K + "tokens": [""] * len(tokens)})(tmp_path / "m.gguf")
    res = server.load(path, text="hello", generate=2)
    assert_exit(res, ACCEPTED)


_HUGE_VOCAB_CHILD = r"""
import json, resource, sys, time
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import numpy as np
from engine.tokenizer.vocab import Tokenizer
n, width, model = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
# self-similar: every token is the same 2-byte code point repeated, then its index; all of them 90 code points
stem = "\u0101" * (width - 7)
tokens = [stem + f"{i:07d}" for i in range(n)]
md = {"tokenizer.ggml.model": model, "tokenizer.ggml.tokens": tokens,
      "tokenizer.ggml.scores": np.linspace(0, -1, n, dtype=np.float32), "tokenizer.ggml.token_type": np.ones(n, np.int32)}
if model == "gpt2":
    md["tokenizer.ggml.merges"] = [stem[:k] + " " + stem[k:] for k in range(1, 60)]
t0 = time.process_time()  # CPU time: the work done, whatever the machine's load
tok = Tokenizer.from_metadata(md)
built = time.process_time() - t0
text = (stem + "0000042") * 3 + " " + "\u0101" * 500
ids = tok.encode(text)
print(json.dumps({"n_vocab": tok.n_vocab, "build_s": built, "encode_s": time.process_time() - t0 - built,
                  "n_ids": len(ids), "in_range": all(0 <= i < n for i in ids),
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


@pytest.mark.parametrize(("n", "model"), [(1_000_000, "llama"), (200_000, "gpt2")], ids=["1M-spm", "200k-bpe"])
def test_case20_huge_self_similar_vocab_bounded(server: LoaderServer, n: int, model: str) -> None:
    """Case 20: a 1M-token vocabulary of 90-code-point self-similar strings builds in bounded time and memory."""
    res = server.run(_HUGE_VOCAB_CHILD, str(2 * GIB), str(n), "90", model, timeout=300)
    assert_exit(res, ACCEPTED)
    assert res.out["n_vocab"] == n and res.out["in_range"], res.out
    # CPU seconds, guards against a build or encode that grows with the tokens' similarity (quadratic: hours), not
    # speed bounds
    assert res.out["build_s"] < 120 and res.out["encode_s"] < 30, res.out
    assert res.out["maxrss_kib"] < 1_500_000, res.out


# -- case 30 (load-time part): NaN / Inf in weights -------------------------------------------------

CASE30: list[tuple[str, dict[str, Any], str]] = [
    ("attn-norm-nan", {"replace": {"blk.0.attn_norm.weight": norm("blk.0.attn_norm.weight", poison=np.nan, at=5)}},
     r"tensor 'blk\.0\.attn_norm\.weight' holds 1 NaN and 0 Inf values \(first at index 5\)"),
    ("output-norm-inf", {"replace": {"output_norm.weight": norm("output_norm.weight", poison=np.inf, at=63)}},
     r"tensor 'output_norm\.weight' holds 0 NaN and 1 Inf values \(first at index 63\)"),
    ("ffn-norm-f16-nan", {"replace": {"blk.1.ffn_norm.weight": norm("blk.1.ffn_norm.weight", qtype=GGMLType.F16, poison=np.nan)}},
     r"tensor 'blk\.1\.ffn_norm\.weight' holds 1 NaN"),
    ("norm-q8_0-nan-scale", {"replace": {"blk.0.ffn_norm.weight": ("blk.0.ffn_norm.weight", GGMLType.Q8_0, (64,),
                                                                    b"\x00\x7e" + b"\x01" * 32 + b"\x00\x3c" + b"\x01" * 32)}},
     r"tensor 'blk\.0\.ffn_norm\.weight' holds 32 NaN and 0 Inf values \(first at index 0\)"),
    ("f16-matrix-inf", {"replace": {"blk.1.attn_v.weight": matrix("blk.1.attn_v.weight", (64, 32), GGMLType.F16, -np.inf)}},
     r"tensor 'blk\.1\.attn_v\.weight' holds 0 NaN and 1 Inf values \(first at index 7\)"),
    ("f32-embedding-nan", {"replace": {"token_embd.weight": matrix("token_embd.weight", (64, 269), poison=np.nan)}},
     r"tensor 'token_embd\.weight' holds 1 NaN"),
]


@pytest.mark.parametrize(("changes", "pattern"), params(CASE30))
def test_case30_nan_weights_named_by_scan(server: LoaderServer, tmp_path: Path, changes: dict, pattern: str) -> None:
    """Case 30: the load-time scan names the tensor holding NaN/Inf; generating stops with an InferenceError, not a crash."""
    path = edit(**changes)(tmp_path / "m.gguf")
    out = expect_loaded(server, path, scan=True, generate=3)
    assert len(out["scan"]) == 1 and re.search(pattern, out["scan"][0]), out["scan"]
    if "generate_error" in out:  # an Inf in one weight need not reach the logits
        assert re.search(r"InferenceError: numerical error in model output \((NaN|Inf)\)", out["generate_error"]), out


@pytest.mark.parametrize(("changes", "pattern"), params(CASE30[:2]))
def test_case30_nan_weights_reported_by_load_model(server: LoaderServer, tmp_path: Path, changes: dict, pattern: str) -> None:
    """Case 30: load_model itself reports NaN/Inf in small tensors among Model.warnings."""
    out = expect_loaded(server, edit(**changes)(tmp_path / "m.gguf"))
    assert any(re.search(pattern, w) for w in out["warnings"]), out["warnings"]


def test_case30_clean_model_has_no_scan_warnings(server: LoaderServer, tmp_path: Path) -> None:
    """Case 30 control: the tiny models scan clean."""
    assert expect_loaded(server, make_tiny_llama(tmp_path / "l.gguf", qtype=GGMLType.F16), scan=True)["scan"] == []
    assert expect_loaded(server, make_tiny_gemma3(tmp_path / "g.gguf"), scan=True)["scan"] == []


# -- case 35: the positive set: legitimate files are all accepted ------------------------------------

_CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


@pytest.mark.parametrize("name", [SMOLLM2_FILE, GEMMA3_FILE])
def test_case35_real_models(server: LoaderServer, name: str) -> None:
    """Case 35: both catalog models load, tokenize round-trip, render their chat template and scan clean."""
    path = model_path(name)
    if path is None:
        pytest.skip(f"model {name} not found (set GGUF_LENS_MODELS_DIR)")
    text = "Hello, world! Ünïcödé 你好 🙂 12345"
    out = expect_loaded(server, path, text=text, chat=_CHAT, scan=True)
    assert out["decoded"] == text and out["scan"] == [] and out["warnings"] == []
    assert not out["chat_fallback"] and "Hi there" in out["chat_text"]
    assert out["cpu_seconds"] < 120  # bounded work (CPU time, a hang guard), whatever the machine's load


@pytest.mark.parametrize("make", [make_tiny_llama, make_tiny_gemma3], ids=["llama", "gemma3"])
def test_case35_gguf_v2(server: LoaderServer, tmp_path: Path, make: Callable[[Path], Path]) -> None:
    """Case 35: a GGUF v2 file (64-bit counts, like v3) loads and runs."""
    path = rewrite_gguf(make(tmp_path / "src.gguf"), tmp_path / "v2.gguf", version=2)
    out = expect_loaded(server, path, text="hello", generate=2)
    assert out["version"] == 2 and out["steps"][-1][1] == "length"


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096, 1 << 20])
def test_case35_custom_alignment(server: LoaderServer, tmp_path: Path, alignment: int) -> None:
    """Case 35: general.alignment from 1 byte to 1 MiB is honoured; every tensor starts on it."""
    path = rewrite_gguf(make_tiny_llama(tmp_path / "src.gguf", n_layers=1), tmp_path / "a.gguf", alignment=alignment)
    out = expect_loaded(server, path, generate=2)
    assert out["alignment"] == alignment and out["steps"][-1][1] == "length"
    data_start = min(out["offsets"].values())
    assert all((o - data_start) % alignment == 0 for o in out["offsets"].values())


def test_case35_zero_element_tensors(server: LoaderServer, tmp_path: Path) -> None:
    """Case 35: zero-element tensors (0, 64x0, 0x4 Q8_0...) load; unused ones are named in the warning."""
    empty = [("blk.0.empty.weight", GGMLType.F32, (0,), b""), ("blk.0.empty2.weight", GGMLType.F32, (64, 0), b""),
             ("blk.0.empty3.weight", GGMLType.Q8_0, (0, 4), b""), ("zero_rows.weight", GGMLType.F16, (8, 0, 3), b"")]
    out = expect_loaded(server, edit(add=empty)(tmp_path / "m.gguf"), generate=2, scan=True)
    assert out["scan"] == [] and out["steps"][-1][1] == "length"
    assert any("4 tensors not used" in w and "blk.0.empty.weight" in w for w in out["warnings"]), out["warnings"]


def _big_template() -> str:
    """A real ChatML template padded to ~50 KB with comments, whitespace control and an unused macro."""
    body = (
        "{%- for message in messages -%}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )
    pad = "".join(f"{{# tool schema {i}: {'x' * 80} #}}\n" for i in range(560))
    macro = "{%- macro unused(x) -%}{{ x | tojson }}{%- endmacro -%}\n"
    template = macro + pad + body
    assert 50_000 <= len(template) <= 60_000
    return template


def test_case35_50kb_chat_template(server: LoaderServer, tmp_path: Path) -> None:
    """Case 35: a 50 KB chat template is the model's template (not the fallback) and renders."""
    path = make_tiny_llama(tmp_path / "m.gguf", chat_template=_big_template())
    out = expect_loaded(server, path, chat=_CHAT)
    assert not out["chat_builtin"] and not out["chat_fallback"] and out["chat_warning"] is None, out
    assert out["chat_text"] == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                                "<|im_start|>assistant\n")


def make_vocab_model(path: Path, tokens: list[str], token_type: np.ndarray, md: dict[str, Any], dim: int = 8) -> Path:
    """A one-layer llama (dim 8, F16 embeddings) around any vocabulary: cheap even with 262k tokens."""
    rng = np.random.default_rng(0)
    n, hidden = len(tokens), 16
    meta: dict[str, Any] = {
        "general.architecture": "llama", "llama.block_count": 1, "llama.context_length": 64,
        "llama.embedding_length": dim, "llama.feed_forward_length": hidden, "llama.attention.head_count": 2,
        "llama.attention.head_count_kv": 1, "llama.attention.layer_norm_rms_epsilon": 1e-5,
        K + "tokens": tokens, K + "token_type": token_type, **md,
    }

    def mat(n_in: int, n_out: int) -> np.ndarray:
        return (0.1 * rng.standard_normal((n_out, n_in))).astype(np.float16)

    ts = [("token_embd.weight", GGMLType.F16, (dim, n), mat(dim, n)), ("output_norm.weight", GGMLType.F32, (dim,), np.ones(dim, np.float32))]
    for name, n_in, n_out in (("attn_q", dim, dim), ("attn_k", dim, dim // 2), ("attn_v", dim, dim // 2),
                              ("attn_output", dim, dim), ("ffn_gate", dim, hidden), ("ffn_up", dim, hidden),
                              ("ffn_down", hidden, dim)):
        ts.append((f"blk.0.{name}.weight", GGMLType.F16, (n_in, n_out), mat(n_in, n_out)))
    ts += [(f"blk.0.{k}_norm.weight", GGMLType.F32, (dim,), np.ones(dim, np.float32)) for k in ("attn", "ffn")]
    write_gguf(path, meta, ts)
    return path


def test_case35_big_spm_vocab(server: LoaderServer, tmp_path: Path) -> None:
    """Case 35: a 262,144-token SPM vocabulary with scores and 256 byte tokens is accepted (gemma3's size)."""
    n = 262_144
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "\u2581w"]
    tokens += [f"\u2581w{i}" for i in range(n - len(tokens))]  # every prefix of '▁w123' is a token too
    types = np.ones(n, np.int32)
    types[:3], types[3:259] = 3, 6
    md = {K + "model": "llama", K + "scores": -np.arange(n, dtype=np.float32), K + "bos_token_id": 1, K + "eos_token_id": 2}
    path = make_vocab_model(tmp_path / "spm.gguf", tokens, types, md)
    out = expect_loaded(server, path, text="w12 w261000 ☃", generate=2)
    assert out["n_vocab"] == n and out["decoded"].lstrip() == "w12 w261000 ☃", out["decoded"]
    assert out["ids"][1:3] == [tokens.index("\u2581w12"), tokens.index("\u2581w261000")]


def test_case35_big_bpe_vocab_and_merges(server: LoaderServer, tmp_path: Path) -> None:
    """Case 35: a 150k-token byte-level BPE vocabulary with 280k+ merges is accepted."""
    from tests.tiny_models import byte_to_unicode  # noqa: PLC0415

    alphabet = [byte_to_unicode()[b] for b in range(256)]
    tokens = ["<|endoftext|>"] + alphabet
    merges = []
    for a in alphabet[33:126]:  # printable ASCII pairs and triples: 'ab', 'abc' ...
        for b in alphabet[33:126]:
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    for i in range(len(tokens), 150_000):
        tokens.append(f"tok{i}")
    while len(merges) < 285_000:  # merges of pieces no text produces: a real table is mostly those too
        merges.append(f"x{len(merges)} y")
    types = np.ones(len(tokens), np.int32)
    types[0] = 3
    md = {K + "model": "gpt2", K + "pre": "default", K + "merges": merges, K + "eos_token_id": 0}
    path = make_vocab_model(tmp_path / "bpe.gguf", tokens, types, md)
    out = expect_loaded(server, path, text="hello world", generate=2)
    assert out["n_vocab"] == 150_000 and out["decoded"] == "hello world"
    assert any(len(t) == 2 for t in out["texts"]), out["texts"]  # the merges applied


def _sparse_big_file(path: Path, src: Path, pad_elements: int) -> None:
    """The tiny llama behind a 1-D F32 'pad' tensor of pad_elements (a sparse hole), so real offsets pass 2^32."""
    import struct  # noqa: PLC0415

    from engine.gguf.constants import pad_to  # noqa: PLC0415
    from engine.gguf.writer import encode_value, infer_type  # noqa: PLC0415

    md, types, tensors = read_tensors(src)
    specs = [("aa.pad.weight", GGMLType.F32, (pad_elements,), None), *tensors]
    head = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(specs), len(md)))
    for key, value in md.items():
        vt, it = types.get(key) or infer_type(value)
        raw = key.encode()
        head += struct.pack("<Q", len(raw)) + raw + struct.pack("<i", int(vt)) + encode_value(value, vt, it, key)
    offsets, offset = [], 0
    for name, qtype, shape, data in specs:
        raw = name.encode()
        head += struct.pack("<Q", len(raw)) + raw + struct.pack(f"<I{len(shape)}qiQ", len(shape), *shape, int(qtype), offset)
        offsets.append(offset)
        offset += pad_to(4 * pad_elements if data is None else len(data), 32)
    start = pad_to(len(head), 32)
    with open(path, "wb") as fh:
        fh.write(head)
        for (_, _, _, data), off in zip(specs, offsets):
            if data is not None:
                fh.seek(start + off)
                fh.write(data)


@pytest.fixture
def big_sparse_file(tmp_path: Path) -> Path:
    path = tmp_path / "big.gguf"
    _sparse_big_file(path, make_tiny_llama(tmp_path / "src.gguf", n_layers=1), (1 << 30) + (1 << 14))
    if path.stat().st_blocks * 512 > 64 << 20:
        pytest.skip("this filesystem does not keep sparse files sparse")
    return path


def test_case35_offsets_above_4gib(server: LoaderServer, big_sparse_file: Path) -> None:
    """Case 35: a >4 GiB file whose tensors sit past 2^32 loads (64-bit Python-int offsets; 8 GiB of address space)."""
    out = expect_loaded(server, big_sparse_file, limit=8 * GIB, generate=2, scan=True)
    assert big_sparse_file.stat().st_size > 1 << 32
    assert out["offsets"]["token_embd.weight"] > 1 << 32 and out["steps"][-1][1] == "length"
    assert out["scan"] == []  # the 4 GiB 1-D tensor is over the scan's cap, not read
    assert out["maxrss_kib"] < 512 * 1024, out  # the hole is mapped, never read


def test_case35_map_failure_is_a_clear_error(server: LoaderServer, big_sparse_file: Path) -> None:
    """Case 28/35: when the file cannot be mapped (RLIMIT_AS 2 GiB < 4 GiB file) the error is a LensError, not OSError."""
    res = server.load(big_sparse_file, limit=2 * GIB)
    assert "Traceback" not in res.stderr, res.stderr[-1500:]
    assert res.rc in (REJECTED, OTHER_LENS_ERROR) and re.search(r"map|memory|address space", res.out["error"]), res.out
