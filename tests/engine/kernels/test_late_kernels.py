"""A first start's late kernels (engine.kernels.precompile): compiled in the background while the first tokens take
paths of the same bits; and the per-type and per-option compiled copies (engine.kernels.variants) that keep a first
start's compile to the model's own types."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from engine.kernels import precompile, variants
from engine.kernels.dispatch import compiled
from engine.model import load_model
from engine.quant.types import GGMLType
from tests.tiny_models import make_tiny_llama

needs_kernels = pytest.mark.skipif(not compiled(), reason="needs the compiled (numba) kernels")
_T = GGMLType


def test_without_late_holds_on_this_thread_only():
    assert precompile.late_ready()
    seen = {}
    with precompile.without_late():
        assert not precompile.late_ready()
        other = threading.Thread(target=lambda: seen.setdefault("other", precompile.late_ready()))
        other.start()
        other.join()
    assert seen["other"] is True
    assert precompile.late_ready()


def test_a_late_helper_holds_the_late_kernels_until_it_ends():
    helper = precompile.start_late("import time; time.sleep(1.0)", [])
    assert helper is not None
    try:
        assert not precompile.late_ready()
        assert precompile.late_status() is not None and precompile.late_status() >= 0.0
        assert precompile.wait_late(limit=60)
    finally:
        helper.stop()
    assert precompile.late_ready() and precompile.late_status() is None


def test_a_failed_late_helper_frees_the_late_kernels():
    precompile.start_late("import sys; sys.exit(3)", [])
    assert precompile.wait_late(limit=60) is False
    assert precompile.late_ready()  # the kernels compile here when first used


def test_a_late_helper_is_stopped_at_exit():
    helper = precompile.start_late("import time; time.sleep(120)", [])
    assert helper is not None
    precompile._stop_late()  # what atexit runs
    assert all(proc.poll() is not None for proc, _, _ in helper.procs)
    assert helper.done() and helper.ok is False
    assert precompile.late_ready()


def test_the_cli_names_a_running_background_compile():
    from engine.cli.main import late_note  # noqa: PLC0415

    assert late_note() is None
    helper = precompile.start_late("import time; time.sleep(120)", [])
    try:
        assert "compiling in the background" in (late_note() or "")
    finally:
        helper.stop()
    assert late_note() is None


def test_per_kind_copies_are_made_once_and_only_when_asked():
    made = []

    @variants.per_kind((1, 2, 3))
    def table(kind: int) -> str:
        made.append(kind)
        return f"copy {kind}"

    assert made == [] and list(table) == [1, 2, 3] and len(table) == 3
    assert table[2] == "copy 2" and table[2] == "copy 2"
    assert made == [2]
    with pytest.raises(KeyError):
        table[7]


@needs_kernels
def test_every_compiled_copy_has_a_name_of_its_own():
    """numba's cache files are named by the function's qualified name: two copies under one name (a serial and a
    parallel one, or two types) would load each other's code."""
    from engine.kernels.legacy import gemm, gemm_vnni, products  # noqa: PLC0415
    from engine.ops import ggml_kernels as gk  # noqa: PLC0415
    from engine.runtime import decode_step  # noqa: PLC0415

    names = [products.PRODUCT[k].py_func.__qualname__ for k in products.KINDS]
    names += [gemm.GEMM_INT[k].py_func.__qualname__ for k in gemm.KINDS]
    names += [gemm_vnni.GEMM_INT_VNNI[k].py_func.__qualname__ for k in gemm.KINDS]
    for table in (gk.soft_max_chunks, gk.soft_max_chunks_serial, gk.swiglu_chunks, gk.swiglu_chunks_serial,
                  gk.silu_chunks, gk.silu_chunks_serial,
                  decode_step.ATTEND, decode_step.GLU_QUANT):
        names += [table[w8].py_func.__qualname__ for w8 in (False, True)]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert products.PRODUCT[int(_T.Q4_1)].py_func.__qualname__ == "_product_q4_1"
    assert gk.soft_max_chunks_serial[True].py_func.__qualname__ == "_soft_max_chunks_serial_avx2"


