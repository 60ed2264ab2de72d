"""The Layers × tensors table fits its pane: every column with its name whole and its types' width; where they do
not all fit, the columns go on pages by family, never sideways."""
from __future__ import annotations

from PySide6.QtWidgets import QApplication

from app.views.quant.grid import TypeGrid, family, fit_widths, pack_pages
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


def _whole(grid: TypeGrid) -> bool:
    """Every column on the page shown has its name whole and its types' width, and nothing scrolls sideways."""
    shown = [j for j in range(grid.columnCount()) if not grid.isColumnHidden(j)]
    return (not grid.horizontalScrollBar().isVisible()
            and sum(grid.columnWidth(j) for j in shown) <= grid.viewport().width()
            and all(grid.horizontalHeaderItem(j).text() == grid.role(j).replace("_", "\n") for j in shown)
            and all(grid.columnWidth(j) >= max(grid.sizeHintForColumn(j), grid.heads[j]) for j in shown))


def test_pack_pages_keeps_families_together_and_splits_only_a_family_wider_than_a_page() -> None:
    fams = ["attention", "attention", "recurrent", "experts", "experts", "experts", "norms", "model-wide"]
    whole = [40] * 8
    assert pack_pages(fams, whole, 400) == [("attention · recurrent · experts · norms · model-wide", list(range(8)))]
    assert pack_pages(fams, whole, 120) == [("attention · recurrent", [0, 1, 2]), ("experts", [3, 4, 5]),
                                            ("norms · model-wide", [6, 7])]
    assert pack_pages(fams, whole, 80) == [("attention", [0, 1]), ("recurrent", [2]), ("experts 1/2", [3, 4]),
                                           ("experts 2/2 · norms", [5, 6]), ("model-wide", [7])]
    assert family("attn_norm") == "norms" and family("ffn_gate_inp_shexp") == "experts"
    assert family("ssm_conv1d") == "recurrent" and family("attn_qkv") == "attention" and family("ffn_up") == "FFN"
    assert family("token_embd", model_wide=True) == "model-wide" and family("per_layer_proj") == "other"


def test_a_narrow_pane_pages_the_columns_by_family_every_name_whole(qtbot) -> None:
    roles = ["attn_norm", "ffn_down_exps", "post_attention_norm", "ffn_gate_inp", "attn_q"] * 3
    grid = _grid(qtbot, roles, 15 * 38 + 60)
    labels = grid.page_labels()
    assert len(labels) > 1 and len(grid.page_cols) == len(labels)
    assert sorted(j for cols in grid.page_cols for j in cols) == list(range(len(roles)))  # each column on one page
    for i in range(len(labels)):
        grid.pages.setCurrentIndex(i)
        QApplication.processEvents()
        assert _whole(grid), labels[i]
        assert {grid.role(j) for j in grid.page_cols[i]} <= {r for r in roles}
    grid.resize(2000, 200)
    for _ in range(3):
        QApplication.processEvents()
    assert grid.page_labels() == ["all"] and not any(grid.isColumnHidden(j) for j in range(len(roles)))
    assert _whole(grid)


def test_the_page_shown_keeps_its_family_when_the_pane_changes(qtbot) -> None:
    roles = [f"attn_{i}" for i in range(6)] + [f"ssm_{i}" for i in range(6)] + [f"ffn_{i}_exps" for i in range(6)]
    grid = _grid(qtbot, roles, 6 * 60 + 40)
    ssm = next(i for i, label in enumerate(grid.page_labels()) if label.startswith("recurrent"))
    grid.pages.setCurrentIndex(ssm)
    grid.resize(12 * 60 + 40, 200)  # two families a page now
    for _ in range(3):
        QApplication.processEvents()
    shown = {grid.role(j) for j in range(len(roles)) if not grid.isColumnHidden(j)}
    assert {f"ssm_{i}" for i in range(6)} <= shown and _whole(grid)


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
