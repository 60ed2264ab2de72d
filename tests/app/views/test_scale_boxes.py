"""Number boxes keep what is typed: the control vector's strength (a spin box tied to a slider), the LoRA scale and
Compare's adapter scale take "0.5" typed over their value as 0.5, and the slider follows the box."""
from __future__ import annotations

from PySide6.QtCore import Qt

from app.views.compare.view import CompareView
from app.views.interventions import InterventionsPanel


def _type(qtbot, box, text: str) -> None:
    box.setFocus()
    box.selectAll()
    qtbot.keyClicks(box, text)
    qtbot.keyClick(box, Qt.Key.Key_Return)


def test_typed_scales_are_kept(qtbot) -> None:
    panel = InterventionsPanel()
    qtbot.addWidget(panel)
    panel.show()
    for row in (panel.cvec, panel.lora):
        _type(qtbot, row.scale, "0.5")
        assert row.scale.value() == 0.5, row.what
    assert panel.cvec.slider is not None and panel.cvec.slider.value() == 10  # 0.5 in the slider's steps of 0.05
    panel.cvec.slider.setValue(-30)
    assert panel.cvec.scale.value() == -1.5
    _type(qtbot, panel.cvec.scale, "2.35")
    assert panel.cvec.scale.value() == 2.35 and panel.cvec.slider.value() == 47


def test_compare_adapter_scale_keeps_what_is_typed(qtbot) -> None:
    view = CompareView()
    qtbot.addWidget(view)
    view.show()
    _type(qtbot, view.b_scale, "0.5")
    assert view.b_scale.value() == 0.5


def test_apply_keeps_the_focus_off_the_next_field(qtbot) -> None:
    """Apply disables itself while it runs: the focus stays with the panel (not the next field, where typing would
    land) and comes back to Apply when the result is shown."""
    import numpy as np
    from PySide6.QtWidgets import QLineEdit, QVBoxLayout, QWidget

    from app.records.interventions import InterventionRecord

    host = QWidget()
    qtbot.addWidget(host)
    panel = InterventionsPanel()
    after = QLineEdit()  # the field after the panel in the focus chain (the patching panel's in the window)
    lay = QVBoxLayout(host)
    lay.addWidget(panel)
    lay.addWidget(after)
    host.show()
    qtbot.waitExposed(host)
    host.activateWindow()
    panel.set_model(True)
    panel.heads.setText("0:1")
    panel.apply_button.setFocus()
    qtbot.waitUntil(panel.apply_button.hasFocus, timeout=60_000)
    with qtbot.waitSignal(panel.apply_requested, timeout=60_000):
        qtbot.keyClick(panel.apply_button, Qt.Key.Key_Space)
    assert not panel.apply_button.isEnabled() and not after.hasFocus() and panel.hasFocus()
    panel.set_record(InterventionRecord("ablated L0h1", np.zeros(0), (), (), (), 0.1))
    assert panel.apply_button.hasFocus()
