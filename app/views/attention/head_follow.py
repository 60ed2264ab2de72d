"""The head half of the Attention lens (a mixin of app.views.attention.lens.AttentionLens): one head (or an
aggregate) large for a window of query rows, the rows the pickers and the clicked token ask for, and the context
tinted by the attention of one query row."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.records.attention import HeadRecord
from app.views.attention.controls import describe_selection, part_rows

if TYPE_CHECKING:
    from PySide6.QtCore import SignalInstance

AUTO_ALL_ROWS = 512  # up to this many tokens the head view shows every query row


class HeadFollow:
    """set_head / show_token_attention / request_head and their row arithmetic, on the lens's widgets."""

    head: HeadRecord | None
    attention: Any
    model: Any
    head_requested: SignalInstance
    _pending_index: int | None
    _lens_pick: tuple[object, object] | None
    _part_note: str

    def set_head(self, rec: HeadRecord) -> None:
        """Draw one head's (or an aggregate's) attention for its window of query rows."""
        self.head = rec
        self.head_view.set_record(rec)
        what = describe_selection(rec, self.model)
        rows = f"query rows {rec.row_start}–{rec.row_stop - 1} of {rec.n_tokens}"
        pooled = f", pooled ×{rec.row_step}×{rec.col_step}" if rec.row_step > 1 or rec.col_step > 1 else ""
        note = self._part_note if isinstance(self.rows_box.currentData(), str) else ""
        if rec.recurrent and rec.read_start:  # a long conversation: what came before is one "earlier context" share
            note = (f"{note} · " if note else "") + f"reads decomposed from token {rec.read_start} on"
        self.info.setText(f"{what} · {rows}{pooled} · {rec.elapsed_s * 1000:.1f} ms" + (f" · {note}" if note else ""))
        if self.views.currentWidget() is self.overview:  # the old hover text described another selection
            self.status.setText("Hover a cell for each read's signed weight; click a token to tint the context by what "
                                "it reads." if rec.recurrent else
                                "Hover a cell for its weight; click a token to tint the context by its attention.")
        if len(rec.token_texts) > len(self.steps.texts):  # the head saw newer tokens than the last grid
            self.steps.set_tokens(rec.token_texts)
        if isinstance(rec.layer, int) and isinstance(rec.head, int):
            self.grid.select(rec.layer, rec.head)
            if self._lens_pick != (rec.layer, rec.head) and not rec.recurrent:  # the step-through view follows
                # (an attention head only: a recurrent layer has no softmax cell to step through)
                self._lens_pick = (rec.layer, rec.head)
                self.steps.select(rec.layer, rec.head)
                self._refresh_steps()
        pending, self._pending_index = self._pending_index, None
        index = pending if pending is not None else self.text_view.index
        if index is None or not (rec.row_start <= index < rec.row_stop):
            index = rec.row_stop - 1  # a new window: follow its last query row
        if rec.n_rows:
            self._show_row(index)

    def show_token_attention(self, index: int) -> None:
        """Tint the context by how much token `index` attends to each earlier token (asks for rows if needed)."""
        texts = self.head.token_texts if self.head is not None else ()
        if len(texts) > len(self.steps.texts):  # the step view's query range must reach the clicked token
            self.steps.set_tokens(texts)
        self.steps.select(query=index)
        self._refresh_steps(asked=True)
        if self.views.currentWidget() is self.logit:
            self.logit.show_position(index)
        if self.head is not None and self._covers(self.head, index):
            self._show_row(index)
            return
        self._pending_index = index
        size = self._window_size(index + 1) or 256
        self.head_requested.emit(self._layer(), self._head(), slice(max(0, index - size + 1), index + 1))

    def request_head(self) -> None:
        """Ask for the head view the pickers describe."""
        n = self.attention.n_tokens if self.attention is not None else (self.head.n_tokens if self.head else 0)
        part = self.rows_box.currentData()
        if isinstance(part, str):  # the last reply's reasoning or answer
            self.head_requested.emit(self._layer(), self._head(), self._part_rows(part))
            return
        end = min(self.end_spin.value(), max(0, n - 1)) + 1 if n else None
        size = self._window_size(n)
        rows = None if not size or end is None else slice(max(0, end - size), end)
        self.head_requested.emit(self._layer(), self._head(), rows)

    def _part_rows(self, part: str) -> slice | None:
        rec = self.attention if self.attention is not None else self.head
        rows, self._part_note = part_rows(list(rec.token_texts) if rec is not None else [], part)
        return rows

    def _layer(self) -> object:
        data = self.layer_box.currentData()
        return 0 if data is None else data

    def _head(self) -> object:
        data = self.head_box.currentData()
        return 0 if data is None else data

    def _window_size(self, n: int) -> int:
        """Rows per window for a context of n tokens: 0 means all of them."""
        size = self.rows_box.currentData() or 0
        if isinstance(size, str):  # a reply's part: a token clicked outside it gets the auto window
            size = 0
        if size == 0:  # auto
            return 0 if n <= AUTO_ALL_ROWS else 256
        return 0 if size < 0 else int(size)

    @staticmethod
    def _covers(rec: HeadRecord, index: int) -> bool:
        """Whether the record holds query row `index` exactly (no pooling)."""
        return rec.row_step == 1 and rec.col_step == 1 and rec.row_start <= index < rec.row_stop

    def _show_row(self, index: int) -> None:
        """Tint the text by query `index` from the current record (untinted, with a hint, when it is pooled)."""
        rec = self.head
        if rec is None:
            return
        exact = self._covers(rec, index)
        row = rec.weights[index - rec.row_start] if exact else None
        self.head_view.mark(index, index)
        title = f"Attention of token {index} ({describe_selection(rec, self.model)})"
        if rec.recurrent:
            title = f"What token {index} reads · {describe_selection(rec, self.model)} · shares of |W|"
            r = index - rec.row_start
            if rec.read_start and rec.earlier is not None and exact and 0 <= r < len(rec.earlier):
                title += f"; earlier context (before token {rec.read_start}) {float(rec.earlier[r]):.0%}"
        if not exact:
            title = f"Token {index}: this view is pooled; click a token to see its exact attention"
        hidden = self.hidden_keys if self.sink_check.isChecked() else ()
        self.text_view.show_row(rec.token_texts, index, row, window=rec.window, hidden=hidden, title=title)