@needs_kernels
@pytest.mark.parametrize(("kind", "kept", "gone"), [(_T.Q8_0, "_int8_lane", "_nibble_block"),
                                                    (_T.Q4_1, "_nibble_block", "_int8_lane")])
def test_a_type_copy_holds_that_type_only(kind, kept, gone):
    """A copy of the legacy dot for one type is typed without the other types' code (numba folds the branches on its
    constant KIND before typing): what keeps a first start's compile to the model's types."""
    from engine.kernels.legacy import dot  # noqa: PLC0415

    copy = variants.specialise(dot._dot_group, f"probe_{kind.name.lower()}", {"KIND": int(kind)})  # not cached
    f32 = np.zeros((1, 1), np.float32)
    copy(np.zeros(0, np.uint8), np.int64(34), f32, f32, np.zeros((1, 1, 32), np.float32), np.int64(0),
         np.zeros(9 * 64, np.float32))
    typed = io.StringIO()
    copy.inspect_types(file=typed)
    ir = typed.getvalue()  # the source lines, each followed by its typed IR (none under a pruned branch)
    assert f"global({kept}" in ir and f"global({gone}" not in ir


# every weight type whose first start takes another path: legacy one-row products through the batch kernel and the
# plain batch kernels (Q4_0 in eights: the q4_0_8x8 numbers), Q4_K's repacked plain gemm, Q6_K's plain tiled kernel
CASES = [(_T.Q4_0, 64, 128), (_T.Q4_1, 64, 128), (_T.Q5_0, 64, 128), (_T.Q8_0, 64, 128), (_T.Q4_K, 256, 512),
         (_T.Q6_K, 256, 512)]


@needs_kernels
@pytest.mark.parametrize(("qtype", "dim", "hidden"), CASES, ids=[c[0].name for c in CASES])
def test_a_model_gives_the_same_bits_before_and_after_the_late_kernels(tmp_path, monkeypatch, qtype, dim, hidden):
    """A nine-token prompt (the tiled and batch paths) and three decode steps: before the late kernels (op by op,
    the NumPy prompt attention, the plain batch kernels) every logit equals the one with them (the compiled step)."""
    from engine.runtime.decode_plan import DecodePlan  # noqa: PLC0415

    steps = []
    real_step = DecodePlan.step
    monkeypatch.setattr(DecodePlan, "step", lambda self, *a: steps.append(1) or real_step(self, *a))
    path = make_tiny_llama(tmp_path / "m.gguf", qtype=qtype, dim=dim, hidden=hidden)
    ids = np.array([5, 60, 61, 9, 70, 3, 8, 21, 33], np.int64)

    def run(late: bool) -> tuple[list[np.ndarray], int]:
        model = load_model(path)
        steps.clear()
        with contextlib.nullcontext() if late else precompile.without_late():
            cache = model.new_cache(64)
            out = [np.asarray(model.forward(ids, cache))]
            cache.commit(ids.tolist())
            for t in (11, 12, 13):
                out.append(np.asarray(model.forward(np.array([t], np.int64), cache)))
                cache.commit([t])
        model.close()
        return out, len(steps)

    with_late, compiled_steps = run(True)
    without, none = run(False)
    assert compiled_steps == 3 and none == 0  # the compiled step ran only with the late kernels
    for a, b in zip(with_late, without, strict=True):
        assert np.array_equal(a, b)


def test_the_helper_programs_name_functions_that_exist():
    """The two helper programs (run in processes of their own) are valid Python, and what they import exists."""
    import ast  # noqa: PLC0415
    import importlib  # noqa: PLC0415

    from engine.runtime import warmup  # noqa: PLC0415

    for program in (precompile._HELPER, warmup.LATE_PROGRAM):
        imports = [n for n in ast.walk(ast.parse(program)) if isinstance(n, ast.ImportFrom)]
        assert [i.module for i in imports if i.module.startswith("engine")]
        for node in imports:
            module = importlib.import_module(node.module)
            assert all(callable(getattr(module, alias.name)) for alias in node.names if node.module != "sys")


def test_two_late_helpers_both_hold_and_both_stop():
    """A second model loaded during a first start's background compile starts its own; both count."""
    first = precompile.start_late("import time; time.sleep(120)", [])
    second = precompile.start_late("import time; time.sleep(0.2)", [])
    try:
        assert not precompile.late_ready()
        second.wait(limit=60)
        assert not precompile.late_ready()  # the first still runs
    finally:
        precompile._stop_late()
    assert first.ok is False and precompile.late_ready()


