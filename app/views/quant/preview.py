"""The override editor's preview: the tensors a plan changes, with their types, sizes and why."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem

from app.views.common.colours import type_colour
from engine.quality.requantize import Plan, TensorPlan

COLUMNS = ("tensor", "now", "after", "bytes now", "bytes after", "why")


class PlanPreview(QTableWidget):
    """One row per tensor the plan changes (or, with show_all, per tensor), sortable."""

    def __init__(self, parent=None):
        super().__init__(0, len(COLUMNS), parent)
        self.setHorizontalHeaderLabels(list(COLUMNS))
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.verticalHeader().setVisible(False)
        self.verticalHeader().setDefaultSectionSize(20)
        header = self.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.plan: Plan | None = None

    def set_plan(self, plan: Plan | None, show_all: bool = False) -> None:
        """Fill the table from a plan (None empties it)."""
        self.plan = plan
        rows: list[TensorPlan] = [] if plan is None else (list(plan.tensors.values()) if show_all else plan.changed)
        self.setSortingEnabled(False)
        self.setRowCount(len(rows))
        for i, tp in enumerate(rows):
            values = (tp.name, tp.old.name, tp.new.name, tp.old_bytes, tp.new_bytes, tp.reason)
            for j, v in enumerate(values):
                item = QTableWidgetItem()
                item.setData(Qt.ItemDataRole.DisplayRole, v)
                if j in (1, 2):
                    item.setBackground(QBrush(QColor(*type_colour(str(v)))))
                    item.setForeground(QBrush(QColor("#000")))
                if j == 2 and tp.fallback:
                    item.setToolTip(tp.reason)
                    item.setText(f"{v} (fallback)")
                self.setItem(i, j, item)
        self.setSortingEnabled(True)

    def names(self) -> list[str]:
        """The tensor names listed, top to bottom."""
        return [self.item(r, 0).text() for r in range(self.rowCount())]
