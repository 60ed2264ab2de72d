"""Compare on a Mixture-of-Experts model: the job measures where B's routers choose other experts than A's, and
the view's summary line says how often and in which layer most; a dense model's line says nothing of routing."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from app.jobs.compare import CompareWorkspace, compare_job
from app.records.compare import CompareOptions, CompareRecord, TaskProgress
from app.views.compare.view import CompareView
from tests.app.test_lenses_common import synthetic_model_record
from tests.app.views.compare.test_view import synthetic_record
from tools.make_arch_models import write_arch

TEXT = "Each token of a mixture goes to a few experts, chosen by a router in every layer. " * 4


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_arch(tmp_path_factory.mktemp("moe-compare") / "moe.gguf", "qwen3moe")


def _record(path: Path, preset: str) -> CompareRecord:
    ws = CompareWorkspace()
    try:
        opts = CompareOptions(b_source="preset", b_preset=preset, text=TEXT, max_tokens=48)
        items = [i for i in compare_job(ws, str(path), opts, None, threading.Event(), lambda item: None)
                 if not isinstance(i, TaskProgress)]
        return next(i for i in items if isinstance(i, CompareRecord))
    finally:
        ws.close()


def test_compare_measures_and_shows_routing_changes(qtbot, moe: Path) -> None:
    rec = _record(moe, "Q2_K")
    routing = rec.stats.routing
    assert [r.layer for r in routing] == [0, 1] and any(r.changed_pct > 0 for r in routing)
    assert rec.recurrent == ()  # every layer attends: the layer curve marks none
    view = CompareView()
    qtbot.addWidget(view)
    view.set_model(synthetic_model_record())
    view.set_record(rec)
    worst = max(routing, key=lambda r: r.changed_pct)
    line = view.status.text()
    assert f"routing changed in {rec.stats.routing_changed_pct:.1f} % of token-layer pairs" in line
    assert f"most in layer {worst.layer}: {worst.changed_pct:.1f} %" in line
    view.set_record(synthetic_record())  # a dense model's comparison
    assert "routing" not in view.status.text() and "KLD mean" in view.status.text()