LONG_PROMPT = """
import sys
import numpy as np
from numba.core import dispatcher
from engine.model import load_model
model = load_model(sys.argv[1], flash_attn=sys.argv[2])
loaded = []
real = dispatcher.Dispatcher.compile
def compile_(self, sig):
    n = len(self.overloads)
    out = real(self, sig)
    if len(self.overloads) > n:
        loaded.append(self.py_func.__name__)
    return out
dispatcher.Dispatcher.compile = compile_
ids = np.arange(3, 3 + 200) % 90
model.forward(ids, model.new_cache(256))
print("LOADED", ",".join(loaded))
"""


@needs_kernels
@pytest.mark.parametrize("flash", ["off", "on"])
def test_a_long_prompt_after_the_load_loads_no_kernel(tmp_path, flash):
    """The warm-up loads every kernel a chat's prompts run, the parallel chunk kernels of a long prompt among them
    (with flash attention, its tiled kernel): a kernel loaded later would bring LLVM's code pages (~50 MiB) back into
    the process after the load gave them back (engine.kernels.pages.release_libraries)."""
    path = make_tiny_llama(tmp_path / "m.gguf", qtype=_T.Q4_1, dim=256, hidden=512)
    done = subprocess.run([sys.executable, "-c", LONG_PROMPT, str(path), flash], capture_output=True, text=True,
                          timeout=600,
                          env={**os.environ, "GGUF_LENS_LATE_KERNELS": "now"})
    assert done.returncode == 0, done.stderr[-2000:]
    line = [s for s in done.stdout.splitlines() if s.startswith("LOADED")]
    assert line == ["LOADED "], done.stdout


@needs_kernels
def test_the_late_helper_compiles_a_long_prompts_chunk_kernels(tmp_path, monkeypatch):
    """A first start's background compile caches the parallel chunk kernels too: the next start's warm-up loads
    them (engine.runtime.warmup), and would otherwise compile them before its first token."""
    from engine.runtime import late  # noqa: PLC0415

    asked = []
    monkeypatch.setattr(late, "load_parallel", asked.append)
    path = make_tiny_llama(tmp_path / "m.gguf", qtype=_T.Q8_0, dim=64, hidden=128)
    late.compile_late(str(path), ["Q8_0:64"])
    assert len(asked) == 1 and isinstance(asked[0], bool)


@needs_kernels
def test_a_first_start_leaves_the_f32_pass_and_long_prompt_products_to_the_late_helper(tmp_path, monkeypatch):
    """On a first start (the split compile ran, the late helper still compiling) the warm-up runs neither the F32
    cache's dry pass nor a long prompt's attention products: the late helper compiles them, off the first token's
    path. finish_late then loads both; a warm start's warm-up runs both at once."""
    from engine.ops import attention_ggml  # noqa: PLC0415
    from engine.runtime import warmup  # noqa: PLC0415

    path = make_tiny_llama(tmp_path / "m.gguf", qtype=_T.Q8_0, dim=64, hidden=128)
    model = load_model(path)
    net = model.net
    calls: list[str] = []
    real_passes = warmup.other_passes
    monkeypatch.setattr(warmup, "other_passes", lambda m: calls.append("other_passes") or real_passes(m))
    monkeypatch.setattr(attention_ggml, "load_kernels", lambda: calls.append("load_kernels"))
    helper = precompile.start_late("import time; time.sleep(120)", [])
    try:
        monkeypatch.setattr(warmup, "_compile_split", lambda *a: True)
        warmup.warm(net)
        assert calls == [] and warmup.late_pending(net) is False  # still compiling: nothing to finish yet
    finally:
        precompile._stop_late()
    assert helper.ok is False and warmup.late_pending(net)
    assert warmup.finish_late(net) and calls == ["other_passes", "load_kernels"]
    calls.clear()
    monkeypatch.setattr(warmup, "_compile_split", lambda *a: False)
    warmup.warm(net)  # a warm start
    assert calls == ["other_passes", "load_kernels"]
    model.close()
