"""Nothing is cut at 1280x800 and 1366x768: in the real window, after one short reply, every lens tab and every page
inside it, nested pages included (the Attention views, the Quantization lens's tables, tensor and block pages, the
Compare, Model and Experiments pages), is shown in turn at both sizes, on a dense llama, a Mixture-of-Experts
qwen3moe, a hybrid qwen35moe and a Gemma 3 (test_nothing_cut_real.py walks the real SmolLM2 and Gemma 3 files).

On each page: no one-line label or button on screen is narrower than its text (a label may cut its text with … only
where its tooltip holds the whole text: app.views.attention.controls.ElidedLabel, app.views.status.ElidedLabel);
no text view (a chat bubble, the Experts token panel) holds text wider than itself; nothing scrolls sideways (the
chat template wraps its long lines, the quantization table pages its columns). The Experts lens is checked with a
token clicked, the Quantization lens with a tensor open, the Attention grid's head labels never run together, and the status bar is checked while a
reply streams."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import pytest
from PySide6.QtWidgets import (QAbstractButton, QAbstractScrollArea, QLabel, QPlainTextEdit, QTabWidget, QTextEdit,
                               QWidget)

from app.main_window import MainWindow
from app.views.attention.lens import AttentionLens
from app.views.experts import ExpertsLens
from app.views.quant.grid import TypeGrid
from app.views.quant.lens import QuantLens
from app.views.status import ElidedLabel
from tests.app.test_end_to_end import wait_idle
from tests.app.windows import greedy_window
from tests.tiny_models import make_tiny_gemma3, make_tiny_llama
from tools.make_arch_models import write_arch

SIZES = ((1280, 800), (1366, 768))
WAIT_MS = 60_000
MODELS: dict[str, Callable[[Path], Path]] = {
    "llama": make_tiny_llama,
    "qwen3moe": lambda p: write_arch(p, "qwen3moe"),
    "qwen35moe": lambda p: write_arch(p, "qwen35moe"),  # a hybrid MoE: 28 tensor roles a layer
    "gemma3": make_tiny_gemma3,
}


def cut(root: QWidget) -> list[str]:
    """The one-line labels and the buttons on screen whose text needs more width than they have, and is not
    elided with the whole text in the tooltip."""
    out = []
    for w in root.findChildren(QLabel) + root.findChildren(QAbstractButton):
        if not w.isVisible() or w.width() <= 0 or not w.text():
            continue
        if isinstance(w, QLabel) and (w.wordWrap() or (w.pixmap() is not None and not w.pixmap().isNull())):
            continue
        if w.width() + 1 >= w.sizeHint().width():
            continue
        if isinstance(w, QLabel) and w.text() in w.toolTip():  # elided on purpose, said whole in the tooltip
            continue
        out.append(f"{type(w).__name__} {w.text()[:60]!r} in {type(w.parentWidget()).__name__}: "
                   f"{w.width()} < {w.sizeHint().width()}")
    return out


def grid_cut(root: QWidget) -> list[str]:
    """A Layers × tensors table on screen whose columns run past its edge, or whose role names are cut."""
    out = []
    for g in root.findChildren(TypeGrid):
        if not g.isVisible():
            continue
        if g.horizontalHeader().length() > g.viewport().width():
            out.append(f"TypeGrid columns {g.horizontalHeader().length()} px wide in {g.viewport().width()}")
        out += [f"TypeGrid name {g.role(j)!r} cut" for j in range(g.columnCount())
                if not g.isColumnHidden(j) and g.horizontalHeaderItem(j).text() != g.role(j).replace("_", "\n")]
    return out


def overflow(root: QWidget) -> list[str]:
    """Text views whose text is wider than they are (it runs past their edge: they never scroll sideways), and
    anything on screen that scrolls sideways: nothing does (a chat template wraps its lines unless told not to, the
    Layers × tensors table goes on pages)."""
    out = []
    for a in root.findChildren(QAbstractScrollArea):
        if not a.isVisible():
            continue
        if isinstance(a, QTextEdit) and a.document().size().width() > a.viewport().width() + 1:
            out.append(f"{type(a).__name__} in {type(a.parentWidget()).__name__}: text "
                       f"{a.document().size().width():.0f} wide in {a.viewport().width()}")
        elif a.horizontalScrollBar().isVisible():
            out.append(f"{type(a).__name__} in {type(a.parentWidget()).__name__} scrolls sideways at {a.width()} px")
    return out


def head_labels_run_together(lens: AttentionLens) -> list[str]:
    """The grid's head labels (h0, h1, …) closer together on screen than the widest of them is long."""
    plot = lens.grid.plot
    ticks = plot.getAxis("top")._tickLevels
    if not ticks or len(ticks[0]) < 2:
        return []
    (x0, x1), width = plot.getViewBox().viewRange()[0], plot.getViewBox().width()
    px = [x * width / (x1 - x0) for x, _ in ticks[0]]
    need = max(lens.grid.fontMetrics().horizontalAdvance(text) for _, text in ticks[0])
    gap = min(b - a for a, b in zip(px, px[1:]))
    return [] if gap >= need else [f"head labels {gap:.0f} px apart, {need} px long"]


