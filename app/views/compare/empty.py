"""Empty states of the Compare view: a page that says what to do, shown until there is something to draw."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QStackedWidget, QWidget

from app.records.model import ModelRecord

EMPTY = {
    "summary": "No comparison yet.\nChoose B above and press Compare.",
    "running": "Comparing A and B…\n{what}",  # every empty page while the first comparison runs
    "layers": "Press Compare to see how far each layer's residual stream moves (and each layer's own share).",
    "heads": "Press Compare to see one attention head of A and B side by side, and their difference.",
    "tokens": "Press Compare to see the text shaded by each token's KLD; click a token for both next-token lists.",
}


def empty_state(widget: QWidget, text: str) -> QStackedWidget:
    """The widget behind a page that says what to do, shown until there is something to draw."""
    label = QLabel(text)
    label.setAlignment(Qt.AlignmentFlag.AlignCenter)
    label.setWordWrap(True)
    label.setStyleSheet("color: #666; background: white; border: 1px solid #ddd;")
    stack = QStackedWidget()
    stack.addWidget(label)
    stack.addWidget(widget)
    return stack


def set_empty_text(stack: QStackedWidget, text: str) -> None:
    """Say something else on a page's empty state (what is running, or what to do)."""
    label = stack.widget(0)
    if isinstance(label, QLabel):
        label.setText(text)


def dominant_type(record: ModelRecord) -> str:
    """The type most of the file's quantized weights have ('Q4_1'), 'mostly Q5_0' when others are mixed in."""
    weights: dict[str, int] = {}
    for t in record.tensors:
        if len(t.shape) >= 2:
            weights[t.type_name] = weights.get(t.type_name, 0) + t.n_elements
    if not weights:
        return "its types"
    top = max(weights, key=lambda k: weights[k])
    return top if len(weights) == 1 or weights[top] > 0.97 * sum(weights.values()) else f"mostly {top}"
