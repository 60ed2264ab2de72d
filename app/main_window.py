"""MainWindow: docks and wiring only: the chat beside the lens tabs, chat list and sampling docks, status bar."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QCoreApplication, QMargins, QRect, QSize, Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QDragEnterEvent, QDropEvent, QGuiApplication, QKeySequence, QShowEvent
from PySide6.QtWidgets import QDockWidget, QFileDialog, QMainWindow, QMessageBox, QSplitter, QWidget

from app.controllers.conversation import Conversation
from app.controllers.lenses import LensBridge
from app.controllers.experiments import ExperimentsBridge
from app.controllers.quant import QuantBridge
from app.controllers.serve import ServeController
from app.data.store import Settings, Store, export_chat
from app.state import AppState
from app.views.chat.chat_list import ChatList
from app.views.chat.sampling import SamplingPanel
from app.views.chat.view import ChatView
from app.views.compare.view import CompareView
from app.records.attribution import REPLY_TOKEN
from app.views.attribution import WhyLens
from app.views.lenses import LensTabs
from app.views.model_info import ModelLens
from app.views.experiments import ExperimentsView
from app.views.quant.lens import QuantLens
from app.views.status import StatusPanel
from app.window_models import TITLE, ModelSlots
from app.workers.engine import Engine
from app.workers.saver import Saver

log = logging.getLogger(__name__)

FIRST_SIZE = (1560, 940)  # a first start's window where the screen has room for it; a smaller screen's area else
FRAME_GUESS = QMargins(2, 32, 2, 2)  # a window manager's frame, until the window is shown and its frame is known


def available_area(widget: QWidget) -> QRect | None:
    """The part of the widget's screen a window may cover (panels and docks left out); None on the offscreen
    platform (the tests, --screenshot), whose stand-in screen is nobody's."""
    if QGuiApplication.platformName() == "offscreen":
        return None
    screen = widget.screen() or QGuiApplication.primaryScreen()
    return None if screen is None else screen.availableGeometry()