def _outer_tabs(page: QWidget) -> list[QTabWidget]:
    """The visible tab widgets inside `page` that no other tab widget inside it holds."""
    out = []
    for tabs in page.findChildren(QTabWidget):
        up = tabs.parentWidget()
        while up is not None and up is not page and not isinstance(up, QTabWidget):
            up = up.parentWidget()
        if tabs.isVisible() and (up is page or up is None):
            out.append(tabs)
    return out


def _findings(w: MainWindow) -> list[str]:
    found = cut(w) + overflow(w) + grid_cut(w)
    attention = w.lens_tabs.lens(AttentionLens)
    if attention is not None and attention.grid.isVisible():
        found += head_labels_run_together(attention)
    return found


def _check(qtbot, w: MainWindow, where: str) -> list[str]:  # noqa: ANN001 - pytest-qt
    """What is cut on screen now; looked at again a moment later, so that a record that just arrived (its layout
    not yet run) is judged once laid out."""
    found = _findings(w)
    if found:
        qtbot.wait(300)
        found = _findings(w)
    return [f"{where}: {c}" for c in found]


def _walk(qtbot, w: MainWindow, page: QWidget, where: str) -> list[str]:  # noqa: ANN001 - pytest-qt
    """Every page of every tab widget inside `page`, nested ones too, each shown and checked."""
    found: list[str] = []
    for tabs in _outer_tabs(page):
        for j in range(tabs.count()):
            if tabs.isTabVisible(j):
                tabs.setCurrentIndex(j)
                qtbot.wait(60)
                inner = f"{where} / {tabs.tabText(j)}"
                found += _check(qtbot, w, inner) + _walk(qtbot, w, tabs.widget(j), inner)
                found += _grid_pages(qtbot, w, tabs.widget(j), inner)
    return found


def _grid_pages(qtbot, w: MainWindow, page: QWidget, where: str) -> list[str]:  # noqa: ANN001 - pytest-qt
    """Each family page of a Layers × tensors table that `page` itself holds, shown and checked."""
    found: list[str] = []
    for g in page.findChildren(TypeGrid):
        if g.parentWidget() is page and g.pages.isVisible():
            for i in range(g.pages.count()):
                g.pages.setCurrentIndex(i)
                qtbot.wait(60)
                found += _check(qtbot, w, f"{where} / {g.pages.tabText(i)}")
            g.pages.setCurrentIndex(0)
    return found


