"""engine/memory.py: the preflight estimate against free memory (RELIABILITY 28) and the NaN scan (30)."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest

from engine import memory
from engine.errors import InferenceError
from engine.gguf import open_gguf, write_gguf
from engine.memory import GIB, MemoryEstimate, check_memory, estimate_memory, kv_cache_bytes, scan_small_tensors
from engine.models.llama import LlamaArgs
from engine.quant import quantize
from engine.quant.types import GGMLType
from tests.tiny_models import make_tiny_gemma3, make_tiny_llama

MIB = 1 << 20


def llama_args(**kw: int) -> LlamaArgs:
    base = dict(arch="llama", dim=64, hidden_dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, n_vocab=269,
                n_ctx=256, norm_eps=1e-5, rope_base=10000.0, rope_dim=16)
    return LlamaArgs(**{**base, **kw})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("mem") / "tiny.gguf")


@pytest.fixture(autouse=True)
def no_real_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never depend on this machine's free memory."""
    monkeypatch.setattr(memory, "available_memory", lambda: 64 * GIB)


# -- free memory ----------------------------------------------------------------------------------------

def test_meminfo(tmp_path: Path) -> None:
    """MemAvailable is read in kB and returned in bytes; a missing file or line gives None."""
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    8000000 kB\n")
    assert memory.read_meminfo_available(f) == 8_000_000 * 1024
    f.write_text("MemTotal:       16000000 kB\n")
    assert memory.read_meminfo_available(f) is None
    assert memory.read_meminfo_available(tmp_path / "absent") is None


def _cgroup(root: Path, rel: str, files: dict[str, str]) -> None:
    folder = root / rel if rel else root
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text + "\n")


def test_cgroup_v2(tmp_path: Path) -> None:
    """v2: memory.max minus memory.current, the tightest of the cgroup and its ancestors; 'max' is no limit."""
    root = tmp_path / "cg"
    self_cg = tmp_path / "self"
    self_cg.write_text("0::/user.slice/app.scope\n")
    _cgroup(root, "user.slice/app.scope", {"memory.max": "max", "memory.current": str(100 * MIB)})
    assert memory.read_cgroup_available(root, self_cg) is None
    _cgroup(root, "user.slice", {"memory.max": str(2 * GIB), "memory.current": str(512 * MIB)})
    assert memory.read_cgroup_available(root, self_cg) == 2 * GIB - 512 * MIB
    _cgroup(root, "user.slice/app.scope", {"memory.max": str(GIB), "memory.current": str(100 * MIB)})
    assert memory.read_cgroup_available(root, self_cg) == GIB - 100 * MIB
    _cgroup(root, "user.slice/app.scope", {"memory.max": str(GIB), "memory.current": str(3 * GIB)})
    assert memory.read_cgroup_available(root, self_cg) == 0  # over the limit already: nothing left


def test_cgroup_v1_and_container_root(tmp_path: Path) -> None:
    """v1: memory.limit_in_bytes (2^63 rounded = no limit); a path missing inside a container falls back to the root."""
    root = tmp_path / "cg"
    self_cg = tmp_path / "self"
    self_cg.write_text("12:cpu:/x\n4:memory:/docker/abc\n0::/\n")
    _cgroup(root, "memory", {"memory.limit_in_bytes": "9223372036854771712", "memory.usage_in_bytes": "1"})
    assert memory.read_cgroup_available(root, self_cg) is None
    _cgroup(root, "memory", {"memory.limit_in_bytes": str(4 * GIB), "memory.usage_in_bytes": str(GIB)})
    assert memory.read_cgroup_available(root, self_cg) == 3 * GIB  # /docker/abc does not exist: the root's limit
    _cgroup(root, "memory/docker/abc", {"memory.limit_in_bytes": str(2 * GIB), "memory.usage_in_bytes": "garbage"})
    assert memory.read_cgroup_available(root, self_cg) == 2 * GIB  # unreadable usage counts as 0
    assert memory.read_cgroup_available(tmp_path / "none", tmp_path / "none2") is None


