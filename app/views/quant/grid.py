"""The Quantization lens's Layers × tensors table: a column per tensor role, each as wide as the types in it need.

A role's name is written one word per line (`ffn_down_exps` as ffn / down / exps). When the columns do not all fit
the pane whole (1280x800 beside the chat, a Mixture-of-Experts or hybrid file's 12-28 roles), the table does not
scroll sideways or cut names: its columns go on pages by family (attention, recurrent, FFN, experts, norms,
model-wide), as many families a page as fit with every name whole, chosen in a tab bar above the table (`pages`),
and a page hides the rows with no tensor on it. Only a single column wider than the pane cuts its name with … line
by line (whole in the header's tooltip), never its types.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTabBar, QTableWidget, QTableWidgetItem, QWidget

ROLE = Qt.ItemDataRole.UserRole  # a header item's whole role name (its text may be cut)
SMALLER_PT = 1.0  # the table's font is this much smaller than the app's: a 15-role table (Gemma 3) fits 1280x800
FAMILIES = ("attention", "recurrent", "FFN", "experts", "norms", "model-wide", "other")  # the pages' order


def family(role: str, model_wide: bool = False) -> str:
    """The family a tensor role belongs to, for the table's pages."""
    if model_wide:
        return "model-wide"
    if role.endswith("norm") or "_norm_" in role:
        return "norms"
    if role.endswith(("_exps", "_shexp", "_chexp")) or role.startswith("ffn_gate_inp") or "exp_probs" in role:
        return "experts"
    if role.startswith("ssm_"):
        return "recurrent"
    if role.startswith("attn_"):
        return "attention"
    if role.startswith("ffn_"):
        return "FFN"
    return "other"


def fit_widths(cells: list[int], heads: list[int], room: int) -> list[int]:
    """Column widths for `room` pixels: every header whole where they all fit, else each column at least its cells'
    width and the room left shared so that the narrowest headers are whole first (water-filling up to one level)."""
    whole = [max(c, h) for c, h in zip(cells, heads)]
    if sum(whole) <= room:
        return whole
    if sum(cells) >= room:
        return list(cells)
    lo, hi = 0, max(whole)
    while lo < hi:  # the highest level that fits: every column min(whole, max(cells, level)) wide
        mid = (lo + hi + 1) // 2
        if sum(min(w, max(c, mid)) for c, w in zip(cells, whole)) <= room:
            lo = mid
        else:
            hi = mid - 1
    return [min(w, max(c, lo)) for c, w in zip(cells, whole)]


def pack_pages(families: list[str], whole: list[int], room: int) -> list[tuple[str, list[int]]]:
    """Columns on pages of at most `room` pixels of whole columns: families in FAMILIES order, as many a page as fit,
    a family wider than a page split into parts ("experts 1/2"). Returns (label, column indices) per page."""
    groups: list[tuple[str, list[int]]] = []
    for fam in sorted(set(families), key=FAMILIES.index):
        cols = [j for j, f in enumerate(families) if f == fam]
        parts: list[list[int]] = [[]]
        for j in cols:
            if parts[-1] and sum(whole[k] for k in parts[-1]) + whole[j] > room:
                parts.append([])
            parts[-1].append(j)
        groups += [(fam if len(parts) == 1 else f"{fam} {i + 1}/{len(parts)}", p) for i, p in enumerate(parts)]
    pages: list[tuple[str, list[int]]] = []
    for label, cols in groups:
        if pages and sum(whole[k] for k in pages[-1][1] + cols) <= room:
            pages[-1] = (f"{pages[-1][0]} · {label}", pages[-1][1] + cols)
        else:
            pages.append((label, cols))
    return pages


