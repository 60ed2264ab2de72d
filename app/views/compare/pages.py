"""How the Compare view is laid out: wrapping controls, and one page per answer, so it fits 1280x800 and 1920x1080.

At 1280x800 the Compare pane beside the chat is about 590 px wide: three charts in a row cannot fit there, so
the results are pages of one tab widget (Summary, Tokens, Presets, One head, Logit lens A | B), each with the
whole pane. Inside a page, `AdaptiveSplitter` puts its two parts side by side when the page is wide and one
over the other when it is narrow.
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSplitter, QTabWidget, QVBoxLayout, QWidget

from app.views.attention.controls import FlowLayout

PAGES = (("summary", "Summary", "The summary statistics and how far each layer's residual stream moved"),
         ("tokens", "Tokens", "The text shaded by each token's KLD; click a token for both next-token lists"),
         ("sweep", "Presets", "Every preset's size against its KLD to the file; searched mixes"),
         ("heads", "One head", "One attention head in A and in B side by side, and their difference"),
         ("logit", "Logit lens A | B", "The logit lens of A and of B at the selected token, side by side"))
LOGIT_MIN_HEIGHT = 320  # the logit lens of A and B: every layer's row must stay readable


class AdaptiveSplitter(QSplitter):
    """Two widgets side by side when the splitter is at least `ratio` times as wide as it is tall, else stacked."""

    def __init__(self, first: QWidget, second: QWidget, ratio: float = 1.3, share: float = 0.45,
                 first_max: int = 1 << 20, parent: QWidget | None = None):
        super().__init__(Qt.Orientation.Horizontal, parent)
        self.ratio = ratio
        self.share = share  # the first widget's part of the length, kept when the orientation changes
        self.first_max = first_max  # side by side, the first widget gets at most this many pixels
        self.addWidget(first)
        self.addWidget(second)
        self.setChildrenCollapsible(False)
        self.dragged = False  # the user moved the handle: sizes are theirs until the orientation flips
        self.splitterMoved.connect(lambda _pos, _i: setattr(self, "dragged", True))

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt override
        size = event.size()
        wide = size.width() >= self.ratio * max(1, size.height())
        want = Qt.Orientation.Horizontal if wide else Qt.Orientation.Vertical
        flipped = want != self.orientation()
        if flipped:
            self.setOrientation(want)
            self.dragged = False
        super().resizeEvent(event)
        self._share()

    def event(self, event: QEvent) -> bool:
        """A child's size hint changed (a table filled, an empty state replaced): QSplitter would redistribute."""
        done = super().event(event)
        if event.type() == QEvent.Type.LayoutRequest:
            self._share()
        return done

    def _share(self) -> None:
        if self.dragged or self.width() <= 0 or self.height() <= 0:
            return
        wide = self.orientation() == Qt.Orientation.Horizontal
        length = (self.width() if wide else self.height()) - self.handleWidth()
        first = min(int(self.share * length), self.first_max) if wide else int(self.share * length)
        if abs(self.sizes()[0] - first) > 2:  # only a real change: setting sizes must not start a loop of requests
            self.setSizes([first, length - first])


def controls_bar(groups: list[list[QWidget]]) -> QWidget:
    """A row of control groups that wraps onto a second line when the pane is narrow (a group never splits)."""
    bar = QWidget()
    flow = FlowLayout(bar)
    for group in groups:
        box = QWidget()
        row = QHBoxLayout(box)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(4)
        for w in group:
            row.addWidget(w)
        flow.addWidget(box)
    return bar


def result_pages(parts: dict[str, QWidget]) -> tuple[QTabWidget, dict[str, QWidget]]:
    """The results as pages: `parts` maps each page's key (PAGES) to what it shows."""
    tabs = QTabWidget()
    tabs.setDocumentMode(True)
    tabs.setUsesScrollButtons(False)  # five short titles fit 590 px: never hide one behind an arrow
    pages = {}
    for key, title, tip in PAGES:
        page = parts[key]
        i = tabs.addTab(page, title)
        tabs.setTabToolTip(i, tip)
        pages[key] = page
    parts["logit"].setMinimumHeight(LOGIT_MIN_HEIGHT)
    return tabs, pages


def page_box(*widgets: QWidget, stretch: int = -1) -> QWidget:
    """Widgets one over the other; the one at index `stretch` (the last by default) takes the spare height."""
    box = QWidget()
    lay = QVBoxLayout(box)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.setSpacing(2)
    last = len(widgets) - 1 if stretch < 0 else stretch
    for i, w in enumerate(widgets):
        lay.addWidget(w, 1 if i == last else 0)
    return box


def hint(text: str) -> QLabel:
    """A grey one-line hint above a page."""
    label = QLabel(text)
    label.setStyleSheet("color:#555")
    label.setWordWrap(True)
    return label
