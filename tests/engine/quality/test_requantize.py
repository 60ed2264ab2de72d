"""Requantizing SmolLM2: bytes identical to llama-quantize, in memory and on disk; cancel; quality moves with bits."""
from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from engine.quality.compare import compare_models, run_recorded, token_stats
from engine.gguf import open_gguf
from engine.model import load_model
from engine.quant.types import GGMLType
from engine.quality.requantize import Requantizer, make_plan, quantize_file
from tests.llama_cpp_tools import llama_cpp_n_vocab, need_llama_python

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
ALL_GOLDEN = json.loads((FIXTURES / "quantize_presets.json").read_text())["models"]
GOLDEN = ALL_GOLDEN["smollm2"]
TINY = ALL_GOLDEN["tiny_untied"]


def _sha16(data: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest()[:16]


def _sha_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _assert_like_llama(path: Path, golden: dict, model: dict = GOLDEN) -> None:
    """Every tensor's type and bytes, and then the whole file, as llama-quantize wrote them."""
    with open_gguf(path) as g:
        assert list(g.tensors) == model["tensors"]
        bad = [n for n, t in zip(model["tensors"], golden["types"].split())
               if g.tensors[n].qtype.name != t or _sha16(g.raw(n)) != model["hashes"][n][t]]
        assert bad == [], f"{len(bad)} tensors differ from llama-quantize's: {bad[:5]}"
        assert list(g.metadata) == model["metadata_keys"]
        assert g.metadata["general.file_type"] == golden["file_type"]
    assert _sha_file(path) == golden["file_sha256"]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama with its own output.weight, as tools/make_quantize_fixtures.py builds it."""
    from tests.engine.quant.test_presets import build_tiny_untied  # noqa: PLC0415

    return build_tiny_untied(tmp_path_factory.mktemp("tiny") / "tiny_untied.gguf")


@pytest.mark.parametrize("preset", sorted(TINY["presets"]))
def test_tiny_untied_model_byte_identical_for_every_preset(tiny_path: Path, tmp_path: Path, preset: str) -> None:
    out = tmp_path / "out.gguf"
    quantize_file(tiny_path, out, preset)
    _assert_like_llama(out, TINY["presets"][preset], TINY)


@pytest.mark.parametrize("case", sorted(TINY["rules"]))
def test_tiny_untied_model_rules_byte_identical(tiny_path: Path, tmp_path: Path, case: str) -> None:
    golden = TINY["rules"][case]
    out = tmp_path / "out.gguf"
    quantize_file(tiny_path, out, golden["preset"], golden["rules"])
    _assert_like_llama(out, golden, TINY)


def test_tiny_untied_in_memory_swaps_embeddings_and_output(tiny_path: Path, tmp_path: Path) -> None:
    model = load_model(tiny_path)
    try:
        rq = Requantizer(model)
        golden = TINY["presets"]["Q4_K_M"]
        want = dict(zip(TINY["tensors"], golden["types"].split()))
        assert rq.apply(rq.plan("Q4_K_M"))
        assert model.net.tok_embd.qtype.name == want["token_embd.weight"] == "Q4_K"
        assert model.net.linears()["output.weight"].weight.qtype.name == want["output.weight"] == "Q6_K"
        assert _sha16(model.net.tok_embd.blocks) == TINY["hashes"]["token_embd.weight"]["Q4_K"]
        assert rq.save(tmp_path / "saved.gguf")
        _assert_like_llama(tmp_path / "saved.gguf", golden, TINY)
        rq.reset()
        assert model.net.tok_embd.qtype == GGMLType.F16
    finally:
        model.close()


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path):
    model = load_model(smollm2_path)
    yield model
    model.close()


@pytest.mark.parametrize("preset", ["Q8_0", "Q4_0", "Q5_1"])
def test_quantize_file_is_byte_identical_to_llama_cpp(smollm2_path: Path, tmp_path: Path, preset: str) -> None:
    out = tmp_path / f"{preset}.gguf"
    plan = quantize_file(smollm2_path, out, preset)
    assert plan is not None and plan.preset is not None and plan.preset.name == preset
    _assert_like_llama(out, GOLDEN["presets"][preset])


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["Q4_K_M", "Q6_K", "Q2_K", "Q3_K_M", "Q5_K_S"])
def test_k_quant_presets_byte_identical(smollm2_path: Path, tmp_path: Path, preset: str) -> None:
    out = tmp_path / f"{preset}.gguf"
    quantize_file(smollm2_path, out, preset)
    _assert_like_llama(out, GOLDEN["presets"][preset])


@pytest.mark.slow
@pytest.mark.parametrize("case", ["q4km_first_match", "q8_ffn", "q4km_partial"])
def test_rules_byte_identical(smollm2_path: Path, tmp_path: Path, case: str) -> None:
    golden = GOLDEN["rules"][case]
    out = tmp_path / f"{case}.gguf"
    quantize_file(smollm2_path, out, golden["preset"], golden["rules"])
    _assert_like_llama(out, golden)


def _model_bytes(model) -> dict[str, tuple[GGMLType, str]]:
    out = {name: (lin.weight.qtype, _sha16(lin.weight.blocks)) for name, lin in model.net.linears().items()}
    out["<tok_embd>"] = (model.net.tok_embd.qtype, _sha16(model.net.tok_embd.blocks))
    return out


def test_apply_in_memory_then_save_and_reset(smollm2, tmp_path: Path) -> None:
    rq = Requantizer(smollm2)
    before = _model_bytes(smollm2)
    golden = GOLDEN["presets"]["Q8_0"]
    want = dict(zip(GOLDEN["tensors"], golden["types"].split()))
    seen: list[float] = []
    assert rq.apply(rq.plan("Q8_0"), progress=lambda what, frac: seen.append(frac))
    assert seen[-1] == 1.0 and seen == sorted(seen)
    for name, lin in smollm2.net.linears().items():
        assert lin.weight.qtype.name == want[name]
        assert _sha16(lin.weight.blocks) == GOLDEN["hashes"][name][want[name]]
    assert smollm2.net.tok_embd.qtype.name == want["token_embd.weight"]
    assert rq.current_types()["blk.0.attn_q.weight"] == GGMLType.Q8_0
    out = tmp_path / "saved.gguf"
    assert rq.save(out)
    _assert_like_llama(out, golden)
    rq.reset()
    assert _model_bytes(smollm2) == before
    assert rq.applied is None


def test_cancel_leaves_the_model_unchanged(smollm2) -> None:
    rq = Requantizer(smollm2)
    before = _model_bytes(smollm2)
    plan = rq.plan("Q4_0")
    cancel = threading.Event()
    cancel.set()
    assert rq.apply(plan, cancel=cancel) is False
    assert _model_bytes(smollm2) == before

    cancel.clear()
    seen: list[tuple[str, float]] = []

    def stop_half_way(what: str, frac: float) -> None:
        seen.append((what, frac))
        if frac > 0.3:
            cancel.set()

    assert rq.apply(plan, progress=stop_half_way, cancel=cancel) is False
    assert 0.3 < max(f for w, f in seen if w == "requantizing") < 1.0
    assert seen[-1] == ("cancelled", 0.0)
    assert _model_bytes(smollm2) == before
    assert rq.applied is None


def test_apply_on_a_thread_pool_gives_the_same_bytes_and_cancels_cleanly(smollm2, tmp_path: Path) -> None:
    rq = Requantizer(smollm2)
    before = _model_bytes(smollm2)
    plan = rq.plan("Q5_1")
    with ThreadPoolExecutor(2) as pool:
        cancel = threading.Event()
        seen: list[tuple[str, float]] = []

        def stop_early(what: str, frac: float) -> None:
            seen.append((what, frac))
            if frac > 0.2:
                cancel.set()

        assert rq.apply(plan, progress=stop_early, cancel=cancel, executor=pool) is False
        assert _model_bytes(smollm2) == before
        assert rq.apply(plan, executor=pool)
        out = tmp_path / "q5_1.gguf"
        assert rq.save(out, executor=pool)
    _assert_like_llama(out, GOLDEN["presets"]["Q5_1"])
    rq.reset()
    assert _model_bytes(smollm2) == before


def test_reapply_keeps_what_is_already_there(smollm2) -> None:
    rq = Requantizer(smollm2)
    assert rq.apply(rq.plan(None, ["attn_v=Q8_0"]))
    held = smollm2.net.linears()["blk.3.attn_v.weight"].weight
    assert held.qtype == GGMLType.Q8_0
    assert rq.apply(rq.plan(None, ["attn_v=Q8_0", "attn_k=Q8_0"]))
    assert smollm2.net.linears()["blk.3.attn_v.weight"].weight.blocks is held.blocks  # not recomputed
    assert rq.apply(rq.plan(None, ["attn_k=Q8_0"]))  # attn_v goes back to the file's bytes
    assert smollm2.net.linears()["blk.3.attn_v.weight"].weight.qtype == GGMLType.Q4_1
    rq.reset()


def test_written_file_loads_in_llama_cpp(smollm2_path: Path, tmp_path: Path) -> None:
    need_llama_python()
    out = tmp_path / "rules.gguf"
    quantize_file(smollm2_path, out, "Q4_0", ["attn_v=Q8_0", "ffn_down=Q6_K"])
    assert llama_cpp_n_vocab(out, "The quick brown fox") == 49152


def _ids(model, n: int = 100) -> list[int]:
    text = (FIXTURES / "prose.txt").read_text(encoding="utf-8")
    return model.tokenizer.encode(text, add_special=True, parse_special=False)[:n]


@pytest.fixture(scope="module")
def twin(smollm2_path: Path):
    """A second copy of SmolLM2 to requantize while the first stays as the file."""
    model = load_model(smollm2_path, warm=False)
    yield model
    model.close()


@pytest.mark.slow
def test_kld_q8_far_below_q2(smollm2, twin) -> None:
    ids = _ids(smollm2)
    rq = Requantizer(twin)
    result = {}
    for rule in (".*=Q8_0", ".*=Q2_K"):
        assert rq.apply(rq.plan(None, [rule]))
        result[rule] = compare_models(smollm2, twin, ids)
    rq.reset()
    q8, q2 = result[".*=Q8_0"], result[".*=Q2_K"]
    assert q8.kld_mean < 0.2 * q2.kld_mean
    assert q8.same_top_pct > q2.same_top_pct
    assert len(q8.per_layer) == smollm2.args.n_layers


@pytest.mark.slow
def test_ppl_ratio_and_kld_move_together(smollm2, twin) -> None:
    ids = _ids(smollm2, 160)
    base, _ = run_recorded(smollm2, ids)  # the file's run once, not once per preset (compare_models runs both)
    rq = Requantizer(twin)
    stats = []
    for preset in ("Q8_0", "Q4_0", "Q2_K"):
        assert rq.apply(rq.plan(preset))
        c = token_stats(base, run_recorded(twin, ids)[0], ids)
        stats.append((c["kld_mean"], abs(c["ln_ppl_ratio"])))
    rq.reset()
    kld = [s[0] for s in stats]
    ppl = [s[1] for s in stats]
    assert kld == sorted(kld), stats
    assert ppl == sorted(ppl), stats