def test_available_memory_takes_the_smaller(monkeypatch: pytest.MonkeyPatch) -> None:
    """available_memory is MemAvailable capped by the cgroup; None only when neither is known."""
    monkeypatch.undo()  # the real function, with its two readers replaced
    monkeypatch.setattr(memory, "read_meminfo_available", lambda: 8 * GIB)
    monkeypatch.setattr(memory, "read_cgroup_available", lambda: 3 * GIB)
    assert memory.available_memory() == 3 * GIB
    monkeypatch.setattr(memory, "read_cgroup_available", lambda: None)
    assert memory.available_memory() == 8 * GIB
    monkeypatch.setattr(memory, "read_meminfo_available", lambda: None)
    assert memory.available_memory() is None


def test_available_memory_on_this_machine() -> None:
    """On Linux the real readers give a positive number."""
    value = memory.read_meminfo_available()
    assert value is None or value > 0


# -- the estimate -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("cache_type", "row_bytes"), [("F32", 64), ("F16", 32), ("Q8_0", 0), ("q4_0", 0)])
def test_kv_cache_formula(cache_type: str, row_bytes: int) -> None:
    """KV = 2 x n_layers x n_ctx x n_kv_heads x bytes of a head_dim row (block-rounded for quantized caches)."""
    a = llama_args(head_dim=64, n_layers=3, n_kv_heads=2)
    rows = {"F32": 256, "F16": 128, "Q8_0": 2 * 34, "Q4_0": 2 * 18}[cache_type.upper()]
    assert kv_cache_bytes(a, 1000, cache_type) == 2 * 3 * 1000 * 2 * rows


def test_estimate_of_the_tiny_llama(tiny: Path) -> None:
    """Mapped bytes are the tensors' bytes; the KV cache follows the formula; the dense copies follow the budget."""
    a = llama_args()
    with open_gguf(tiny) as f:
        mapped = sum(t.nbytes for t in f.tensors.values())
        matrices = sum(4 * t.n_elements for n, t in f.tensors.items() if len(t.shape) == 2)  # tied: embedding too
        none = estimate_memory(f, a, dense_budget=0, available=GIB)
        full = estimate_memory(f, a, dense_budget=GIB, available=GIB)
        ctx = estimate_memory(f, a, n_ctx=128, dense_budget=GIB, available=GIB)
    assert none.weights_mapped == full.weights_mapped == mapped
    assert none.weights_dense == 0 and full.weights_dense == matrices
    assert full.kv_cache == 2 * 2 * 256 * 2 * 16 * 4 and ctx.kv_cache == full.kv_cache // 2
    assert full.total == full.required + matrices and full.scratch > 0
    assert full.verdict == "ok" and full.fits and full.max_ctx_that_fits == 256


def test_dense_budget_is_first_come(tmp_path: Path) -> None:
    """The estimate takes copies in warm-load order (fused q/k/v, gate/up first) and skips what does not fit."""
    path = make_tiny_llama(tmp_path / "m.gguf", tied=False)
    with open_gguf(path) as f:
        t = f.tensors
        qkv = sum(4 * t[f"blk.0.attn_{x}.weight"].n_elements for x in "qkv")
        gate_up = sum(4 * t[f"blk.0.ffn_{x}.weight"].n_elements for x in ("gate", "up"))
        est = estimate_memory(f, llama_args(), dense_budget=qkv + gate_up, available=GIB)
        assert est.weights_dense == qkv + gate_up  # layer 0's two fused groups, nothing after them fits
        output = 4 * t["output.weight"].n_elements
        total = sum(4 * x.n_elements for n, x in t.items() if len(x.shape) == 2 and n != "token_embd.weight")
        assert estimate_memory(f, llama_args(), dense_budget=total, available=GIB).weights_dense == total
        est = estimate_memory(f, llama_args(), dense_budget=total - 1, available=GIB)
        assert est.weights_dense == total - output  # the output matrix comes last and no longer fits


