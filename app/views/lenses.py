"""Lens tabs, wired by type: the table of lens classes, the slot each one lives in, and what a lens may ask for.

Every lens class in LENSES says, as class attributes and methods, what it shows and how it asks:

* `title`: the tab it shows in ("Attention", "Positions", "Quantization", "Experts"), in LENSES's order;
* `set_model(ModelRecord)`: every lens draws the loaded model (its other `set_*` methods take the records it shows);
* `connect_requests(requests)`: connects each of its request signals to the LensRequests method that answers it,
  by reference (`self.head_requested.connect(requests.request_head)`), so a misspelt name fails when the window
  is built instead of leaving a lens silently unanswered.

The app's LensBridge implements LensRequests; the views never import it (they only name the protocol).
A lens that fails to build leaves a placeholder with the error in its tab; the window still opens.
"""
from __future__ import annotations

import logging
from typing import Protocol, TypeVar

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QScrollArea, QStackedLayout, QTabWidget, QWidget

from app.views.attention.lens import AttentionLens
from app.views.attribution import WhyLens
from app.views.experts import ExpertsLens
from app.views.positions import PositionsLens
from app.views.quant.lens import QuantLens

log = logging.getLogger(__name__)

LensWidget = AttentionLens | PositionsLens | QuantLens | ExpertsLens | WhyLens
LensClass = type[AttentionLens] | type[PositionsLens] | type[QuantLens] | type[ExpertsLens] | type[WhyLens]
L = TypeVar("L", AttentionLens, PositionsLens, QuantLens, ExpertsLens, WhyLens)

LENSES: tuple[LensClass, ...] = (AttentionLens, PositionsLens, QuantLens, ExpertsLens, WhyLens)  # the tabs, in order


class LensRequests(Protocol):
    """What the lenses may ask for; each method answers one request signal (the LensBridge implements them all)."""

    def request_attention(self, max_rows: int | None) -> None:
        """The layers x heads overview with at most max_rows query rows (None: every row, exact)."""

    def request_head(self, layer: object, head: object, rows: object) -> None:
        """One head (or a 'mean'/'max' aggregate) for a window of query rows."""

    def request_step(self, layer: int, head: int, query: int) -> None:
        """One attention cell, step by step."""

    def request_roles(self, source: str) -> None:
        """Head roles scored on the chat ('chat') or on the induction probe ('probe')."""

    def request_logit(self, position: int, width: int) -> None:
        """The logit lens at a position (-1: the last), `width` tokens per layer."""

    def request_state(self) -> None:
        """A hybrid's recurrent state: what each token wrote and kept per value head, and the state's bytes."""

    def set_hidden_keys(self, keys: object) -> None:
        """The sink keys the overview leaves out changed."""

    def request_routing(self) -> None:
        """The chat's routing (a Mixture-of-Experts model's chosen experts per token and layer)."""

    def request_seq2seq(self) -> None:
        """An encoder-decoder model's three attention kinds over its last input and output."""

    def request_cross_step(self, layer: int, head: int, query: int) -> None:
        """One cross-attention cell of an encoder-decoder model, step by step."""

    def request_tensor(self, name: str) -> None:
        """One tensor up close (its first block decoded)."""

    def request_block(self, name: str, index: int) -> None:
        """Another block of a tensor decoded."""

    def request_attribution(self, token_index: int, contrast: str, method: str) -> None:
        """Why the model wrote token `token_index` of the conversation (-1: the last), rather than `contrast` ('':
        its logit alone); `method` 'ixg' or 'ig' adds the input tokens' attributions ('': none)."""

    def request_ablation(self, what: object) -> None:
        """Switch one part off for real: (token index, contrast, kind, layer, index, its attribution)."""

    def stop_attribution(self) -> None:
        """Stop the Why lens's jobs."""

    def request_attribution_pair(self, what: object) -> None:
        """The same attribution in A and B of the last comparison: (ids, token index, reply start, contrast id)."""


class LensSlot(QWidget):
    """One lens tab: the lens widget in a scroll area, or a placeholder that says why it could not be built."""

    def __init__(self, lens: LensClass, parent: QWidget | None = None):
        super().__init__(parent)
        self.lens_class = lens
        self.title = lens.title
        self.widget: LensWidget | None = None
        self.placeholder: QLabel | None = None
        self.error = ""
        self._stack = QStackedLayout(self)
        try:
            widget = lens()
        except Exception as exc:  # noqa: BLE001 - a broken lens must not break the window
            log.exception("the %s lens could not be built", self.title)
            self.error = f"{type(exc).__name__}: {exc}"
            self.placeholder = QLabel(f"The {self.title} lens could not be built.\n\n{self.error}")
            self.placeholder.setTextFormat(Qt.TextFormat.PlainText)
            self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
            self.placeholder.setWordWrap(True)
            self.placeholder.setStyleSheet("color: #888;")
            self._stack.addWidget(self.placeholder)
            return
        self.widget = widget
        scroll = QScrollArea()  # a lens's minimum width must not widen the whole window
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(widget)
        self._stack.addWidget(scroll)

    def connect_requests(self, requests: LensRequests) -> None:
        """Connect the lens's request signals (nothing to connect while it shows a placeholder)."""
        if self.widget is not None:
            self.widget.connect_requests(requests)


class LensTabs(QTabWidget):
    """The lens pane: a tab per class in LENSES (in order), then the other views added with addTab.

    Scripts (the tour, the screenshot) drive it through `select`, `content` and `lens`.
    """

    def __init__(self, lenses: tuple[LensClass, ...] = LENSES, parent: QWidget | None = None):
        super().__init__(parent)
        self.slots: dict[str, LensSlot] = {}
        for cls in lenses:
            slot = LensSlot(cls)
            self.slots[cls.title] = slot
            self.addTab(slot, cls.title)

    def index_of(self, title: str) -> int:
        """The index of the tab titled `title` (any case), -1 if there is none."""
        return next((i for i in range(self.count()) if self.tabText(i).lower() == title.lower()), -1)

    def select(self, title: str) -> QWidget | None:
        """Bring the tab titled `title` (any case) on screen; returns what it shows (see `content`)."""
        i = self.index_of(title)
        if i >= 0:
            self.setCurrentIndex(i)
        return self.content(title)

    def content(self, title: str) -> QWidget | None:
        """What the tab titled `title` shows: a lens's widget (None if it could not be built), else the tab's view."""
        i = self.index_of(title)
        if i < 0:
            return None
        page = self.widget(i)
        return page.widget if isinstance(page, LensSlot) else page

    def showing(self, title: str) -> bool:
        """Whether the tab titled `title` is the current one."""
        return self.currentIndex() >= 0 and self.currentIndex() == self.index_of(title)

    def lens(self, cls: type[L]) -> L | None:
        """The built lens of class `cls`, None if it is not in the tabs or could not be built."""
        slot = self.slots.get(cls.title)
        widget = slot.widget if slot is not None else None
        return widget if isinstance(widget, cls) else None
