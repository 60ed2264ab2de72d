"""Control vectors in llama.cpp's format on SmolLM2, against llama.cpp (tools/make_cvec_fixtures.py).

The files are GGUF Lens's own (the fixture's sha256 says llama.cpp loaded these bytes); with one at scale 1 and 0.5
and two at once, our logits at every position of a prompt and of decode steps equal llama.cpp's (ggml numerics:
KLD at the fixture's float32 floor); a direction applied one block early, or without its scale, is far from them;
bad files are refused by name and nothing is applied.
"""
from __future__ import annotations

import functools
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
from engine.intervene import control_vector as cv
from engine.model import load_model
from engine.quant.types import GGMLType
from tests.engine.golden import kld_topk, log_softmax
from tools.intervene_fixtures import MODELS
from tools.make_cvec_fixtures import CASES, FIXTURES, PREFILL, directions, write_cvec

N_LAYERS = MODELS["smollm2"].n_layers

EXACT_KLD = 1e-9  # per position: identical logits leave only the fixture's float32 rounding
MOVED_KLD = 1e-2  # mean: a wrong layer range or a missing scale


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("cvec")
    return {name: write_cvec(folder, name) for name in ("a", "b")}


@pytest.fixture(scope="module")
def ref() -> dict:
    return {"npz": np.load(FIXTURES / "smollm2.npz"), "meta": json.loads((FIXTURES / "smollm2.json").read_text())}


@functools.lru_cache(maxsize=4)
def plain_logits(path: Path, ids: tuple[int, ...]) -> np.ndarray:
    """The model's own logits over the fixture's prompt and decode steps, without any file: every case's control
    run (computed once per model and process; read-only)."""
    out = _logits(path, list(ids), None, _plain=False)
    out.flags.writeable = False
    return out


def _logits(path: Path, ids: list[int], vec: cv.ControlVector | None, start: int = 1, _plain: bool = True) -> np.ndarray:
    if vec is None and _plain:
        return plain_logits(path, tuple(ids))
    model = load_model(path, numerics="ggml")
    try:
        if vec is not None:
            cv.apply(model, vec, layer_start=start)
        cache = model.new_cache(128)
        rows = [prefill(model, ids[:PREFILL], cache, all_logits=True)]
        for tok in ids[PREFILL:]:
            rows.append(model.net.forward([tok], cache))
            cache.commit([tok])
        return np.concatenate(rows)
    finally:
        model.close()


def _kld(ref: dict, case: str, logits: np.ndarray) -> np.ndarray:
    z = ref["npz"]
    return kld_topk(z[f"{case}_top_ids"], z[f"{case}_top_logp"], log_softmax(logits))


def test_the_files_are_the_ones_llama_cpp_loaded(files: dict[str, Path], ref: dict) -> None:
    for name, path in files.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == ref["meta"]["sha256"][name]


@pytest.mark.parametrize("case", list(CASES))
def test_logits_with_control_vectors_equal_llama_cpps(smollm2_path: Path, files: dict[str, Path], ref: dict,
                                                      case: str) -> None:
    ids = ref["npz"]["ids"].tolist()
    vec = cv.load([(str(files[n]), s) for n, s in CASES[case]], 576, N_LAYERS, "llama")
    got = _kld(ref, case, _logits(smollm2_path, ids, vec))
    plain = _kld(ref, "none", _logits(smollm2_path, ids, None))
    print(case, got.max(), "without it:", _kld(ref, case, _logits(smollm2_path, ids, None)).mean())
    assert got.max() <= EXACT_KLD and plain.max() <= EXACT_KLD
    assert _kld(ref, case, _logits(smollm2_path, ids, None)).mean() >= MOVED_KLD  # the vector does something


def test_a_wrong_layer_range_or_a_missing_scale_is_far_from_llama_cpp(smollm2_path: Path, files: dict[str, Path],
                                                                      ref: dict) -> None:
    ids = ref["npz"]["ids"].tolist()
    shifted = cv.ControlVector({layer - 1: d for layer, d in cv.load([(str(files["a"]), 1.0)], 576, N_LAYERS,
                                                                      "llama").directions.items()}, (), 576)
    early = _kld(ref, "a", _logits(smollm2_path, ids, shifted, start=0))  # each direction one block early
    unscaled = _kld(ref, "a_half", _logits(smollm2_path, ids, cv.load([(str(files["a"]), 1.0)], 576, N_LAYERS, "llama")))
    print("one block early:", early.mean(), "scale left out:", unscaled.mean())
    assert early.mean() >= MOVED_KLD and unscaled.mean() >= MOVED_KLD