def test_check_memory_refuses_with_a_clear_message(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Too big: InferenceError 'needs X GiB, Y GiB available; choose a smaller context or a smaller model'."""
    a = llama_args(n_ctx=1 << 22)  # a 4M-token context: 2 GiB of KV cache even for this tiny model
    monkeypatch.setattr(memory, "available_memory", lambda: GIB)
    with open_gguf(tiny) as f, pytest.raises(InferenceError) as info:
        check_memory(f, a)
    message = str(info.value)
    assert re.match(r"needs (\d+\.\d) GiB, 1\.0 GiB available; choose a smaller context or a smaller model "
                    r"\(weights .* mapped .*KV cache for 4194304 tokens \d+\.\d GiB.*; a context of (\d+) tokens would fit\)$",
                    message), message
    fit = int(re.search(r"a context of (\d+) tokens", message).group(1))  # type: ignore[union-attr]
    with open_gguf(tiny) as f:
        assert estimate_memory(f, a, n_ctx=fit, available=GIB).verdict != "too_big"
        assert estimate_memory(f, a, n_ctx=fit + 1, available=GIB).verdict == "too_big"
        assert check_memory(f, a, n_ctx=fit).fits  # the suggestion works


def test_nothing_fits(tiny: Path) -> None:
    """When even a 1-token context cannot fit, the suggestion is a context of 0 (so: a smaller model)."""
    with open_gguf(tiny) as f:
        est = estimate_memory(f, llama_args(), available=1000)
    assert est.verdict == "too_big" and est.max_ctx_that_fits == 0
    assert re.match(r"needs 0\.\d\d GiB, 0\.00 GiB available; .*it does not fit even with a 1-token context\)$", est.message())


def test_tight_and_unknown_do_not_refuse(tiny: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Tight (fits only with fewer float32 copies) warns; unknown free memory lets the load go on."""
    with open_gguf(tiny) as f:
        need = estimate_memory(f, llama_args(), available=GIB).required
        monkeypatch.setattr(memory, "available_memory", lambda: need + 1000)
        with caplog.at_level(logging.WARNING, logger="engine.memory"):
            est = check_memory(f, llama_args(), dense_budget=GIB)
        assert est.verdict == "tight" and "memory is tight" in caplog.text
        monkeypatch.setattr(memory, "available_memory", lambda: None)
        est = check_memory(f, llama_args(), dense_budget=GIB)
        assert est.verdict == "unknown" and est.available is None and est.max_ctx_that_fits is None


def test_bad_context_is_an_inference_error(tiny: Path) -> None:
    with open_gguf(tiny) as f, pytest.raises(InferenceError, match="context of 0 tokens"):
        estimate_memory(f, llama_args(), n_ctx=0)


def test_scratch_grows_with_the_chunk_and_the_context() -> None:
    a = llama_args()
    assert memory.scratch_bytes(a, 512, 256) > memory.scratch_bytes(a, 512, 16) > memory.scratch_bytes(a, 16, 16)
    assert memory.scratch_bytes(a, 512, 1, all_logits=True) == memory.scratch_bytes(a, 512, 1)
    assert memory.scratch_bytes(a, 512, 64, all_logits=True) > memory.scratch_bytes(a, 512, 64)


def test_real_models_fit_here(smollm2_path: Path) -> None:
    """SmolLM2 at its trained 8k context needs well under a GiB; the estimate is in the right range."""
    with open_gguf(smollm2_path) as f:
        a = LlamaArgs.from_metadata(f.metadata, f.tensors["token_embd.weight"].shape[1])
        est = estimate_memory(f, a, dense_budget=4 * GIB, available=16 * GIB)
    assert est.weights_mapped == pytest.approx(smollm2_path.stat().st_size, rel=0.05)  # less the metadata
    assert 0.2 * GIB < est.weights_dense < 0.8 * GIB  # 135M float32 weights = 0.5 GiB
    assert est.kv_cache == 2 * a.n_layers * a.n_ctx * a.n_kv_heads * a.head_dim * 4
    assert est.verdict == "ok"


def test_memory_estimate_is_frozen() -> None:
    est = MemoryEstimate(8, 1, 2, 3, 4, 100)
    assert est.required == 8 and est.total == 10
    with pytest.raises(AttributeError):
        est.n_ctx = 9  # type: ignore[misc]


# -- NaN / Inf scan --------------------------------------------------------------------------------------

def _write(path: Path, tensors: list[tuple[str, GGMLType, tuple[int, ...], np.ndarray | bytes]]) -> Path:
    write_gguf(path, {"general.architecture": "llama"}, tensors)
    return path


def _vec(n: int, poison: dict[int, float] | None = None, dtype: type = np.float32) -> np.ndarray:
    v = np.ones(n, np.float32)
    for i, x in (poison or {}).items():
        v[i] = x
    return v.astype(dtype)


def test_scan_names_every_poisoned_small_tensor(tmp_path: Path) -> None:
    """1-D tensors of any type and small float matrices holding NaN/Inf are named with counts and the first index."""
    bf16 = (_vec(32, {3: np.nan}).view(np.uint32) >> 16).astype(np.uint16)
    q8 = quantize(_vec(64).reshape(1, 64), GGMLType.Q8_0)
    q8[0, 0:2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)  # block 0's scale = +Inf
    path = _write(tmp_path / "m.gguf", [
        ("clean.weight", GGMLType.F32, (16,), _vec(16)),
        ("a_norm.weight", GGMLType.F32, (16,), _vec(16, {4: np.nan, 9: np.inf, 10: -np.inf})),
        ("b_norm.weight", GGMLType.F16, (16,), _vec(16, {0: np.nan}, np.float16)),
        ("c_norm.weight", GGMLType.BF16, (32,), bf16),
        ("d_norm.weight", GGMLType.Q8_0, (64,), q8),
        ("e.weight", GGMLType.F16, (8, 4), _vec(32, {31: np.inf}, np.float16).reshape(4, 8)),
        ("empty.weight", GGMLType.F32, (0,), b""),
    ])
    with open_gguf(path) as f:
        warnings = scan_small_tensors(f)
    assert len(warnings) == 5, warnings
    expected = [
        r"tensor 'a_norm\.weight' holds 1 NaN and 2 Inf values \(first at index 4\)",
        r"tensor 'b_norm\.weight' holds 1 NaN and 0 Inf values \(first at index 0\)",
        r"tensor 'c_norm\.weight' holds 1 NaN and 0 Inf values \(first at index 3\)",
        r"tensor 'd_norm\.weight' holds \d+ NaN and \d+ Inf values \(first at index 0\)",
        r"tensor 'e\.weight' holds 0 NaN and 1 Inf values \(first at index 31\)",
    ]
    for w, pattern in zip(warnings, expected):
        assert re.match(pattern, w), (w, pattern)
        assert w.endswith("re-download or re-convert it")


def test_scan_caps(tmp_path: Path) -> None:
    """Float matrices above the per-tensor cap and anything past the total cap are not read."""
    path = _write(tmp_path / "m.gguf", [
        ("big.weight", GGMLType.F32, (64, 64), _vec(64 * 64, {0: np.nan}).reshape(64, 64)),
        ("a_norm.weight", GGMLType.F32, (64,), _vec(64, {1: np.nan})),
        ("b_norm.weight", GGMLType.F32, (64,), _vec(64, {2: np.nan})),
    ])
    with open_gguf(path) as f:
        assert len(scan_small_tensors(f)) == 3
        assert [w.split("'")[1] for w in scan_small_tensors(f, max_tensor_bytes=1024)] == ["a_norm.weight", "b_norm.weight"]
        assert [w.split("'")[1] for w in scan_small_tensors(f, max_tensor_bytes=1024, max_total_bytes=300)] == ["a_norm.weight"]
        assert scan_small_tensors(f, max_tensor_bytes=100) == []


def test_scan_of_quantized_matrices_is_skipped(tmp_path: Path) -> None:
    """Quantized matrices are the bulk of a model: the scan leaves them to the per-step check."""
    q = quantize(np.full((4, 64), np.nan, np.float32), GGMLType.Q8_0)
    path = _write(tmp_path / "m.gguf", [("m.weight", GGMLType.Q8_0, (64, 4), q)])
    with open_gguf(path) as f:
        assert scan_small_tensors(f) == []


def test_scan_of_the_tiny_models_is_clean_and_fast(tmp_path: Path) -> None:
    for path in (make_tiny_llama(tmp_path / "l.gguf", qtype=GGMLType.F16), make_tiny_gemma3(tmp_path / "g.gguf")):
        with open_gguf(path) as f:
            assert scan_small_tensors(f) == []


def test_gib_formatting() -> None:
    assert memory.gib(GIB // 4) == "0.25 GiB" and memory.gib(3 * GIB) == "3.0 GiB" and memory.gib(0) == "0.00 GiB"


def test_load_model_refuses_what_cannot_fit(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Case 28: load_model runs the preflight and refuses with 'needs X GiB, Y GiB available'."""
    from engine.model import load_model  # noqa: PLC0415

    monkeypatch.setattr(memory, "available_memory", lambda: 1 << 20)
    with pytest.raises(InferenceError, match=r"needs \d+\.\d+ GiB, 0\.00 GiB available; choose a smaller context"):
        load_model(tiny, warm=False)
