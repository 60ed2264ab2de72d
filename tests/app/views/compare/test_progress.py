"""While a comparison or a sweep runs, Compare says so whole: no progress text squeezed into a thin bar, and no
"press Compare" left on screen."""
from __future__ import annotations

from PySide6.QtWidgets import QApplication, QLabel

from app.records.compare import TaskProgress
from app.views.compare.empty import EMPTY
from app.views.compare.view import CompareView
from tests.app.test_lenses_common import synthetic_model_record
from tests.app.views.compare.test_view import synthetic_record

WHAT = "B: requantizing to Q4_K_M (blk.12.ffn_down.weight)"


def _settle(qtbot) -> None:
    for _ in range(3):
        QApplication.processEvents()
    qtbot.wait(20)


def _empty_texts(view: CompareView) -> list[str]:
    return [stack.widget(0).text() for stack in view.stacks.values() if isinstance(stack.widget(0), QLabel)]


def test_a_running_comparison_says_what_it_does_and_never_press_compare(qtbot) -> None:
    view = CompareView()
    qtbot.addWidget(view)
    view.resize(590, 640)  # the pane beside the chat at 1280x800
    view.show()
    view.set_model(synthetic_model_record())
    assert "press Compare" in view.status.text() and any("press Compare" in t for t in _empty_texts(view))
    view.set_running(True)
    view.set_progress(TaskProgress("compare", WHAT, 0.4))
    _settle(qtbot)
    assert not any("press Compare" in t.replace("Press", "press") for t in [view.status.text(), *_empty_texts(view)])
    assert WHAT in view.status.text() and all("Comparing A and B" in t for t in _empty_texts(view))
    bar = view.progress  # the bar holds the percentage only, and has room for it on one line
    assert bar.isVisible() and bar.format() == "%p%" and bar.text() == "40%"
    assert bar.fontMetrics().horizontalAdvance(bar.text()) < bar.width() // 2
    view.set_record(synthetic_record())
    view.set_running(False)
    assert not view.progress.isVisible() and "KLD mean" in view.status.text()


def test_a_cancelled_comparison_puts_the_hint_back(qtbot) -> None:
    view = CompareView()
    qtbot.addWidget(view)
    view.set_model(synthetic_model_record())
    view.set_running(True)
    view.set_running(False)  # ended without a record or a reason
    assert "Choose B and press Compare" in view.status.text() and _empty_texts(view)[0] == EMPTY["summary"]
    view.set_running(True)
    view.failed("compare", "cancelled")
    assert "Comparison stopped" in view.status.text() and _empty_texts(view)[0] == EMPTY["summary"]


def test_the_sweep_progress_has_a_line_of_its_own(qtbot) -> None:
    view = CompareView()
    qtbot.addWidget(view)
    view.resize(590, 640)
    view.show()
    view.set_model(synthetic_model_record())
    view.show_page("sweep")
    view.set_progress(TaskProgress("sweep", WHAT, 0.25))
    _settle(qtbot)
    bar = view.sweep.progress
    assert bar.isVisible() and bar.width() >= view.sweep.width() - 12  # the whole width, not what the buttons leave
    assert bar.fontMetrics().horizontalAdvance(bar.text()) <= bar.width() - 24  # the text on one line, whole


def test_progress_with_an_apostrophe_reads_as_text(qtbot) -> None:
    """A step named after a file with an apostrophe is shown as the text, never as its escaped entity."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QTextDocument

    view = CompareView()
    qtbot.addWidget(view)
    view.set_model(synthetic_model_record())
    view.set_progress(TaskProgress("compare", "B: reading Bob's model.gguf", 0.3))
    assert view.status.textFormat() == Qt.TextFormat.RichText
    doc = QTextDocument()
    doc.setHtml(view.status.text())
    assert "Bob's model.gguf" in doc.toPlainText() and "&#x27;" not in doc.toPlainText()


def test_the_chat_kv_cache_type_is_compares_until_chosen(qtbot) -> None:
    """One KV default across the chat and Compare: both sides take the chat's type, a side chosen by hand keeps its."""
    view = CompareView()
    qtbot.addWidget(view)
    view.set_cache_default("F16")
    assert view.a_cache.currentText() == view.b_cache.currentText() == "F16" and view.options().a_cache == "F16"
    view.b_cache.setCurrentText("Q8_0")
    view.b_cache.activated.emit(view.b_cache.currentIndex())  # as a click in its list does
    view.set_cache_default("Q4_0")
    assert view.a_cache.currentText() == "Q4_0" and view.b_cache.currentText() == "Q8_0"
    view.set_cache_default("nonsense")  # a type the boxes do not list changes nothing
    assert view.a_cache.currentText() == "Q4_0"