class TypeGrid(QTableWidget):
    """Rows: the model-wide tensors, then blk.0..; a column per role (see the module docstring)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # pages, never sideways
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.verticalHeader().setDefaultSectionSize(20)
        font = self.font()
        if font.pointSizeF() > SMALLER_PT + 5:  # a font set in pixels (pointSizeF -1) stays as it is
            font.setPointSizeF(font.pointSizeF() - SMALLER_PT)
            self.setFont(font)
        self.heads: list[int] = []  # the width each role's name needs, whole
        self.families: list[str] = []  # each column's family (family())
        self.page_cols: list[list[int]] = []  # the columns of each page; one page of all when they fit
        self.pages = QTabBar()  # placed above the table by its lens; shown only when there is more than one page
        self.pages.setExpanding(False)
        self.pages.setDrawBase(False)
        self.pages.hide()
        self.pages.currentChanged.connect(lambda _i: self._show_page())

    def set_roles(self, roles: list[str], model_wide: int = 0) -> None:
        """One column per role, its name a word per line, the whole name in its tooltip; the last `model_wide`
        columns hold the tensors outside the blocks (token_embd, output)."""
        self.setColumnCount(len(roles))
        for j, role in enumerate(roles):
            item = QTableWidgetItem(role.replace("_", "\n"))
            item.setData(ROLE, role)
            item.setToolTip(role)
            self.setHorizontalHeaderItem(j, item)
        header = self.horizontalHeader()
        self.heads = [header.sectionSizeFromContents(j).width() for j in range(len(roles))]
        self.families = [family(r, j >= len(roles) - model_wide) for j, r in enumerate(roles)]
        self.page_cols = []

    def role(self, column: int) -> str:
        """The whole role name of `column` (its header may show it cut)."""
        item = self.horizontalHeaderItem(column)
        return str(item.data(ROLE) or "") if item is not None else ""

    def natural_width(self) -> int:
        """The width every column needs with its header whole."""
        return sum(max(self.sizeHintForColumn(j), h) for j, h in enumerate(self.heads))

    def page_labels(self) -> list[str]:
        return [self.pages.tabText(i) for i in range(self.pages.count())]

    def _paginate(self, room: int) -> None:
        """One page when every column fits whole in `room`, else pages by family (pack_pages); the page shown
        keeps its first family where it can."""
        n = min(self.columnCount(), len(self.heads))
        whole = [max(self.sizeHintForColumn(j), h) for j, h in zip(range(n), self.heads)]
        pages = [("all", list(range(n)))] if sum(whole) <= room else pack_pages(self.families[:n], whole, room)
        cols = [c for _, c in pages]
        if cols == self.page_cols:
            return
        shown = self.page_cols[self.pages.currentIndex()] if 0 <= self.pages.currentIndex() < len(self.page_cols) \
            else []
        keep = next((i for i, c in enumerate(cols) if shown and shown[0] in c), 0)
        self.page_cols = cols
        self.pages.blockSignals(True)
        while self.pages.count():
            self.pages.removeTab(0)
        for label, c in pages:
            i = self.pages.addTab(label)
            self.pages.setTabToolTip(i, ", ".join(self.role(j) for j in c))
        self.pages.setCurrentIndex(keep)
        self.pages.blockSignals(False)
        if self.pages.parentWidget() is not None:  # placed by the lens (alone, it would be a window of its own)
            self.pages.setVisible(len(pages) > 1)

    def _show_page(self, fit: bool = True) -> None:
        """Hide the columns of the other pages, and the rows with no tensor in this one."""
        i = self.pages.currentIndex()
        shown = set(self.page_cols[i]) if 0 <= i < len(self.page_cols) else set(range(self.columnCount()))
        for j in range(self.columnCount()):
            self.setColumnHidden(j, j not in shown)
        for r in range(self.rowCount()):
            self.setRowHidden(r, not any(self.item(r, j) is not None for j in shown))
        if fit:
            self.fit_columns()

    def fit_columns(self) -> None:
        """Pages for the room there is, widths for the page shown (fit_widths), each header's name cut to its column
        (on a page of several families every name is whole)."""
        n = min(self.columnCount(), len(self.heads))
        if n == 0:
            return
        room = self.viewport().width()
        self._paginate(room)
        self._show_page(fit=False)  # also after the cells change: rows with nothing on this page are hidden
        shown = [j for j in range(n) if not self.isColumnHidden(j)]
        cells = [self.sizeHintForColumn(j) for j in shown]
        widths = fit_widths(cells, [self.heads[j] for j in shown], room)
        metrics = self.horizontalHeader().fontMetrics()
        for j, width in zip(shown, widths):
            if self.columnWidth(j) != width:
                self.setColumnWidth(j, width)
            item = self.horizontalHeaderItem(j)
            lines = self.role(j).split("_")
            cut = max(1, width - (self.heads[j] - max(metrics.horizontalAdvance(line) for line in lines)))
            text = "\n".join(lines if width >= self.heads[j] else
                              (metrics.elidedText(line, Qt.TextElideMode.ElideRight, cut) for line in lines))
            if item is not None and item.text() != text:
                item.setText(text)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self.fit_columns()
