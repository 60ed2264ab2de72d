"""The window without a model: tabs and lens slots, shortcuts, drag and drop, catalog fetch with cancel, export."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QFileDialog, QLabel

from app.main_window import MainWindow
from app.views.attention.lens import AttentionLens
from app.views.catalog import CatalogDialog
from app.views.lenses import LensSlot
from app.views.quant.lens import QuantLens
from engine.errors import FetchError


@pytest.fixture()
def window(qtbot, data_dir: Path) -> MainWindow:
    w = MainWindow(load=False)
    qtbot.addWidget(w)
    w.show()
    yield w
    if not w.closed:
        w.close()
    assert w.engine.threads() == []


def test_layout_and_shortcuts(window: MainWindow) -> None:
    assert window.windowTitle() == "GGUF Lens"
    tabs = [window.lens_tabs.tabText(i) for i in range(window.lens_tabs.count())]
    assert tabs == ["Attention", "Positions", "Quantization", "Experts", "Why", "Compare", "Experiments", "Model"]
    actions = {a.text(): a for m in window.menuBar().findChildren(type(window.menuBar().actions()[0].menu()))
               for a in m.actions()}
    assert actions["New chat"].shortcut().toString() == "Ctrl+N"
    first = window.conversation.current
    window.conversation.current.draft = "typed"
    actions["New chat"].trigger()
    assert window.conversation.current is not first and window.chat_list.list.count() == 2
    assert window.status.model.text() == "no model"


def test_send_without_model_keeps_text(window: MainWindow) -> None:
    window.chat_view.input.setPlainText("hello?")
    window.chat_view._submit()
    assert window.chat_view.input.toPlainText() == "hello?"
    assert any("No model" in t for t in window.chat_view.banner_texts())


def test_lens_slot_shows_why_a_lens_could_not_be_built(qtbot) -> None:
    class BrokenLens(QLabel):
        title = "Demo"

        def __init__(self) -> None:
            raise RuntimeError("no colormap")

    slot = LensSlot(BrokenLens)  # type: ignore[arg-type]
    qtbot.addWidget(slot)
    assert slot.widget is None and slot.placeholder is not None
    assert "Demo lens could not be built" in slot.placeholder.text() and "RuntimeError: no colormap" in slot.error
    slot.connect_requests(object())  # type: ignore[arg-type]  # nothing to connect: no error


def test_lens_tabs_select_and_content(window: MainWindow) -> None:
    tabs = window.lens_tabs
    assert tabs.select("quantization") is tabs.lens(QuantLens) is window.lens_slots["Quantization"].widget
    assert tabs.showing("Quantization") and not tabs.showing("Attention")
    assert tabs.select("Compare") is window.compare_view and tabs.currentWidget() is window.compare_view
    assert tabs.content("Attention") is tabs.lens(AttentionLens) and tabs.content("nowhere") is None
    assert window.load_error_box is None


def test_drop_a_gguf_opens_it(window: MainWindow, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    opened: list[str] = []
    monkeypatch.setattr(window, "open_model", opened.append)
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(tmp_path / "m.gguf"))])
    event = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                       Qt.KeyboardModifier.NoModifier)
    window.dropEvent(event)
    assert opened == [str(tmp_path / "m.gguf")]


def test_catalog_dialog_lists_models(qtbot) -> None:
    dialog = CatalogDialog()
    qtbot.addWidget(dialog)
    names = [dialog.list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(dialog.list.count())]
    assert "smollm2-135m-instruct" in names
    with qtbot.waitSignal(dialog.chosen) as chosen:
        dialog._accept()
    assert chosen.args == ["smollm2-135m-instruct"]


def test_catalog_download_shows_progress_and_cancels(qtbot, window: MainWindow, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine import catalog

    def slow_fetch(name: str, *, progress=None, cancel: threading.Event | None = None) -> Path:
        for i in range(500):
            if cancel is not None and cancel.is_set():
                raise FetchError("cancelled")
            progress("downloading", i / 500)
            time.sleep(0.01)
        raise AssertionError("not cancelled")

    monkeypatch.setattr(catalog, "is_installed", lambda e, folder=None: None)
    monkeypatch.setattr(catalog, "fetch", slow_fetch)
    window.open_model("smollm2-135m-instruct")
    qtbot.waitUntil(lambda: window.state.loading is not None and window.state.loading[1] > 0.01, timeout=120_000)
    assert window.status.progress.isVisible() and window.status.cancel.isVisible()
    window.status.cancel.click()
    qtbot.waitUntil(lambda: window.state.loading is None, timeout=120_000)
    assert "cancelled" in window.status.currentMessage() and getattr(window, "load_error_box", None) is None
    assert not window.status.progress.isVisible()
    assert window.state.model is None


def test_export_from_menu(window: MainWindow, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    chat = window.conversation.current
    chat.system_prompt = "sys"
    target = tmp_path / "out"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(target), ""))
    window.export(chat.id, "json")
    assert json.loads((tmp_path / "out.json").read_text())["system_prompt"] == "sys"
    window.export(chat.id, "md")
    assert (tmp_path / "out.md").read_text().startswith("# New chat")


def test_settings_survive_restart(qtbot, window: MainWindow, data_dir: Path) -> None:
    window.sampling.controls["temperature"].setValue(0.33)
    window.sampling.policy.setCurrentIndex(window.sampling.policy.findData("drop_oldest"))
    window.close()
    again = MainWindow(load=False)
    qtbot.addWidget(again)
    assert again.state.settings.temperature == 0.33 and again.state.settings.overflow_policy == "drop_oldest"
    assert again.sampling.controls["temperature"].value() == 0.33
    again.close()
