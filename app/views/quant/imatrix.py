"""The importance matrix in the Quantization lens: load or compute one, and a heat strip of a tensor's columns.

ImatrixPanel asks for a file or a calibration text and shows progress with a Cancel button; the bridge runs
the job. ImportanceStrip draws one tensor's per-column importance (mean squared input activation, log scale)
as a one-row heat map, the columns a quantizer with the imatrix protects most in the bright colours.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QGroupBox,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.records.imatrix import ImatrixRecord
from app.views.attention.controls import FlowLayout
from app.views.common.dialogs import open_file

TOP_COLUMNS = 5


class ImatrixPanel(QGroupBox):
    """Load an imatrix file or compute one from a text in the background; overrides then quantize with it."""

    load_requested = Signal(str)  # path of a GGUF or .dat imatrix
    compute_requested = Signal(str, int)  # (calibration text path, tokens per chunk)
    cancel_requested = Signal()
    clear_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Importance matrix (imatrix)", parent)
        self.record: ImatrixRecord | None = None
        self.load_button = QPushButton("Load imatrix…")
        self.load_button.setToolTip("An imatrix file from llama-imatrix or gguf-lens imatrix (GGUF or legacy .dat)")
        self.compute_button = QPushButton("Compute from a text…")
        self.compute_button.setToolTip("Run the model over a calibration text, as llama-imatrix does (in the background)")
        self.chunk = QSpinBox()
        self.chunk.setRange(16, 4096)
        self.chunk.setValue(512)
        self.chunk.setPrefix("chunks of ")
        self.chunk.setSuffix(" tokens")
        self.clear_button = QPushButton("Clear")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.hide()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.hide()
        self.status = QLabel("None: overrides quantize as llama-quantize does without --imatrix.")
        self.status.setTextFormat(Qt.TextFormat.PlainText)
        self.status.setWordWrap(True)
        buttons = QWidget()  # the buttons wrap onto a second line in a narrow pane: the table beside keeps its width
        row = FlowLayout(buttons)
        for w in (self.load_button, self.compute_button, self.chunk, self.clear_button, self.cancel_button):
            row.addWidget(w)
        lay = QVBoxLayout(self)
        lay.addWidget(buttons)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)
        self.load_button.clicked.connect(self._choose_file)
        self.compute_button.clicked.connect(self._choose_text)
        self.cancel_button.clicked.connect(self.cancel_requested)
        self.clear_button.clicked.connect(self.clear_requested)
        self.clear_button.setEnabled(False)

    def _choose_file(self) -> None:
        path = open_file(self, "Load an importance matrix", "imatrix (*.gguf *.dat);;All files (*)")
        if path:
            self.load_requested.emit(path)

    def _choose_text(self) -> None:
        path = open_file(self, "Calibration text", "Text (*.txt);;All files (*)")
        if path:
            self.compute_requested.emit(path, int(self.chunk.value()))

    def set_busy(self, busy: bool, what: str = "", fraction: float = 0.0) -> None:
        """Show progress and Cancel while a load or computation runs."""
        for w in (self.load_button, self.compute_button, self.chunk):
            w.setEnabled(not busy)
        self.clear_button.setEnabled(not busy and self.record is not None)
        self.cancel_button.setVisible(busy)
        self.progress.setVisible(busy)
        if busy:
            self.progress.setValue(int(1000 * max(0.0, min(1.0, fraction))))
            self.progress.setFormat(f"{what} %p%")

    def set_record(self, record: ImatrixRecord | None) -> None:
        """The matrix in use now (None: none)."""
        self.record = record
        self.set_busy(False)
        if record is None:
            self.status.setText("None: overrides quantize as llama-quantize does without --imatrix.")
        else:
            self.status.setText(f"In use: {record.summary()}. Apply and Save quantize with it (llama-quantize --imatrix).")

    def show_message(self, text: str) -> None:
        self.set_busy(False)
        self.status.setText(text)


class ImportanceStrip(QWidget):
    """One tensor's column importance as a heat strip (log10 of the mean x^2), with the top columns named."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.plot = pg.PlotWidget(background="w")
        self.plot.setMaximumHeight(90)
        self.plot.setMinimumHeight(70)
        self.plot.hideAxis("left")
        self.plot.setLabel("bottom", "input column")
        self.plot.setMouseEnabled(x=True, y=False)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.image.setColorMap(pg.colormap.get("viridis"))
        self.plot.addItem(self.image)
        self.caption = QLabel("")
        self.caption.setTextFormat(Qt.TextFormat.PlainText)
        self.caption.setWordWrap(True)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.caption)
        lay.addWidget(self.plot)

    def set_values(self, name: str, values: np.ndarray | None) -> None:
        """Draw `values` (n_cols,) for tensor `name`; None hides the strip."""
        if values is None or values.size == 0:
            self.hide()
            return
        v = np.asarray(values, np.float64)
        logv = np.log10(np.maximum(v, max(float(v[v > 0].min()) if (v > 0).any() else 1e-12, 1e-12)))
        lo, hi = float(logv.min()), float(logv.max())
        self.image.setImage(logv.reshape(1, -1).astype(np.float32), autoLevels=False, levels=(lo, hi if hi > lo else lo + 1))
        self.image.setRect(0, 0, v.size, 1)
        self.plot.setXRange(0, v.size, padding=0)
        self.plot.setYRange(0, 1, padding=0)
        top = np.argsort(-v)[:TOP_COLUMNS]
        ratio = float(v.max() / v.mean()) if v.mean() > 0 else 0.0
        self.caption.setText(
            f"Column importance of {name} (imatrix, log scale {lo:.2f} … {hi:.2f}): the largest is {ratio:.1f}× the mean; "
            f"top columns {', '.join(str(int(c)) for c in top)}")
        self.show()
