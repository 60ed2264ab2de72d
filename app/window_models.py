"""The window's model half (a mixin of app.main_window.MainWindow): opening a model, what its load changes in the
window (title, signature of replies, base or instruct defaults, banners), and what a failed load says."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from app.data.signature import reply_signature
from app.data.store import Settings
from app.jobs.load import Loaded
from app.views.catalog import CatalogDialog
from app.views.common.dialogs import open_file

TITLE = "GGUF Lens"
BASE_TOKENS_KEY = "base_max_tokens"  # Settings.extra: "1" while max-tokens is the base-model default we set


class ModelSlots:
    """Model loading and its effects on the window; the attributes are MainWindow's."""

    state: Any
    engine: Any
    conversation: Any
    chat_view: Any
    status: Any
    sampling: Any
    bridge: Any
    experiments_bridge: Any
    model_label: str
    _quant_spec: Any
    _intervened: str

    def _title(self, info: Any) -> None:
        """The window names the file it runs (its metadata's name can be any text, the same for many files)."""
        if info is None:
            self.setWindowTitle(TITLE)
            return
        file = Path(str(info.path)).name or str(info.name)
        name = str(info.name)
        same = name.lower().replace(" ", "-") in file.lower() or not name
        short = name if len(name) <= 60 else name[:59] + "…"
        self.setWindowTitle(f"{TITLE} — {file}" + ("" if same else f" ({short})"))

    def _writer_note(self) -> None:
        """A chat whose replies another model wrote is read with the loaded model's tokenizer (app.jobs.chat.own_ids:
        its text re-tokenized, never its ids): a banner says so."""
        chat, info = self.conversation.current, self.state.model
        self.chat_view.clear_banners("writer")
        others = [n for n in chat.written_by() if n != str(info.name)] if chat is not None and info is not None else []
        if others:
            self.chat_view.show_banner("writer", f"This chat was written by {', '.join(others)}. {info.name} reads "
                                       "its text re-tokenized with its own tokenizer: the lenses show its tokens, and "
                                       "replies go on from there.")

    # -- models
    def initial_model(self) -> str:
        """The last model used, else the catalog's default model."""
        from engine.catalog import DEFAULT_MODEL  # noqa: PLC0415

        last = self.state.settings.last_model
        return last or DEFAULT_MODEL

    def open_model(self, source: str) -> None:
        """Load a model on a worker; the current model and every chat stay if it fails."""
        if self.conversation.generating:
            self.conversation.stop()
        self.state.loading = (f"opening {Path(source).name}", 0.0)
        if self.state.model is None:
            self.chat_view.set_placeholder("Loading the model… (you can type already)")
        self.engine.open_model(source)

    def choose_file(self) -> None:
        path = open_file(self, "Open a GGUF model", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.open_model(path)

    def choose_catalog(self) -> None:
        dialog = CatalogDialog(self)
        dialog.chosen.connect(self.open_model)
        dialog.open()

    def _sign(self, spec: Any = None) -> None:
        """The replies' signature: the model, the overrides it holds, the interventions on it."""
        if spec is not None:
            self._quant_spec = spec
        base = reply_signature(self.model_label, self._quant_spec) if self._quant_spec is not None else self.model_label
        self.conversation.model_name = base + (f" · {self._intervened}" if self._intervened else "")

    def _interventions(self, description: str) -> None:
        """What the Experiments tab set on the model: in a banner with one-click Clear, and in the signature."""
        from app.records.interventions import InterventionSpec  # noqa: PLC0415

        self._intervened = description
        self._sign()
        self.chat_view.clear_banners("intervention")
        if description:
            self.chat_view.show_banner("intervention", f"Experiment on: {description}. Replies are made with it.",
                                       action=("Clear", lambda: self.experiments_bridge.apply(InterventionSpec())))

    def _loaded(self, result: Loaded) -> None:
        st = self.state
        st.model = result.info
        st.backend = result.info.backend
        st.model_record = result.record
        self.sampling.set_switches(result.record.reasoning if result.record is not None else ())
        st.attention_record = None
        st.ctx_size, st.ctx_used, st.kv_bytes = result.n_ctx, 0, 0
        self.conversation.model_ready = True
        self.chat_view.set_placeholder("Message the model…")
        kind = result.kind
        self.model_label = f"{result.info.name} · {kind.quant}" if kind.quant else result.info.name
        self._quant_spec, self._intervened = None, ""
        self._sign()
        self._model_kind(kind)
        self.status.set_backend_note(result.backend_note)
        self.chat_view.clear_banners("warning")
        for w in result.info.warnings:
            self.chat_view.show_banner("warning", f"{result.info.name}: {w}")
        st.settings = dataclasses.replace(st.settings, last_model=result.source)
        self._writer_note()
        self.bridge.model_loaded()
        self.serve.model_loaded()  # the endpoint serves the window's model

    def _model_kind(self, kind: Any) -> None:
        """A base model gets a note, plain-text prompts and short replies by default; an instruct model the opposite."""
        from app.records.model_kind import BASE_MAX_TOKENS  # noqa: PLC0415

        self.conversation.base_model = kind.base
        self.conversation.encoder_decoder = getattr(kind, "encoder_decoder", False)
        self.chat_view.show_model_kind(kind.base, kind.why, getattr(kind, "encoder_decoder", False))
        self.chat_view.show_prompt_mode(self.conversation.prompt_mode())
        s, default = self.state.settings, Settings().max_tokens
        auto = s.extra.get(BASE_TOKENS_KEY) == "1"  # the short length was set by us, not by the user
        if kind.base and s.max_tokens == default:
            self.state.settings = dataclasses.replace(s, max_tokens=BASE_MAX_TOKENS, extra={**s.extra, BASE_TOKENS_KEY: "1"})
        elif not kind.base and auto:
            extra = {k: v for k, v in s.extra.items() if k != BASE_TOKENS_KEY}
            self.state.settings = dataclasses.replace(
                s, max_tokens=default if s.max_tokens == BASE_MAX_TOKENS else s.max_tokens, extra=extra)

    def _prompt_mode_chosen(self, mode: str) -> None:
        self.conversation.set_prompt_mode(mode)
        self.chat_view.show_prompt_mode(self.conversation.prompt_mode())

    def _load_failed(self, message: str) -> None:
        self.state.loading = None
        previous = self.state.model
        keep = f"{previous.name} stays loaded; your chats are unchanged." if previous else (
            "Open another .gguf file (File > Open model) or pick one from the catalog.")
        # the reason quotes values from the file: plain text only (informativeText would guess rich text)
        box = QMessageBox(QMessageBox.Icon.Warning, TITLE, f"The model could not be loaded.\n\n{message}\n\n{keep}",
                          parent=self)
        box.setTextFormat(Qt.TextFormat.PlainText)
        box.open()
        self.load_error_box = box
        if previous is None:
            self.chat_view.set_placeholder("No model loaded: open a .gguf file or pick one from the catalog")