def _prepare(qtbot, w: MainWindow, title: str) -> None:  # noqa: ANN001 - pytest-qt
    """What a tab shows once used: the Experts lens a token clicked, the Quantization lens a tensor open."""
    experts = w.lens_tabs.lens(ExpertsLens)
    if title == "Experts" and experts is not None and experts.wants_routing():
        qtbot.waitUntil(lambda: experts.record is not None, timeout=WAIT_MS)
        lr = experts.current()
        experts.pick(1, int(lr.experts[1, 0]))
    quant = w.lens_tabs.lens(QuantLens)
    if title == "Quantization" and quant is not None and quant.tensor is None:
        name = max(quant.model.tensors, key=lambda t: (len(t.shape), t.nbytes)).name
        quant.open_tensor(name)
        qtbot.waitUntil(lambda: quant.tensor is not None and quant.tensor.name == name, timeout=WAIT_MS)


def walk_window(qtbot, w: MainWindow) -> list[str]:  # noqa: ANN001 - pytest-qt
    """Every lens tab and every page inside it, at both sizes, checked."""
    found: list[str] = []
    tabs = w.lens_tabs
    for size in SIZES:
        w.resize(*size)
        qtbot.wait(150)
        for i in range(tabs.count()):
            tabs.setCurrentIndex(i)
            qtbot.wait(100)
            _prepare(qtbot, w, tabs.tabText(i))
            where = f"{size[0]}x{size[1]} {tabs.tabText(i)}"
            found += _check(qtbot, w, where) + _walk(qtbot, w, tabs.widget(i), where)
    return found


def streaming_status(qtbot, w: MainWindow) -> list[str]:  # noqa: ANN001 - pytest-qt
    """The status bar at both sizes while a long reply streams (then stopped)."""
    w.state.settings = dataclasses.replace(w.state.settings, max_tokens=400)
    assert w.conversation.send("Tell me a long story about a lighthouse.")
    qtbot.waitUntil(lambda: len(w.conversation.current.messages[-1].tokens) >= 2, timeout=WAIT_MS)
    found = []
    for size in SIZES:
        w.resize(*size)
        qtbot.wait(50)
        streaming = w.conversation.generating
        found += [f"{size} status bar{'' if streaming else ' (after the reply)'}: {c}" for c in cut(w.statusBar())]
    w.chat_view.stop.emit()
    wait_idle(qtbot, w)
    return found


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("cut")
    return {name: make(folder / f"{name}.gguf") for name, make in MODELS.items()}


@pytest.mark.parametrize("name", list(MODELS))
def test_no_text_is_cut_at_either_size(qtbot, name: str, files: dict[str, Path], data_dir: Path) -> None:
    w = greedy_window(qtbot, files[name], data_dir, max_tokens=8)
    w.conversation.send("Hello there, how are you today?")
    wait_idle(qtbot, w)
    titles = [w.lens_tabs.tabText(i) for i in range(w.lens_tabs.count())]
    assert {"Attention", "Positions", "Quantization", "Experts", "Compare", "Model", "Experiments"} <= set(titles)
    found = walk_window(qtbot, w)
    if name in ("qwen3moe", "qwen35moe"):
        experts = w.lens_tabs.lens(ExpertsLens)
        assert experts.picked is not None and "Token 1" in experts.detail.toPlainText()  # the token panel was checked
    quant = w.lens_tabs.lens(QuantLens)
    if name == "qwen35moe":  # its 28 roles do not fit 1280x800 whole: the table showed them on pages (walked above)
        assert quant.grid.pages.count() > 1
    found += streaming_status(qtbot, w)
    assert found == [], "\n".join(sorted(set(found)))
    w.close()


def test_a_status_segment_cut_short_holds_its_whole_text(qtbot) -> None:
    holder = QWidget()
    qtbot.addWidget(holder)
    label = ElidedLabel("", holder)
    label.setToolTip("what it is")
    label.setText("compiling faster kernels · 10 s")
    holder.show()
    label.resize(label.sizeHint().width() - 20, label.sizeHint().height())
    assert label.elided() and cut(holder) == [] and label.toolTip() == "compiling faster kernels · 10 s\nwhat it is"
    label.resize(label.sizeHint().width() + 10, label.sizeHint().height())
    assert label.toolTip() == "what it is"
