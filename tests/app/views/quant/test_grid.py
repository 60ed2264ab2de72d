"""The Layers × tensors table fits its pane: every column at least as wide as its types, the room left to the role
names (the narrowest whole first), a name cut with … line by line and whole in its tooltip; it scrolls sideways
only when the types alone are wider than the pane."""
from __future__ import annotations

from PySide6.QtWidgets import QApplication

from app.views.quant.grid import TypeGrid, fit_widths
from app.views.quant.lens import QuantLens
from tests.app.views.quant.test_fit import smollm2_like


def test_fit_widths_gives_the_types_their_room_and_the_names_the_rest() -> None:
    cells, heads = [30, 38, 30], [40, 33, 80]
    assert fit_widths(cells, heads, 200) == [40, 38, 80]  # all whole
    assert fit_widths(cells, heads, 90) == [30, 38, 30]  # the types alone fill it: nothing cut below them
    widths = fit_widths(cells, heads, 130)
    assert sum(widths) <= 130 and widths[0] == 40 and widths[1] == 38 and 30 < widths[2] < 80
    assert fit_widths(cells, heads, 60) == cells  # narrower than the types: they keep their width (it scrolls)


def _grid(qtbot, roles: list[str], width: int) -> TypeGrid:  # noqa: ANN001 - pytest-qt
    from PySide6.QtWidgets import QTableWidgetItem

    grid = TypeGrid()
    qtbot.addWidget(grid)
    grid.setRowCount(3)
    grid.set_roles(roles)
    for j in range(len(roles)):
        for r in range(3):
            grid.setItem(r, j, QTableWidgetItem("Q4_K"))
    grid.resize(width, 200)
    grid.show()
    for _ in range(3):
        QApplication.processEvents()
    grid.fit_columns()
    return grid


def test_a_narrow_pane_cuts_the_role_names_not_the_types(qtbot) -> None:
    roles = ["attn_norm", "ffn_down_exps", "post_attention_norm", "ffn_gate_inp", "token_embd"] * 3
    grid = _grid(qtbot, roles, 15 * 38 + 60)
    assert not grid.horizontalScrollBar().isVisible() and grid.horizontalHeader().length() <= grid.viewport().width()
    cells = [grid.sizeHintForColumn(j) for j in range(len(roles))]
    assert all(grid.columnWidth(j) >= cells[j] for j in range(len(roles)))  # every type whole
    cut = [j for j in range(len(roles)) if "…" in grid.horizontalHeaderItem(j).text()]
    assert cut, "the names do not fit: some must be cut"
    for j in range(len(roles)):
        item = grid.horizontalHeaderItem(j)
        assert grid.role(j) == roles[j] and item.toolTip() == roles[j]
    grid.resize(2000, 200)
    for _ in range(3):
        QApplication.processEvents()
    assert [grid.horizontalHeaderItem(j).text() for j in range(len(roles))] == [r.replace("_", "\n") for r in roles]


def test_more_types_than_fit_scroll_sideways(qtbot) -> None:
    grid = _grid(qtbot, [f"ssm_role_{i}" for i in range(28)], 400)
    assert grid.horizontalScrollBar().isVisible()  # 28 types need more than 400 px: nothing to cut but the types


def test_the_lens_at_1280x800_shows_a_dense_models_table_whole(qtbot) -> None:
    lens = QuantLens()
    qtbot.addWidget(lens)
    lens.resize(569, 700)  # the lens pane at 1280x800 beside the chat: three tabs, the table on the first
    lens.show()
    lens.set_model(smollm2_like())
    for _ in range(4):
        QApplication.processEvents()
    assert lens.narrow_mode and lens.grid.isVisible() and not lens.grid.horizontalScrollBar().isVisible()
    flat = lens.flat
    flat.parentWidget().parentWidget().setCurrentWidget(flat)  # All tensors: the name column takes what is left
    for _ in range(3):
        QApplication.processEvents()
    assert flat.isVisible() and not flat.horizontalScrollBar().isVisible()
    assert flat.item(0, 0).toolTip() == flat.item(0, 0).text()  # a name cut in the middle is whole in its tooltip
