"""Control vectors and LoRA adapters on Gemma 3 against llama.cpp (tools/make_cvec_fixtures.py and
tools/make_lora_fixtures.py, --model gemma3): the second catalog model, another architecture (its post-norms, its
scaled embeddings, 4 query heads on one KV head). With each case's files our logits at every position of a prompt and
of decode steps equal llama.cpp's in ggml numerics; the same run without them is far from its answer (the files do
something), and the files are the bytes llama.cpp loaded.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from engine.intervene import control_vector as cv
from tests.engine.intervene import test_control_vector as cvec_tests
from tests.engine.intervene import test_lora as lora_tests
from tools import make_cvec_fixtures, make_lora_fixtures
from tools.intervene_fixtures import MODELS, read_fixture

GEMMA = MODELS["gemma3"]


@pytest.fixture(scope="module")
def cvec_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("cvec-gemma3")
    return {name: make_cvec_fixtures.write_cvec(folder, name, "gemma3") for name in ("a", "b")}


@pytest.fixture(scope="module")
def lora_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("lora-gemma3")
    return {name: make_lora_fixtures.write_lora(folder, name, "gemma3") for name in ("a", "b")}


def test_the_files_are_the_ones_llama_cpp_loaded(cvec_files: dict[str, Path], lora_files: dict[str, Path]) -> None:
    for files, folder in ((cvec_files, make_cvec_fixtures.FIXTURES), (lora_files, make_lora_fixtures.FIXTURES)):
        meta = read_fixture(folder, "gemma3")["meta"]
        for name, path in files.items():
            assert hashlib.sha256(path.read_bytes()).hexdigest() == meta["sha256"][name]


@pytest.mark.parametrize("case", list(make_cvec_fixtures.CASES))
def test_control_vectors_equal_llama_cpps(gemma3_path: Path, cvec_files: dict[str, Path], case: str) -> None:
    ref = read_fixture(make_cvec_fixtures.FIXTURES, "gemma3")
    ids = ref["npz"]["ids"].tolist()
    parts = [(str(cvec_files[n]), s) for n, s in make_cvec_fixtures.CASES[case]]
    vec = cv.load(parts, GEMMA.dim, GEMMA.n_layers, GEMMA.arch)
    got = cvec_tests._kld(ref, case, cvec_tests._logits(gemma3_path, ids, vec))
    without = cvec_tests._kld(ref, case, cvec_tests._logits(gemma3_path, ids, None))
    print(case, got.max(), "without it:", without.mean())
    assert got.max() <= cvec_tests.EXACT_KLD and without.mean() >= cvec_tests.MOVED_KLD


@pytest.mark.parametrize("case", list(make_lora_fixtures.CASES))
def test_adapters_equal_llama_cpps(gemma3_path: Path, lora_files: dict[str, Path], case: str) -> None:
    ref = read_fixture(make_lora_fixtures.FIXTURES, "gemma3")
    ids = ref["npz"]["ids"].tolist()
    got = lora_tests._kld(ref, case, lora_tests._logits(gemma3_path, ids, [(lora_files[n], s) for n, s in
                                                                           make_lora_fixtures.CASES[case]]))
    without = lora_tests._kld(ref, case, lora_tests._logits(gemma3_path, ids, []))
    print(case, got.max(), "without:", without.mean())
    assert got.max() <= lora_tests.EXACT_KLD and without.mean() >= lora_tests.MOVED_KLD
