"""The presets chart names every preset (Q2_K beside Q3_K_S included) with no name over another name or point and
none outside the plot, and its KLD axis title is whole, in the real window at 1280x800 and 1366x768; the placement
itself fans a crowded cluster out around it."""
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QRectF

from app.main_window import MainWindow
from app.records.compare import SweepPoint
from app.views.compare.sweep_labels import overlaps, place

# llama-quantize's presets of a small model: (name, MiB, mean KLD); the 3- and 4-bit ones crowd each other
PRESETS = (("Q2_K", 88, 0.5), ("Q3_K_S", 88, 0.3), ("Q3_K_M", 94, 0.2), ("Q3_K_L", 98, 0.17), ("Q4_0", 92, 0.08),
           ("Q4_1", 99, 0.07), ("Q4_K_S", 97, 0.05), ("Q4_K_M", 101, 0.045), ("Q5_0", 105, 0.02), ("Q5_1", 112, 0.018),
           ("Q5_K_S", 106, 0.015), ("Q5_K_M", 108, 0.013), ("Q6_K", 132, 0.005), ("Q8_0", 138, 0.001),
           ("F16", 258, 1e-6))


def _settle(qtbot) -> None:  # noqa: ANN001 - pytest-qt
    qtbot.wait(100)


@pytest.mark.parametrize("size", [(1280, 800), (1366, 768)], ids=["1280x800", "1366x768"])
def test_every_preset_is_named_and_nothing_is_cut(qtbot, data_dir: Path, size: tuple[int, int]) -> None:
    w = MainWindow(load=False)
    qtbot.addWidget(w)
    w.resize(*size)
    w.show()
    view = w.compare_view
    w.lens_tabs.setCurrentWidget(view)
    view.show_page("sweep")
    _settle(qtbot)
    sweep = view.sweep
    sweep.set_file_type("Q8_0")
    for name, mib, kld in PRESETS:
        sweep.add_point(SweepPoint(name, "preset", int(mib * 2**20), 5.0, kld, 3 * kld, 90.0, 1.01, 64))
    _settle(qtbot)
    named = {label.toPlainText().split(" (")[0]: label for label in sweep.labels}
    assert sorted(named) == sorted(n for n, _, _ in PRESETS)
    boxes = {n: label.mapRectToScene(label.boundingRect()) for n, label in named.items()}
    frame = sweep.plot.getViewBox().sceneBoundingRect()
    points = [sweep.plot.getViewBox().mapViewToScene(s.pos()) for s in sweep.scatter.points()]
    for n, box in boxes.items():
        assert frame.contains(box), n
        assert not any(box.intersects(other) for m, other in boxes.items() if m != n), n
        assert not any(box.contains(p) for p in points), n
    axis = sweep.plot.getAxis("left")
    title = axis.label.mapRectToScene(axis.label.boundingRect())
    assert axis.label.isVisible() and "KLD" in axis.label.toPlainText()
    assert QRectF(0, 0, sweep.plot.width(), sweep.plot.height()).contains(title)  # not cut at the widget's edge
    w.close()


def test_a_crowded_cluster_is_fanned_out() -> None:
    points = [(100.0 + 3 * i, 100.0 + 2 * i) for i in range(12)]  # twelve points within 40 px
    sizes = [(46.0, 14.0)] * len(points)
    spots = place(points, sizes, list(range(len(points))), 400.0, 300.0)
    assert sorted(spots) == list(range(len(points)))
    boxes = [spots[i].box for i in range(len(points))]
    for i, a in enumerate(boxes):
        assert 0 <= a[0] and a[2] <= 400 and 0 <= a[1] and a[3] <= 300
        assert not any(overlaps(a, b, gap=0) for b in boxes[i + 1 :])
        assert not any(a[0] < x < a[2] and a[1] < y < a[3] for x, y in points)
    assert any(s.leader for s in spots.values())  # no room beside the points: some names sit out on leaders
