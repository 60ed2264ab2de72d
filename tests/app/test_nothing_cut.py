"""Nothing is cut at 1280x800 and 1366x768: in the real window, after one short reply, every lens tab and every page
inside it (the Attention views, the Compare, Quantization, Model and Experiments pages) is shown in turn, and no
one-line label or button on screen is narrower than its text. A label may cut its text with … only where its tooltip
holds the whole text (app.views.attention.controls.ElidedLabel, the status bar's segments)."""
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtWidgets import QAbstractButton, QLabel, QTabWidget, QWidget

from app.main_window import MainWindow
from app.views.status import ElidedLabel
from tests.app.test_end_to_end import wait_idle
from tests.app.windows import greedy_window
from tests.tiny_models import make_tiny_llama

SIZES = ((1280, 800), (1366, 768))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("cut") / "tiny.gguf")


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


def _pages(qtbot, w: MainWindow) -> list[str]:  # noqa: ANN001 - pytest-qt
    """Every lens tab and every visible page of the tab widgets inside it, each shown and checked."""
    found: list[str] = []
    tabs = w.lens_tabs
    for i in range(tabs.count()):
        tabs.setCurrentIndex(i)
        qtbot.wait(150)
        found += [f"{tabs.tabText(i)}: {c}" for c in cut(w)]
        for inner in [t for t in tabs.widget(i).findChildren(QTabWidget) if t.isVisible()]:
            for j in range(inner.count()):
                if inner.isTabVisible(j):
                    inner.setCurrentIndex(j)
                    qtbot.wait(100)
                    found += [f"{tabs.tabText(i)} / {inner.tabText(j)}: {c}" for c in cut(w)]
    return found


def test_no_text_is_cut_at_either_size(qtbot, tiny: Path, data_dir: Path) -> None:
    w = greedy_window(qtbot, tiny, data_dir, max_tokens=8)
    w.conversation.send("Hello there, how are you today?")
    wait_idle(qtbot, w)
    titles = [w.lens_tabs.tabText(i) for i in range(w.lens_tabs.count())]
    assert {"Attention", "Positions", "Quantization", "Experts", "Compare", "Model", "Experiments"} <= set(titles)
    for size in SIZES:
        w.resize(*size)
        qtbot.wait(200)
        found = _pages(qtbot, w)
        assert found == [], f"{size}: " + "; ".join(sorted(set(found)))
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
