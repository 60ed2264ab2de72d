"""ServeController: File > Serve the model, the OpenAI-compatible endpoint (app.jobs.serve) on the model the window
holds; each request it answers becomes a chat marked with its source, which every lens reads like any other.

The endpoint follows the window: another model loaded while serving is served in its place (on the same port),
and quitting stops it. While it serves, a status-bar segment shows its URL and how many requests wait.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QLabel

from app.data.chats import Chat, Message, ReplyStats
from app.jobs.serve import AppServe, ServedExchange

log = logging.getLogger(__name__)

HOST = "127.0.0.1"  # loopback only: the app never serves other machines (`gguf-lens serve --host` can)
POLL_MS = 500


def exchange_chat(ex: ServedExchange, model_label: str) -> Chat:
    """A served request as a chat: its messages (a system message as the chat's system prompt), then the reply."""
    system = "\n\n".join(str(m.get("content") or "") for m in ex.messages if m.get("role") == "system")
    chat = Chat(system_prompt=system, source=f"API · {ex.source or 'a client'} · {ex.url}")
    if ex.completion:  # /v1/completions: the prompt as it was sent, continued as plain text
        chat.prompt_mode = "plain"
        chat.messages.append(Message("user", ex.prompt_text))
    for m in ex.messages:
        role = m.get("role")
        if role in ("user", "assistant"):
            content = m.get("content")
            text = content if isinstance(content, str) else " ".join(
                str(p.get("text", "")) for p in content or () if isinstance(p, dict))  # OpenAI's content parts
            chat.messages.append(Message(str(role), text))
    stats = ReplyStats(tokens=len(ex.tokens), prompt_tokens=ex.prompt_tokens, prefilled_tokens=ex.prompt_tokens,
                       gen_tok_s=ex.gen_tok_s, finish_reason=ex.finish_reason, model=model_label)
    chat.messages.append(Message("assistant", ex.text, list(ex.tokens), stats, stopped=ex.finish_reason == "cancelled"))
    chat.auto_title()
    chat.title = f"⇄ {chat.title}" if chat.title != "New chat" else "⇄ API request"
    return chat


class ServeController(QObject):
    """Starts and stops the endpoint on the session's model and files each exchange as a chat."""

    exchanged = Signal(object)  # ServedExchange, emitted on the server's worker thread, handled on the GUI's
    serving_changed = Signal(bool)

    def __init__(self, engine: Any, conversation: Any, port: Callable[[], int], model_label: Callable[[], str],
                 banner: Callable[[str, str], None], parent: QObject | None = None):
        super().__init__(parent)
        self.engine = engine
        self.conversation = conversation
        self.port = port
        self.model_label = model_label
        self.banner = banner
        self.serve: AppServe | None = None
        self.label = QLabel()
        self.label.setToolTip("the OpenAI-compatible endpoint: its base URL and the requests waiting or running")
        self.label.hide()
        self.exchanged.connect(self._file)
        self._timer = QTimer(self, interval=POLL_MS)
        self._timer.timeout.connect(self._show)

    @property
    def serving(self) -> bool:
        return self.serve is not None and self.serve.serving

    def set_serving(self, on: bool) -> bool:
        """Start or stop serving; False (and a banner saying why) when it could not start."""
        if not on:
            self._stop()
            return True
        session = self.engine.session
        if session.model is None:
            self.banner("warning", "Load a model first: the endpoint serves the model this window holds.")
            return False
        from engine.errors import LensError  # noqa: PLC0415
        from engine.serve.runner import model_id_for  # noqa: PLC0415

        self._stop()
        model_id = model_id_for(str(getattr(session.model, "path", "") or self.model_label() or "model"))
        self.serve = AppServe(session, model_id, self.exchanged.emit)
        try:
            url = self.serve.start(HOST, int(self.port()))
        except (LensError, RuntimeError, OSError) as exc:
            self.serve = None
            self.banner("error", f"Could not serve the model: {exc}")
            self.serving_changed.emit(False)
            return False
        self.banner("info", f"Serving {model_id} on {url}: OpenAI clients reach it with base_url={url}; each "
                            "request shows up in the chat list (⇄).")
        self._timer.start()
        self._show()
        self.serving_changed.emit(True)
        return True

    def model_loaded(self) -> None:
        """Another model in the window: serve it instead, on the same port."""
        if self.serving:
            self.set_serving(True)

    def shutdown(self) -> None:
        self._stop()

    def _stop(self) -> None:
        serve, self.serve = self.serve, None
        if serve is not None:
            serve.stop()
            self.serving_changed.emit(False)
        self._timer.stop()
        self.label.hide()

    def _show(self) -> None:
        if self.serve is None or not self.serve.serving:
            self.label.hide()
            return
        self.label.setText(f"serving {self.serve.url} · {self.serve.queue_length} queued")
        self.label.show()

    def _file(self, ex: ServedExchange) -> None:
        """A finished request (GUI thread): saved as a chat, listed first; the chat on screen stays."""
        chat = exchange_chat(ex, self.model_label())
        chat.updated = time.time()
        conv = self.conversation
        conv.chats.insert(0, chat)
        conv.save(chat, now=True)
        conv.chats_changed.emit()
        log.info("served request from %s filed as chat %s", ex.source, chat.id)
