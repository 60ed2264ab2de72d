"""The Quantization lens at 1920x1080 (a pane of about 1130 px): the whole Layers × tensors table without sideways
scrolling (token_embd and output on screen) while the tensor pane keeps its room, and layer labels that never run
together ("1011121314…")."""
from __future__ import annotations

from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QApplication

from app.records.model import LayerInfo, ModelRecord, TensorRow
from app.views.quant.lens import RIGHT_MIN, ROLE_ORDER, QuantLens


def _settle(qtbot) -> None:
    for _ in range(4):
        QApplication.processEvents()
    qtbot.wait(20)


def smollm2_like(n_layers: int = 30) -> ModelRecord:
    """SmolLM2-135M's tensor table: nine roles per layer, token_embd, output_norm and output outside them."""
    rows = [TensorRow("token_embd.weight", None, "token_embd", "Q8_0", (576, 49152), 30_081_024, 8.5, 28_311_552)]
    for i in range(n_layers):
        for role in ROLE_ORDER:
            norm = role.endswith("norm")
            qt, n = ("F32", 576) if norm else ("Q4_1", 576 * 576)
            rows.append(TensorRow(f"blk.{i}.{role}.weight", i, role, qt, (576,) if norm else (576, 576),
                                  4 * n if norm else n * 5 // 8, 32.0 if norm else 5.0, n))
    rows.append(TensorRow("output_norm.weight", None, "output_norm", "F32", (576,), 2304, 32.0, 576))
    rows.append(TensorRow("output.weight", None, "output", "Q6_K", (576, 49152), 23_224_320, 6.5625, 28_311_552))
    layers = tuple(LayerInfo(i, 100000.0, None, 0.125) for i in range(n_layers))
    return ModelRecord(name="SmolLM2", arch="llama", path="/m/smollm2.gguf", dim=576, n_layers=n_layers, n_heads=9,
                       n_kv_heads=3, head_dim=64, n_vocab=49152, n_ctx=8192, rope_dim=64, rope_mode="norm", group=3,
                       layers=layers, tensors=tuple(rows), file_bytes=sum(r.nbytes for r in rows), runnable=True)


def test_the_table_gets_the_width_its_columns_need_when_there_is_room(qtbot) -> None:
    lens = QuantLens()
    qtbot.addWidget(lens)
    lens.resize(1130, 900)
    lens.show()
    lens.set_model(smollm2_like())
    _settle(qtbot)
    assert not lens.narrow_mode
    grid = lens.grid
    assert not grid.horizontalScrollBar().isVisible()  # token_embd, output_norm and output are on screen
    assert grid.viewport().width() >= grid.horizontalHeader().length()
    left, right = lens.split.sizes()
    assert right >= RIGHT_MIN and left <= max(lens.table_width(), 0.44 * sum(lens.split.sizes())) + 2
    lens.split.setSizes([400, 700])  # the user's own widths stay
    lens.split.splitterMoved.emit(400, 1)
    lens.resize(1200, 900)
    _settle(qtbot)
    assert abs(lens.split.sizes()[0] - 400) <= 40


def test_layer_labels_never_run_together(qtbot) -> None:
    lens = QuantLens()
    qtbot.addWidget(lens)
    lens.show()
    lens.set_model(smollm2_like())
    for width in (600, 1130, 1800):
        lens.resize(width, 900)
        _settle(qtbot)
        axis = lens.bars.getAxis("bottom")
        px = lens.bars.getPlotItem().vb.width() / 30  # screen pixels per layer
        need = QFontMetrics(axis.font()).horizontalAdvance("29") + 4
        assert lens.layer_step * px >= need, (width, lens.layer_step, px)
        ticks = axis._tickLevels[0]
        assert ticks[0][1] == "0" and len(ticks) == len(range(0, 30, lens.layer_step))
