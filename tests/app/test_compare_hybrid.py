"""Compare on a hybrid (a random-weight qwen35: gated DeltaNet layers 0-2, attention layer 3): the job runs both
sides, measures every layer (recurrent ones included: they write the same residual stream), and its head pairs
reach a recurrent layer (the value head's read maps in A and B) as well as the attention layer; the view says
which kind it shows."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from app.jobs.compare import CompareWorkspace, compare_job, head_job
from app.records.compare import CompareOptions, CompareRecord, HeadPair, TaskProgress
from app.views.compare.charts import LayerCurve
from app.views.compare.heads import HeadPairView
from tools.make_arch_models import write_arch

TEXT = "The cat sat on the mat. The dog sat on the log. " * 3


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_arch(tmp_path_factory.mktemp("hybrid-compare") / "qwen35.gguf", "qwen35")


def test_compare_measures_every_layer_and_pairs_recurrent_heads(qtbot, qwen35: Path) -> None:
    ws = CompareWorkspace()
    try:
        opts = CompareOptions(b_source="preset", b_preset="Q4_0", text=TEXT, max_tokens=40, layer=0, head=3)
        items = [i for i in compare_job(ws, str(qwen35), opts, None, threading.Event(), lambda item: None)
                 if not isinstance(i, TaskProgress)]
        rec = next(i for i in items if isinstance(i, CompareRecord))
        first = next(i for i in items if isinstance(i, HeadPair))
        assert rec.n_layers == 4 and rec.n_heads == 4 and len(rec.stats.per_layer) == 4
        assert rec.recurrent == (0, 1, 2)  # the layer curve marks them apart from the attention layer 3
        assert first.layer == 0 and first.head == 3 and first.a.recurrent and first.b.recurrent
        assert np.abs(first.difference()[first.a.allowed]).max() > 0  # B's weights read otherwise
        attn = next(iter(head_job(ws, 3, 9)))
        assert attn.layer == 3 and attn.head == 3 and not attn.a.recurrent
    finally:
        ws.close()
    curve = LayerCurve()
    qtbot.addWidget(curve)
    curve.set_record(rec)
    xs, _ys = curve.recurrent.getData()
    assert list(xs) == [0.0, 1.0, 2.0]
    assert "recurrent layer" in curve.getAxis("bottom").labelText
    curve.clear_record()
    assert len(curve.recurrent.getData()[0]) == 0 and "recurrent" not in curve.getAxis("bottom").labelText
    view = HeadPairView()
    qtbot.addWidget(view)
    view.set_shape(rec.n_layers, rec.n_heads)
    view.set_pair(first)
    assert view.info.text().startswith("layer 0 (recurrent: read shares of |W|, no softmax), value head 3")
    view.set_pair(attn)
    assert view.info.text().startswith("layer 3, head 3 (KV head 1)")
