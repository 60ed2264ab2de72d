"""Lens tabs: each lens widget is imported when its module is there; until then a placeholder says it is loading."""
from __future__ import annotations

import importlib
import logging
import traceback
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QLabel, QScrollArea, QStackedLayout, QWidget

log = logging.getLogger(__name__)

RETRY_MS = 3000


@dataclass(frozen=True)
class LensSpec:
    """Where a lens widget lives: module, class name candidates, the tab title."""

    title: str
    module: str
    classes: tuple[str, ...]


LENSES = (
    LensSpec("Attention", "app.views.attention.lens", ("AttentionLens", "AttentionView", "AttentionWidget")),
    LensSpec("Positions", "app.views.positions", ("PositionsLens", "PositionsView", "PositionsWidget")),
    LensSpec("Quantization", "app.views.quant.lens", ("QuantLens", "QuantView", "QuantWidget", "QuantizationLens")),
)


class LensSlot(QWidget):
    """Holds one lens: a placeholder until its widget can be built, then the widget itself."""

    ready = Signal(object)  # the lens widget, once built

    def __init__(self, spec: LensSpec, parent: QWidget | None = None):
        super().__init__(parent)
        self.spec = spec
        self.widget: QWidget | None = None
        self._stack = QStackedLayout(self)
        self.placeholder = QLabel(f"The {spec.title} lens is loading…")
        self.placeholder.setTextFormat(Qt.TextFormat.PlainText)
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.placeholder.setWordWrap(True)
        self.placeholder.setStyleSheet("color: #888;")
        self._stack.addWidget(self.placeholder)
        self._timer = QTimer(self, interval=RETRY_MS)
        self._timer.timeout.connect(self.try_build)
        self.try_build()
        if self.widget is None:
            self._timer.start()

    def try_build(self) -> bool:
        """Import the lens module and build its widget; keep the placeholder (with the reason) if that fails."""
        if self.widget is not None:
            return True
        try:
            module = importlib.import_module(self.spec.module)
            cls = next((getattr(module, n) for n in self.spec.classes if hasattr(module, n)), None)
            if cls is None:
                raise ImportError(f"{self.spec.module} has none of {', '.join(self.spec.classes)}")
            widget = cls()
        except ModuleNotFoundError as exc:
            if exc.name != self.spec.module:
                self._failed(exc)
            return False
        except Exception as exc:  # noqa: BLE001 - a broken lens must not break the window
            self._failed(exc)
            return False
        self._timer.stop()
        self.widget = widget
        scroll = QScrollArea()  # a lens's minimum width must not widen the whole window
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(widget)
        self._stack.addWidget(scroll)
        self._stack.setCurrentWidget(scroll)
        self._stack.removeWidget(self.placeholder)
        self.placeholder.deleteLater()
        self.ready.emit(widget)
        return True

    def _failed(self, exc: BaseException) -> None:
        log.debug("lens %s not available:\n%s", self.spec.title, traceback.format_exc())
        self.placeholder.setText(f"The {self.spec.title} lens is loading… ({type(exc).__name__}: {exc})")

    def call(self, method: str, *args: Any) -> bool:
        """Call widget.method(*args) if the widget exists and has it; lens errors are logged, never raised."""
        fn = getattr(self.widget, method, None) if self.widget is not None else None
        if fn is None:
            return False
        try:
            fn(*args)
        except Exception:  # noqa: BLE001
            log.exception("%s.%s failed", self.spec.title, method)
        return True
