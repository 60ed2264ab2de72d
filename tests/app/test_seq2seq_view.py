"""An encoder-decoder model (the random-weight T5 test file) in the real window: the message is the encoder's input and
the reply the decoder's output; the Attention lens shows only its Encoder-decoder view with the three map kinds (the
same weights engine.observe.t5_maps gives for the input and output), the input tinted by an output token's
cross-attention, a cross-attention cell step by step; the Positions lens shows the learned bias; Continue is refused
with a message."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.model import load_model
from engine.observe.t5_maps import attention_maps
from tests.app.test_end_to_end import open_window, wait_idle
from tools.make_t5_model import write_t5

RUN_MS = 120_000
MESSAGE = "translate English to German: The house is wonderful."


@pytest.fixture(scope="module")
def t5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_t5(tmp_path_factory.mktemp("t5app") / "t5.gguf", "t5")


def test_encoder_decoder_in_the_window(qtbot, t5: Path, data_dir: Path) -> None:
    w = open_window(qtbot, str(t5), max_tokens=12)
    lens = w.lens_tabs.select("Attention")
    assert lens.views.currentWidget() is lens.seq2seq
    shown = [lens.views.tabText(i) for i in range(lens.views.count()) if lens.views.isTabVisible(i)]
    assert shown == ["Encoder-decoder"] and "encoder-decoder model" in w.chat_view.kind_label.text().lower()
    w.conversation.send(MESSAGE)
    wait_idle(qtbot, w)
    view = lens.seq2seq
    reply = [t[0] for t in w.conversation.current.messages[-1].tokens]
    n = 1 + len(reply)  # the start token, then the reply's (a live record of the cache may come first, while it streams)
    qtbot.waitUntil(lambda: view.record is not None and len(view.record.output_texts) == n, timeout=RUN_MS)
    rec = view.record
    model = load_model(t5)
    try:
        enc = model.tokenizer.encode(MESSAGE, add_special=True, parse_special=False)
        assert rec.input_texts == tuple(model.tokenizer.token_text(t) for t in enc)
        dec = [model.net.decoder_start_token, *reply]
        want = attention_maps(model.net, enc, dec)
    finally:
        model.close()
    te, td = len(enc), len(dec)
    assert rec.encoder.shape == (2, 4, te, te) and rec.cross.shape == (2, 4, td, te) and rec.decoder.shape == (2, 4, td, td)
    assert np.array_equal(rec.cross[1], want.cross[1]) and np.array_equal(rec.encoder[0], want.encoder[0])
    assert np.allclose(np.triu(rec.decoder[0, 0], 1), 0) and np.allclose(rec.cross.sum(-1), 1, atol=1e-4)
    assert "(%d × %d)" % (td, te) in view.shape_label.text()  # cross-attention is shown first
    view.kind.setCurrentIndex(0)  # the encoder's: input x input
    assert view.map.w.shape == (te, te) and view.layer.maximum() == 1
    view.mosaic.picked.emit(1, 3)
    assert (view.layer.value(), view.head.value()) == (1, 3)
    view.kind.setCurrentIndex(2)
    view.choose_output(2)
    assert "output token 2" in view.tint.toPlainText() or "Input, tinted by output token 2" in view.tint.toHtml()
    view.step_button.click()
    qtbot.waitUntil(lambda: view.step is not None, timeout=RUN_MS)
    cell = view.step.cell
    assert (cell.layer, cell.head, cell.query) == (1, 3, 2) and cell.keys.shape == (te, 64)
    assert np.array_equal(cell.weights, rec.cross[1, 3, 2]) and f"shape ({te} × 64)" in view.step_text.text()
    positions = w.lens_tabs.select("Positions")
    qtbot.waitUntil(lambda: positions.t5.tables is not None, timeout=RUN_MS)
    assert positions.tabs.currentWidget() is positions.t5 and positions.t5.tables.n_buckets == 32
    assert "no RoPE" in positions.summary.text()
    w.conversation.continue_reply()  # an encoder-decoder's reply is not continued: said, nothing runs
    assert any("cannot continue" in t for t in w.chat_view.banner_texts()) and not w.conversation.generating
    w.close()