def _bad(folder: Path, name: str, tensors: list, hint: str = "llama", layers: int = N_LAYERS) -> Path:
    md = {"general.architecture": "controlvector", "controlvector.model_hint": hint,
          "controlvector.layer_count": np.uint32(layers)}
    write_gguf(folder / name, md, tensors)
    return folder / name


def test_bad_control_vectors_are_refused_and_nothing_is_applied(smollm2_path: Path, tmp_path: Path,
                                                                files: dict[str, Path]) -> None:
    f32, ok = GGMLType.F32, directions(11)[1]
    nan = ok.copy()
    nan[3] = np.nan
    cases = {
        "width": (_bad(tmp_path, "w.gguf", [("direction.1", f32, (512,), np.zeros(512, np.float32))]), "512 values"),
        "hint": (_bad(tmp_path, "h.gguf", [("direction.1", f32, (576,), ok)], hint="gemma3"), "made for a gemma3"),
        "layers": (_bad(tmp_path, "l.gguf", [("direction.1", f32, (576,), ok)], layers=40), "made for 40 layers"),
        "past": (_bad(tmp_path, "p.gguf", [("direction.31", f32, (576,), ok)]), "direction.31 is past"),
        "zero": (_bad(tmp_path, "z.gguf", [("direction.0", f32, (576,), ok)]), "direction.0"),
        "nan": (_bad(tmp_path, "n.gguf", [("direction.2", f32, (576,), nan)]), "NaN"),
        "name": (_bad(tmp_path, "x.gguf", [("dir.2", f32, (576,), ok)]), "is not direction"),
        "f16": (_bad(tmp_path, "f.gguf", [("direction.2", GGMLType.F16, (576,), ok.astype(np.float16))]), "1-D F32"),
        "not gguf": (tmp_path / "junk.gguf", "not a readable GGUF"),
    }
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    model = load_model(smollm2_path, numerics="ggml")
    try:
        for case, (path, pattern) in cases.items():
            with pytest.raises(SettingError, match=pattern):  # a good file first: still nothing applied
                cv.apply(model, cv.load([(str(files["a"]), 1.0), (str(path), 1.0)], 576, N_LAYERS, "llama"))
            assert cv.current(model) is None and not model.net.control, case
    finally:
        model.close()
    for text, pattern in (("x.gguf:abc", "must be a number"), ("x.gguf:inf", "finite")):
        with pytest.raises(SettingError, match=pattern):
            cv.parse_spec(text)
    assert cv.parse_spec("/a/b.gguf:0.5") == ("/a/b.gguf", 0.5) and cv.parse_spec("b.gguf") == ("b.gguf", 1.0)


def test_the_cli_takes_control_vectors(smollm2_path: Path, files: dict[str, Path], ref: dict, tmp_path: Path) -> None:
    tokens = tmp_path / "t.json"
    ids = ref["npz"]["ids"].tolist()
    tokens.write_text(json.dumps(ids[:PREFILL]))
    out = tmp_path / "o.npy"
    run = [sys.executable, "-m", "engine.cli", "logits", str(smollm2_path), "--tokens-file", str(tokens), "--out",
           str(out), "--control-vector", f"{files['a']}:0.5", "--control-vector", str(files["b"])]
    done = subprocess.run(run, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "control vector cvec_a.gguf x0.5 + cvec_b.gguf x1" in done.stderr
    z = ref["npz"]
    kl = kld_topk(z["a_half_b_top_ids"][:PREFILL], z["a_half_b_top_logp"][:PREFILL], log_softmax(np.load(out)))
    assert kl.max() <= EXACT_KLD
    bad = subprocess.run([*run[:-4], "--control-vector", f"{files['a']}:x"], capture_output=True, text=True)
    assert bad.returncode == 2 and "must be a number" in bad.stderr
