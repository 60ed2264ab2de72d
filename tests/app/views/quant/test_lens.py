"""QuantLens with synthetic records and with SmolLM2 / Gemma 3 files."""
from __future__ import annotations

import numpy as np
import pytest

from app.records.model import make_model_record
from app.records.tensor import TensorRecord, make_tensor_record
from app.views.common.colours import type_colour
from app.views.quant.lens import QuantLens
from engine.quant.blocks import decode_block
from engine.quant.types import GGMLType
from tests.app.test_lenses_common import smollm2_run, synthetic_model_record  # noqa: F401
from tests.conftest import GEMMA3_FILE, model_path


def _tensor_record() -> TensorRecord:
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, 144, dtype=np.uint8)
    raw[:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    raw[2:4] = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
    block = decode_block(raw, GGMLType.Q4_K)
    counts, edges = np.histogram(rng.standard_normal(4096), bins=64)
    sc, sedges = np.histogram(rng.random(128), bins=32)
    return TensorRecord(
        name="blk.1.attn_q.weight", layer=1, role="attn_q", type_name="Q4_K", shape=(256, 64), nbytes=9216, bpw=4.5,
        n_elements=16384, weight_counts=counts, weight_edges=edges.astype(np.float32),
        weight_stats={"min": -3.0, "max": 3.0, "mean": 0.0, "std": 1.0, "absmax": 3.0}, sampled_rows=64, n_rows=64,
        scale_counts={"d": sc, "d*sc": sc}, scale_edges={"d": sedges.astype(np.float32), "d*sc": sedges.astype(np.float32)},
        block=block, block_index=0, elapsed_s=0.001,
    )


def test_tables_bars_and_totals(qtbot) -> None:
    lens = QuantLens()
    qtbot.addWidget(lens)
    model = synthetic_model_record(n_layers=3)
    lens.set_model(model)
    g = lens.grid
    assert g.rowCount() == 4  # the model-wide row, then blk.0..2
    headers = [g.horizontalHeaderItem(c).text() for c in range(g.columnCount())]
    assert headers[:4] == ["attn\nnorm", "attn\nq", "attn\nk", "ffn\ndown"] and headers[-1] == "token\nembd"
    item = g.item(2, 1)  # blk.1 attn_q
    assert item.text() == "Q4_K" and item.background().color().getRgb()[:3] == type_colour("Q4_K")
    assert "blk.1.attn_q.weight" in item.toolTip() and "4.5 bits/weight" in item.toolTip()
    assert g.item(0, len(headers) - 1).text() == "Q8_0"
    assert lens.flat.rowCount() == len(model.tensors)
    assert f"{model.average_bpw:.3f} bits/weight" in lens.summary.text()
    bars = [i for i in lens.bars.getPlotItem().items if i.__class__.__name__ == "BarGraphItem"]
    assert len(bars) == 4  # one stack per type used inside the layers
    assert "overrides" in lens.overrides.title() and lens.overrides.rules.rowCount() == 0
    with qtbot.waitSignal(lens.tensor_requested, timeout=60_000) as sig:
        lens._grid_clicked(2, 1)
    assert sig.args == ["blk.1.attn_q.weight"]


def test_tensor_detail_block_fields(qtbot) -> None:
    lens = QuantLens()
    qtbot.addWidget(lens)
    lens.set_model(synthetic_model_record())
    rec = _tensor_record()
    lens.set_tensor(rec)
    d = lens.detail
    assert d.fields.rowCount() == 4
    assert [d.fields.item(r, 0).text() for r in range(4)] == ["d", "dmin", "scales", "qs"]
    assert d.fields.item(0, 1).text() == "0–1" and d.fields.item(3, 1).text() == "16–143"
    assert "0.01" in d.fields.item(0, 4).text()
    assert "Q4_K" in d.formula.text() and "dmin" in d.formula.text()
    assert [d.scale_box.itemText(i) for i in range(d.scale_box.count())] == ["d", "d*sc"]
    assert d.block_spin.maximum() == 9216 // 144 - 1
    with qtbot.waitSignal(lens.block_requested, timeout=60_000) as sig:
        d.block_spin.setValue(3)
    assert sig.args == ["blk.1.attn_q.weight", 3]


def test_real_smollm2_quant_lens(qtbot, smollm2_run) -> None:
    m = smollm2_run.model
    lens = QuantLens()
    qtbot.addWidget(lens)
    lens.tensor_requested.connect(lambda name: lens.set_tensor(make_tensor_record(m, name)))
    lens.set_model(make_model_record(m))
    assert lens.grid.rowCount() == 31 and "Q4_1" in lens.summary.text()
    lens.open_tensor("blk.0.ffn_down.weight")
    assert lens.tensor is not None and lens.tensor.type_name == "Q4_1"
    assert lens.detail.fields.rowCount() == 3


def test_gemma3_file_without_a_forward_pass(qtbot) -> None:
    path = model_path(GEMMA3_FILE)
    if path is None:
        pytest.skip("gemma-3-270m not found")
    from engine.gguf import open_gguf  # noqa: PLC0415

    with open_gguf(path) as g:
        lens = QuantLens()
        qtbot.addWidget(lens)
        lens.set_model(make_model_record(g))
        lens.set_tensor(make_tensor_record(g, "blk.0.attn_q.weight"))
        types = {lens.grid.item(r, c).text() for r in range(1, 19) for c in range(lens.grid.columnCount()) if lens.grid.item(r, c)}
        assert {"Q5_0", "F32"} <= types
        assert lens.detail.fields.rowCount() >= 2
