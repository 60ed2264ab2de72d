"""Compare at 1280x800 and 1920x1080 (whole window, chat and docks shown): nothing clipped, nothing scrolls sideways.

The window is the real one without a model; the Compare view is filled with the synthetic comparison of
test_view.py and a logit lens pair, then each page is shown and measured.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtWidgets import QAbstractButton, QApplication, QComboBox, QLabel

from app.main_window import MainWindow
from app.records.compare import SweepPoint
from app.records.logit_lens import LogitLensPair
from app.views.compare.pages import LOGIT_MIN_HEIGHT, PAGES
from tests.app.views.attention.test_roles_logit import _logit_record
from tests.app.views.compare.test_view import head_pair, synthetic_record


def _settle(qtbot) -> None:
    for _ in range(3):
        QApplication.processEvents()
    qtbot.wait(20)


def _clipped(widget) -> list[str]:
    """Buttons, combo boxes and one-line labels on screen narrower than they ask to be."""
    out = []
    for child in [c for kind in (QAbstractButton, QComboBox, QLabel) for c in widget.findChildren(kind)]:
        if not child.isVisible() or child.width() <= 0:
            continue
        if isinstance(child, QLabel) and (child.wordWrap() or not child.text() or child.pixmap() is not None
                                          and not child.pixmap().isNull()):
            continue
        if isinstance(child, QLabel) and child.sizePolicy().horizontalPolicy().name == "Ignored":
            continue
        need = child.minimumSizeHint().width() if isinstance(child, QComboBox) else child.sizeHint().width()
        if child.width() + 1 < need:
            out.append(f"{type(child).__name__} {getattr(child, 'text', lambda: '')()!r}: {child.width()} < {need}")
    return out


@pytest.fixture(params=[(1280, 800), (1920, 1080)], ids=["1280x800", "1920x1080"])
def window(request, qtbot, data_dir: Path):
    w = MainWindow(load=False)
    qtbot.addWidget(w)
    w.resize(*request.param)
    w.show()
    _settle(qtbot)
    view = w.compare_view
    w.lens_tabs.setCurrentWidget(view)  # as in the app: Compare on screen with its empty states first
    _settle(qtbot)
    view.set_record(synthetic_record(n=64, vocab=80, n_layers=30))
    view.set_heads(head_pair())
    view.logit_pair.set_pair(LogitLensPair(_logit_record(n_layers=30, n=24, seed=1), _logit_record(n_layers=30, n=24, seed=2)))
    for name, kld, mib in (("Q8_0", 0.002, 136.0), ("Q4_K_M", 0.03, 100.0), ("Q2_K", 0.4, 82.0)):
        view.sweep.add_point(SweepPoint(name, "preset", int(mib * 2**20), 5.0, kld, 3 * kld, 90.0, 1.01, 64))
    _settle(qtbot)
    yield w, request.param
    w.close()


def test_compare_fits_the_window_on_every_page(window, qtbot) -> None:
    w, (width, _height) = window
    view = w.compare_view
    assert view.width() < width  # the chat and the docks are beside it
    assert view.minimumSizeHint().width() <= view.width()
    bar = view.middle.tabBar()
    assert bar.tabRect(bar.count() - 1).right() <= bar.width()  # every page's title is on screen
    for key, _title, _tip in PAGES:
        view.show_page(key)
        _settle(qtbot)
        assert _clipped(view) == [], key
    view.show_page("summary")
    _settle(qtbot)
    assert view.summary.isVisible() and not view.summary.horizontalScrollBar().isVisible()
    assert view.summary.viewport().width() >= view.summary.horizontalHeader().length() - 1
    assert view.layers.width() >= 240 and view.layers.height() >= 200
    assert _title_inside(view.layers)
    table, curve = view.stacks["summary"].width(), view.stacks["layers"].width()
    assert 0.38 < table / (table + curve) < 0.58 or (table <= 345 and curve > table)  # they share the page
    _logit_lens_gets_the_height(view, qtbot)
    _sweep_shows_its_points_and_whole_title(view, qtbot)


def _title_inside(plot) -> bool:
    """The plot's title (the layer chart's is its legend) drawn whole inside the widget."""
    item = plot.getPlotItem().titleLabel.item
    drawn = item.mapRectToScene(item.boundingRect())
    return drawn.left() >= 0 and drawn.right() <= plot.width()


def test_layer_chart_title_fits_from_the_narrowest_pane_up(qtbot) -> None:
    from app.views.compare.charts import LayerCurve

    curve = LayerCurve()
    qtbot.addWidget(curve)
    curve.show()
    for width in (240, 300, 429, 430, 700, 1200):  # 240 px: the least the layout gives it
        curve.resize(width, 300)
        _settle(qtbot)
        assert _title_inside(curve), (width, curve.getPlotItem().titleLabel.item.boundingRect().width())


def _logit_lens_gets_the_height(view, qtbot) -> None:
    view.show_page("logit")
    _settle(qtbot)
    pair = view.logit_pair
    assert pair.height() >= LOGIT_MIN_HEIGHT >= 300
    for panel in (pair.a, pair.b):
        assert panel.plot.height() >= 150 and panel.table.isVisible()
        assert not panel.table.horizontalScrollBar().isVisible()
    assert pair.a.geometry().right() < pair.b.geometry().left()  # A | B side by side


def _sweep_shows_its_points_and_whole_title(view, qtbot) -> None:
    view.show_page("sweep")
    _settle(qtbot)
    sweep = view.sweep
    assert sweep.plot.isVisible() and sweep.plot.height() >= 200 and len(sweep.labels) >= 2
    title = sweep.plot.getPlotItem().titleLabel
    assert title.item.boundingRect().width() <= sweep.plot.width()


def test_adaptive_splitter_keeps_its_shares_and_turns_with_the_page(qtbot) -> None:
    from PySide6.QtWidgets import QLabel as Label

    from app.views.compare.pages import AdaptiveSplitter

    split = AdaptiveSplitter(Label("first"), Label("second"), ratio=1.0, share=0.4)
    qtbot.addWidget(split)
    split.resize(300, 200)
    split.show()
    for width, height in ((300, 200), (1200, 400), (500, 480), (400, 700), (900, 500)):
        split.resize(width, height)
        _settle(qtbot)
        first, second = split.sizes()
        wide = width >= height
        assert (split.orientation().name == "Horizontal") == wide
        assert abs(first / (first + second) - 0.4) < 0.03, (width, height, split.sizes())
    split.moveSplitter(700, 1)  # the user's sizes stay until the orientation flips
    dragged = split.sizes()
    split.resize(950, 500)
    _settle(qtbot)
    assert split.sizes() != [int(0.4 * 950), 950 - int(0.4 * 950)] and split.sizes()[0] > 0.5 * sum(split.sizes())
    assert dragged[0] > dragged[1]
