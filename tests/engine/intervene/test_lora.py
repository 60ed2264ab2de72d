"""LoRA adapters in llama.cpp's GGUF format on SmolLM2, against llama.cpp (tools/make_lora_fixtures.py).

The adapters are GGUF Lens's own files (the fixture's sha256 says llama.cpp loaded these bytes); at scale 1, 0.5 and
two at once our logits at every position of a prompt and of decode steps equal llama.cpp's in ggml numerics; without
the alpha / rank scale, or without the second adapter, they are far from them; bad adapters are refused by name and
nothing is applied.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.errors import SettingError
from engine.generate import prefill
from engine.gguf import write_gguf
from engine.intervene import lora
from engine.model import load_model
from engine.quant.types import GGMLType
from tests.engine.golden import kld_topk, log_softmax
from tools.make_lora_fixtures import CASES, FIXTURES, PREFILL, write_lora

EXACT_KLD = 1e-9
MOVED_KLD = 1e-3


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("lora")
    return {name: write_lora(folder, name) for name in ("a", "b")}


@pytest.fixture(scope="module")
def ref() -> dict:
    return {"npz": np.load(FIXTURES / "smollm2.npz"), "meta": json.loads((FIXTURES / "smollm2.json").read_text())}


def _logits(path: Path, ids: list[int], adapters: list[tuple[Path, float]], numerics: str = "ggml") -> np.ndarray:
    if not adapters and numerics == "ggml":  # the control run, shared with the control-vector tests
        from tests.engine.intervene.test_control_vector import plain_logits  # noqa: PLC0415

        return plain_logits(path, tuple(ids))
    model = load_model(path, numerics=numerics)
    try:
        lora.apply(model, [lora.load(model, p, s) for p, s in adapters])
        cache = model.new_cache(128)
        rows = [prefill(model, ids[:PREFILL], cache, all_logits=True)]
        for tok in ids[PREFILL:]:
            rows.append(model.net.forward([tok], cache))
            cache.commit([tok])
        return np.concatenate(rows)
    finally:
        for ad in lora.current(model):
            ad.file.close()
        model.close()


def _kld(ref: dict, case: str, logits: np.ndarray) -> np.ndarray:
    z = ref["npz"]
    return kld_topk(z[f"{case}_top_ids"], z[f"{case}_top_logp"], log_softmax(logits))


def test_the_adapters_are_the_ones_llama_cpp_loaded(files: dict[str, Path], ref: dict) -> None:
    for name, path in files.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == ref["meta"]["sha256"][name]


@pytest.mark.parametrize("case", list(CASES))
def test_logits_with_adapters_equal_llama_cpps(smollm2_path: Path, files: dict[str, Path], ref: dict, case: str) -> None:
    ids = ref["npz"]["ids"].tolist()
    got = _kld(ref, case, _logits(smollm2_path, ids, [(files[n], s) for n, s in CASES[case]]))
    without = _kld(ref, case, _logits(smollm2_path, ids, []))
    print(case, got.max(), "without:", without.mean())
    assert got.max() <= EXACT_KLD and without.mean() >= MOVED_KLD


def test_a_missing_scale_or_adapter_is_far_from_llama_cpp(smollm2_path: Path, files: dict[str, Path], ref: dict,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    ids = ref["npz"]["ids"].tolist()
    only_a = _kld(ref, "a_b", _logits(smollm2_path, ids, [(files["a"], 1.0)]))  # the second adapter left out
    monkeypatch.setattr(lora.Adapter, "weight_scale", lambda self, rank: self.scale)  # alpha / rank left out
    unscaled = _kld(ref, "a", _logits(smollm2_path, ids, [(files["a"], 1.0)]))
    print("without b:", only_a.mean(), "without alpha/rank:", unscaled.mean())
    assert only_a.mean() >= MOVED_KLD and unscaled.mean() >= MOVED_KLD


def _adapter(folder: Path, name: str, md_change: dict, tensors: list | None = None) -> Path:
    md = {"general.architecture": "llama", "general.type": "adapter", "adapter.type": "lora",
          "adapter.lora.alpha": np.float32(4.0)}
    for k, v in md_change.items():
        md.pop(k) if v is None else md.__setitem__(k, v)
    a = np.full((4, 576), 0.01, np.float32)
    b = np.full((576, 4), 0.01, np.float32)
    f32 = GGMLType.F32
    default = [("blk.0.attn_q.weight.lora_a", f32, (576, 4), a), ("blk.0.attn_q.weight.lora_b", f32, (4, 576), b)]
    write_gguf(folder / name, md, default if tensors is None else tensors)
    return folder / name


def test_bad_adapters_are_refused_and_nothing_is_applied(smollm2_path: Path, tmp_path: Path,
                                                        files: dict[str, Path]) -> None:
    f32 = GGMLType.F32
    a, b = np.zeros((4, 576), np.float32), np.zeros((576, 4), np.float32)
    nan = b.copy()
    nan[5, 1] = np.nan
    cases = {
        "arch": (_adapter(tmp_path, "arch.gguf", {"general.architecture": "gemma3"}), "made for 'gemma3'"),
        "type": (_adapter(tmp_path, "type.gguf", {"general.type": "model"}), "not 'adapter'"),
        "kind": (_adapter(tmp_path, "kind.gguf", {"adapter.type": "cvec"}), "not 'lora'"),
        "alpha": (_adapter(tmp_path, "alpha.gguf", {"adapter.lora.alpha": None}), "alpha is missing"),
        "width": (_adapter(tmp_path, "w.gguf", {}, [("blk.0.attn_q.weight.lora_a", f32, (512, 4), np.zeros((4, 512), np.float32)),
                                                    ("blk.0.attn_q.weight.lora_b", f32, (4, 576), b)]), "does not fit"),
        "layers": (_adapter(tmp_path, "l.gguf", {}, [("blk.40.attn_q.weight.lora_a", f32, (576, 4), a),
                                                     ("blk.40.attn_q.weight.lora_b", f32, (4, 576), b)]), "no such matrix"),
        "rank0": (_adapter(tmp_path, "r.gguf", {}, [("blk.0.attn_q.weight.lora_a", f32, (576, 0), np.zeros((0, 576), np.float32)),
                                                    ("blk.0.attn_q.weight.lora_b", f32, (0, 576), np.zeros((576, 0), np.float32))]),
                  "rank 0"),
        "nan": (_adapter(tmp_path, "n.gguf", {}, [("blk.0.attn_q.weight.lora_a", f32, (576, 4), a),
                                                  ("blk.0.attn_q.weight.lora_b", f32, (4, 576), nan)]), "NaN"),
        "half": (_adapter(tmp_path, "h.gguf", {}, [("blk.0.attn_q.weight.lora_a", f32, (576, 4), a)]), "has only its lora_a"),
        "suffix": (_adapter(tmp_path, "s.gguf", {}, [("blk.0.attn_q.weight.lora_c", f32, (576, 4), a)]), "neither"),
        "embd": (_adapter(tmp_path, "e.gguf", {}, [("token_embd.weight.lora_a", f32, (576, 4), a),
                                                   ("token_embd.weight.lora_b", f32, (4, 576), b)]), "does not adapt it yet"),
    }
    model = load_model(smollm2_path, numerics="ggml")
    try:
        for case, (path, pattern) in cases.items():
            with pytest.raises(SettingError, match=pattern):
                lora.apply(model, [lora.load(model, files["a"]), lora.load(model, path)])
            assert lora.current(model) == [] and not any(lin.loras for lin in model.net.linears().values()), case
    finally:
        model.close()


def test_the_cli_takes_lora(smollm2_path: Path, files: dict[str, Path], ref: dict, tmp_path: Path) -> None:
    tokens = tmp_path / "t.json"
    ids = ref["npz"]["ids"].tolist()
    tokens.write_text(json.dumps(ids[:PREFILL]))
    out = tmp_path / "o.npy"
    run = [sys.executable, "-m", "engine.cli", "logits", str(smollm2_path), "--tokens-file", str(tokens), "--out",
           str(out), "--lora", f"{files['a']}:0.5"]
    done = subprocess.run(run, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "LoRA lora_a.gguf x0.5" in done.stderr
    z = ref["npz"]
    assert kld_topk(z["a_half_top_ids"][:PREFILL], z["a_half_top_logp"][:PREFILL], log_softmax(np.load(out))).max() <= EXACT_KLD
