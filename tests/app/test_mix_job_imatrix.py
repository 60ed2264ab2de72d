"""Compare's mix search with the Quantization lens's importance matrix: the search measures and B quantizes with it."""
from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.jobs.compare import CompareWorkspace, encode
from app.jobs.mix import calibration_text, mix_job, session_imatrix
from app.records.compare import SweepDone, SweepPoint
from engine.model import load_model
from engine.quality.imatrix_collect import compute_imatrix
from engine.quality.sensitivity_cache import SensitivityCache, cache_key
from tests.tiny_models import make_tiny_llama

TEXT = "the cat sat on the mat and the dog sat on the log, while 12 birds sang in the old tree by the river"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf", dim=128, n_heads=4, n_kv_heads=2,
                           hidden=256, n_ctx=256, tied=False)


def test_the_search_uses_the_lens_imatrix(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the sensitivities go to a temporary cache
    model = load_model(tiny, warm=False)
    im = compute_imatrix(model, TEXT, n_ctx=16)
    assert im is not None and len(im) > 0
    rq = SimpleNamespace(model=model, imatrix=im, imatrix_file="tiny.imatrix.gguf")
    assert session_imatrix(SimpleNamespace(requantizer=rq), str(tiny)) == (im, "tiny.imatrix.gguf")
    assert session_imatrix(SimpleNamespace(requantizer=rq), str(tmp_path / "other.gguf")) is None  # another file
    assert session_imatrix(SimpleNamespace(requantizer=None), str(tiny)) is None
    ids = encode(model, calibration_text(), 64)
    model.close()

    ws = CompareWorkspace()
    out = list(mix_job(ws, str(tiny), 5.0, TEXT, threading.Event(), lambda item: None, max_tokens=32,
                       imatrix=(im, "tiny.imatrix.gguf")))
    point = next(p for p in out if isinstance(p, SweepPoint))
    assert point.kind == "mix" and point.name.endswith("(imatrix)") and "with tiny.imatrix.gguf" in point.detail
    assert point.bpw <= 5.0 and point.rules and point.kld_mean >= 0
    assert isinstance(out[-1], SweepDone) and not out[-1].cancelled
    assert ws.rq is None and ws.b is None  # B closed with the job: the next sweep's requantizer has no matrix
    numerics = model.numerics  # B's: the file's, loaded as this model was
    folder = tmp_path / "cache" / "gguf-lens" / "mix"
    with_im = SensitivityCache(cache_key(str(tiny), ids, numerics, im.quant_weights()), folder=folder)
    without = SensitivityCache(cache_key(str(tiny), ids, numerics), folder=folder)
    assert with_im.path.exists() and not without.path.exists()  # measured with the matrix's weights
    measured, _ = with_im.load()
    assert measured and all(s.probe_kld >= 0 for s in measured.values())
    ws.close()