class MainWindow(ModelSlots, QMainWindow):
    """The app window; owns the state, the engine handle, the saver and the conversation."""

    def __init__(self, model: str | None = None, store: Store | None = None, load: bool = True):
        super().__init__()
        self.setWindowTitle(TITLE)
        self.setAcceptDrops(True)
        self.store = store or Store()
        self.state = AppState(self.store.load_settings())
        self.saver = Saver(self)
        self.engine = Engine(self.state.settings.context_limit, self)
        self.conversation = Conversation(self.store, self.engine, self.saver, lambda: self.state.settings, self)
        self.closed = False
        self.shown_once = False
        self.load_error_box: QMessageBox | None = None  # the last "could not be loaded" message, if one was shown
        self.model_label = ""  # "SmolLM2 135M · Q4_1": the model (and quantization) each reply is signed with
        self._quant_spec: Any = None  # the overrides the model holds (app.data.overrides.OverrideSpec), for the signature
        self._intervened = ""  # the Experiments tab's interventions on the model, for the signature and the banner
        self._build()
        self._wire()
        self._default_state = self.saveState()  # the docks as _build placed them: View > Reset layout goes back
        self._restore_layout()
        self.conversation.load(self.state.settings.current_chat)
        if load:
            QTimer.singleShot(0, lambda: self.open_model(model or self.initial_model()))

    # -- building
    def _build(self) -> None:
        self.chat_view = ChatView()
        self.lens_tabs = LensTabs()  # a tab per lens class in app.views.lenses.LENSES, in its order
        self.lens_slots = self.lens_tabs.slots
        self.compare_view = CompareView()
        self.lens_tabs.addTab(self.compare_view, "Compare")
        self.experiments_view = ExperimentsView()
        self.patching_view = self.experiments_view.patching
        self.lens_tabs.addTab(self.experiments_view, "Experiments")
        self.model_lens = ModelLens(self.state)
        self.lens_tabs.addTab(self.model_lens, "Model")
        split = QSplitter(Qt.Orientation.Horizontal)
        split.setObjectName("mainSplit")
        split.addWidget(self.chat_view)
        split.addWidget(self.lens_tabs)
        split.setStretchFactor(0, 5)
        split.setStretchFactor(1, 6)
        split.setChildrenCollapsible(False)  # neither pane can be dragged to nothing (minimum widths hold)
        self.lens_tabs.setMinimumWidth(480)
        self.split = split
        self.setCentralWidget(split)
        self.chat_list = ChatList()
        self.sampling = SamplingPanel(self.state)
        self.chat_dock = self._dock("Chats", self.chat_list, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.sampling_dock = self._dock("Sampling", self.sampling, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.bridge = LensBridge(self.engine, self.state, self.lens_slots, self)
        self.bridge.visible = self.lens_tabs.showing
        self.bridge.bind_conversation(self.conversation)  # the lenses follow the conversation on screen
        self.quant_bridge = QuantBridge(self.engine, self.state, self.lens_tabs.lens(QuantLens), self.compare_view,
                                        self.bridge, self)
        self.bridge.why.compare_workspace = lambda: self.quant_bridge.workspace  # the Why lens's A and B
        self.experiments_bridge = ExperimentsBridge(self.engine, self.state, self.experiments_view, self,
                                                    conversation=self.conversation, compare=self.compare_view)
        self.lens_tabs.currentChanged.connect(lambda i: self.bridge.tab_shown(self.lens_tabs.tabText(i)))
        self.status = StatusPanel(self.state)
        self.setStatusBar(self.status)
        self.serve = ServeController(self.engine, self.conversation, port=lambda: self.state.settings.serve_port,
                                     model_label=lambda: self.model_label, banner=self.chat_view.show_banner, parent=self)
        self.status.addPermanentWidget(self.serve.label)
        self._menus()

    def _dock(self, title: str, widget: Any, area: Qt.DockWidgetArea) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(f"dock{title}")
        dock.setWidget(widget)
        self.addDockWidget(area, dock)
        return dock

    def _action(self, menu: Any, text: str, slot: Any, shortcut: Any = None) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        action.triggered.connect(lambda _checked=False: slot())
        menu.addAction(action)
        return action

    def _menus(self) -> None:
        bar = self.menuBar()
        f = bar.addMenu("&File")
        self._action(f, "New chat", self.conversation.new_chat, QKeySequence.StandardKey.New)
        self._action(f, "Open model…", self.choose_file, QKeySequence.StandardKey.Open)
        self._action(f, "Model catalog…", self.choose_catalog)
        f.addSeparator()
        self._action(f, "Export chat as Markdown…", lambda: self.export(self.conversation.current.id, "md"))
        self._action(f, "Export chat as JSON…", lambda: self.export(self.conversation.current.id, "json"))
        f.addSeparator()
        self.serve_action = QAction("Serve the model (OpenAI API on 127.0.0.1)", self, checkable=True)
        self.serve_action.setToolTip("OpenAI clients reach the loaded model at http://127.0.0.1:PORT/v1 (Settings: "
                                     "serve_port); each request shows up in the chat list")
        self.serve_action.toggled.connect(lambda on: self.serve.set_serving(on))
        self.serve.serving_changed.connect(self._serving_changed)
        f.addAction(self.serve_action)
        f.addSeparator()
        self._action(f, "Quit", self.close, QKeySequence.StandardKey.Quit)
        c = bar.addMenu("&Chat")
        self._action(c, "Stop reply\tEsc", self.conversation.stop)
        self._action(c, "Regenerate", self.conversation.regenerate, "Ctrl+R")
        self._action(c, "Continue reply", self.conversation.continue_reply)
        v = bar.addMenu("&View")
        self.view_menu = v
        v.addAction(self.chat_dock.toggleViewAction())
        v.addAction(self.sampling_dock.toggleViewAction())
        for title, pane in (("Chat", self.chat_view), ("Lenses", self.lens_tabs)):
            action = QAction(f"{title} pane", self, checkable=True, checked=True)
            action.toggled.connect(lambda on, p=pane: self._show_pane(p, on))
            v.addAction(action)
            setattr(self, f"{title.lower()}_pane_action", action)
        v.addSeparator()
        for i in range(self.lens_tabs.count()):
            name = self.lens_tabs.tabText(i)
            self._action(v, f"{name} tab", lambda i=i: self._show_tab(i), f"Ctrl+{i + 1}")
        v.addSeparator()
        self._action(v, "Reset layout", self.reset_layout)

    # -- wiring
    def _wire(self) -> None:
        conv, view, st = self.conversation, self.chat_view, self.state
        view.send.connect(conv.send)
        view.stop.connect(conv.stop)
        view.regenerate.connect(conv.regenerate)
        view.continue_reply.connect(conv.continue_reply)
        view.edit_resend.connect(conv.edit_resend)
        view.branch_requested.connect(conv.branch)
        view.version_requested.connect(conv.select_version)
        view.why_requested.connect(self._why_token)
        view.prompt_mode_chosen.connect(self._prompt_mode_chosen)
        view.system_prompt_edited.connect(conv.set_system_prompt)
        view.draft_edited.connect(conv.set_draft)
        conv.chat_opened.connect(self._chat_opened)
        conv.chats_changed.connect(lambda: self.chat_list.show_chats(conv.chats, conv.current))
        conv.messages_changed.connect(lambda cid: view.sync() if view.chat is not None and view.chat.id == cid else None)
        conv.message_updated.connect(
            lambda cid, i, now: view.message_changed(i, now) if view.chat is not None and view.chat.id == cid else None)
        conv.generating_changed.connect(view.set_generating)
        conv.generating_changed.connect(lambda on: setattr(st, "generating", on))
        conv.prefill.connect(view.set_prefill)
        conv.banner.connect(view.show_banner)
        conv.input_consumed.connect(view.clear_input)
        conv.input_restored.connect(view.set_input)
        conv.reply_done.connect(self._reply_done)
        conv.live_stats.connect(lambda tok_s, used: (setattr(st, "tok_s", tok_s), setattr(st, "ctx_used", used)))
        conv.message_updated.connect(lambda _cid, _i, _now: self.bridge.reply_progress())
        self.chat_list.open_requested.connect(conv.open_chat)
        self.chat_list.new_requested.connect(conv.new_chat)
        self.chat_list.rename_requested.connect(conv.rename)
        self.chat_list.delete_requested.connect(self.confirm_delete)
        self.chat_list.export_requested.connect(self.export)
        self.engine.load_progress.connect(
            lambda p: setattr(st, "loading", None if p is None else (p.what, p.fraction)))
        self.engine.loaded.connect(self._loaded)
        self.engine.load_failed.connect(self._load_failed)
        self.engine.load_cancelled.connect(lambda msg: self.status.showMessage(f"Model not loaded: {msg}", 8000))
        self.status.cancel_load.connect(self.engine.cancel_load)
        self.engine.lens_progress.connect(self.status.set_lens_progress)
        self.status.stop_lens.connect(self.engine.cancel_lens)
        self.saver.failed.connect(lambda msg: view.show_banner("error", msg))
        self.quant_bridge.applied.connect(  # replies made after Apply name the overrides too ('Q4_1 + 3 overrides')
            lambda spec: self._sign(spec=spec))
        self.experiments_bridge.interventions_changed.connect(self._interventions)
        self.experiments_view.interventions.regenerate_requested.connect(self.conversation.regenerate)
        st.settings_changed.connect(self._settings_changed)
        st.model_changed.connect(lambda info: self.model_lens.show_info(info))
        st.model_changed.connect(self._title)
        st.kv_type_changed.connect(self.compare_view.set_cache_default)  # one KV default: the chat's
        self.compare_view.set_cache_default(st.kv_type)

    def _chat_opened(self, chat: Any) -> None:
        self.chat_view.show_chat(chat)
        self.chat_view.show_prompt_mode(self.conversation.prompt_mode(chat))
        self.bridge.chat_changed()  # the other chat's tokens, attention, head roles and logit lens go
        self.chat_list.show_chats(self.conversation.chats, chat)
        self.state.settings = dataclasses.replace(self.state.settings, current_chat=chat.id)
        self._writer_note()

    def _settings_changed(self, settings: Settings) -> None:
        self.engine.set_context_limit(settings.context_limit)
        self.saver.submit("settings", lambda s=settings: self.store.save_settings(s))

    # -- replies
    def _reply_done(self, done: Any) -> None:
        st = self.state
        st.tok_s, st.ctx_used, st.ctx_size, st.kv_bytes = done.gen_tok_s, done.ctx_used, done.n_ctx, done.kv_bytes
        self.bridge.reply_finished(done.finish_reason == "cancelled")

    # -- chats
    def confirm_delete(self, chat_id: str) -> None:
        chat = self.conversation.chat(chat_id)
        if chat is None:
            return
        box = QMessageBox(QMessageBox.Icon.Question, TITLE, f"Delete the chat “{chat.title}”?", parent=self)
        box.setTextFormat(Qt.TextFormat.PlainText)
        box.setInformativeText("Its file is removed; this cannot be undone. Export it first to keep a copy.")
        box.setStandardButtons(QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel)
        if box.exec() == QMessageBox.StandardButton.Yes:
            self.conversation.delete(chat_id)

    def export(self, chat_id: str, kind: str) -> None:
        chat = self.conversation.chat(chat_id)
        if chat is None:
            return
        suffix = ".md" if kind == "md" else ".json"
        name = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in chat.title)[:60].strip() or "chat"
        filt = "Markdown (*.md)" if kind == "md" else "JSON (*.json)"
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", str(Path.home() / (name + suffix)), filt)
        if not path:
            return
        path = path if path.endswith(suffix) else path + suffix
        try:
            export_chat(chat, Path(path))
        except OSError as exc:
            self.chat_view.show_banner("error", f"Export failed: {exc}")
        else:
            self.status.showMessage(f"Exported to {path}", 5000)

    # -- drag and drop, layout, closing
    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 - Qt override
        if any(u.toLocalFile().lower().endswith(".gguf") for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 - Qt override
        files = [u.toLocalFile() for u in event.mimeData().urls() if u.toLocalFile().lower().endswith(".gguf")]
        if files:
            event.acceptProposedAction()
            self.open_model(files[0])

    def _restore_layout(self) -> None:
        s = self.state.settings
        if s.geometry:
            self.restoreGeometry(QByteArray.fromBase64(s.geometry.encode()))  # saved on another screen, maybe
        else:
            self.resize(*FIRST_SIZE)
            area = available_area(self)
            if area is not None:  # centred on the screen, and within it (below)
                self.move(area.center() - self.rect().center())
            QTimer.singleShot(0, self._default_docks)
        self._wanted_size = self.size()  # back up to this once shown, if the frame is smaller than guessed
        self.fit_to_screen()
        split = s.extra.get("split")
        if isinstance(split, str):
            self.split.restoreState(QByteArray.fromBase64(split.encode()))
        else:
            self.split.setSizes([470, 830])
        if s.window_state:
            self.restoreState(QByteArray.fromBase64(s.window_state.encode()))

    def fit_to_screen(self, grow_to: QSize | None = None) -> None:
        """Shrink and move the window, its frame included, into its screen's available area: a first start on a
        small screen, a geometry saved on a larger one. A maximized or full-screen window is the screen's already.
        grow_to: the size to grow back up to where the room allows, once the frame is known, not guessed."""
        area = available_area(self)
        if area is None or self.isMaximized() or self.isFullScreen():
            return
        frame, inner = self.frameGeometry(), self.geometry()
        m = QMargins(inner.left() - frame.left(), inner.top() - frame.top(),
                     frame.right() - inner.right(), frame.bottom() - inner.bottom())
        if m.isNull() and not self.isVisible():
            m = FRAME_GUESS
        if m.isNull():  # no frame, or one not known yet: no growing into room it may take
            grow_to = None
        want = self.size() if grow_to is None else grow_to.expandedTo(self.size())
        width = min(want.width(), area.width() - m.left() - m.right())
        height = min(want.height(), area.height() - m.top() - m.bottom())
        if (width, height) != (self.width(), self.height()):
            self.resize(width, height)
        outer_w, outer_h = self.width() + m.left() + m.right(), self.height() + m.top() + m.bottom()
        x = max(area.left(), min(frame.x(), area.right() + 1 - outer_w))
        y = max(area.top(), min(frame.y(), area.bottom() + 1 - outer_h))
        if (x, y) != (frame.x(), frame.y()):
            self.move(x, y)

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        if not self.shown_once:  # the window manager's frame is known now: within the screen, frame and all
            self.shown_once = True
            QTimer.singleShot(0, lambda: self.fit_to_screen(self._wanted_size))

    def _show_pane(self, pane: Any, on: bool) -> None:
        """Show or hide the chat or the lens pane; one of them always stays."""
        other = self.lens_tabs if pane is self.chat_view else self.chat_view
        if not on and other.isHidden():
            other.show()
            (self.lenses_pane_action if other is self.lens_tabs else self.chat_pane_action).setChecked(True)
        pane.setVisible(on)

    def _show_tab(self, index: int) -> None:
        self.lenses_pane_action.setChecked(True)
        self.lens_tabs.setCurrentIndex(index)

    def reset_layout(self) -> None:
        """Every pane and dock back where a first start puts them."""
        self.restoreState(self._default_state)
        for dock in (self.chat_dock, self.sampling_dock):
            dock.setFloating(False)
            dock.show()
        self.chat_pane_action.setChecked(True)
        self.lenses_pane_action.setChecked(True)
        self._default_docks()

    def _default_docks(self) -> None:
        self.resizeDocks([self.chat_dock], [250], Qt.Orientation.Horizontal)
        self.resizeDocks([self.chat_dock, self.sampling_dock], [300, 400], Qt.Orientation.Vertical)
        chat = 470 if self.width() >= 1600 else 390  # a narrow window leaves the lenses the room they need
        self.split.setSizes([chat, max(600, self.split.width() - chat)])

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt override
        """Stop the reply, wait for every worker thread, then save chats and settings."""
        if not self.closed:
            self.shutdown()
        super().closeEvent(event)

    def _why_token(self, index: int, position: int) -> None:
        """A reply token's "Why this token?": the Why lens explains it (the last reply's; an earlier reply's tokens
        are not in the conversation the lens reads as a reply)."""
        chat = self.conversation.current
        last = max((i for i, m in enumerate(chat.messages) if m.role == "assistant"), default=-1) if chat else -1
        if index != last:
            self.chat_view.show_banner("info", "Why this token explains tokens of the last reply: regenerate or "
                                               "branch from this one to explain it.")
            return
        self.lens_tabs.select(WhyLens.title)
        self.lens_tabs.lens(WhyLens).ask(REPLY_TOKEN + int(position))

    def _serving_changed(self, on: bool) -> None:
        self.serve_action.blockSignals(True)
        self.serve_action.setChecked(on)
        self.serve_action.blockSignals(False)

    def shutdown(self) -> None:
        self.closed = True
        self.serve.shutdown()
        self.conversation.stop()
        self.engine.shutdown()
        self.quant_bridge.close()
        QCoreApplication.processEvents()  # deliver the stopped replies' last records
        for reply in list(self.conversation.replies.values()):
            if reply.message.content or reply.message.tokens:
                reply.message.stopped = True
            self.conversation.save(reply.chat)
        self.conversation.save_pending()
        self.state.settings = dataclasses.replace(
            self.state.settings,
            geometry=bytes(self.saveGeometry().toBase64()).decode(),
            window_state=bytes(self.saveState().toBase64()).decode(),
            extra={**self.state.settings.extra, "split": bytes(self.split.saveState().toBase64()).decode()},
        )
        self.saver.stop()
        self.store.release()  # another window opened on this data folder no longer shares it with this one
        try:
            self.store.save_settings(self.state.settings)
        except OSError as exc:
            log.error("could not save settings: %s", exc)
