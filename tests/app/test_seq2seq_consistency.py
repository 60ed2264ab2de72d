"""An encoder-decoder model (the random-weight T5 test file) says the same thing everywhere: a saved chat's maps read
back after a restart as they were written; the reply's stats count the encoder's input as its prompt; the Model lens
lists no RoPE; the sampling panel says why the cache holds less than the context limit; the Positions lens fits its
pane (the wheel over its text has no pane to scroll) at 1280x800 and 1366x768; the footer and the shape line name the
layers the grid draws, also where the decoder has more blocks than the encoder."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from app.data.store import Store
from app.main_window import MainWindow
from app.records.model import make_model_record
from app.records.seq2seq import Seq2SeqRecord
from app.views.attention.lens import AttentionLens
from engine.model import load_model
from tests.app.test_end_to_end import wait_idle
from tests.app.windows import LOAD_MS
from tools.make_t5_model import T5_SPECS, T5Spec, write_t5

RUN_MS = 120_000
MESSAGE = "translate English to German: The house is wonderful."


@pytest.fixture(scope="module")
def t5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_t5(tmp_path_factory.mktemp("t5same") / "t5.gguf", "t5")


def _window(qtbot, path: Path, data_dir: Path) -> MainWindow:  # noqa: ANN001 - pytest-qt
    w = MainWindow(model=str(path), store=Store(data_dir))
    qtbot.addWidget(w)
    w.resize(1280, 800)
    w.show()
    qtbot.waitUntil(lambda: w.state.model is not None, timeout=LOAD_MS)
    w.state.settings = dataclasses.replace(w.state.settings, temperature=0.0, max_tokens=6, seed=1)
    return w


def _record(qtbot, w: MainWindow, n_out: int) -> Seq2SeqRecord:  # noqa: ANN001
    view = w.lens_tabs.select("Attention").seq2seq
    qtbot.waitUntil(lambda: view.record is not None and len(view.record.output_texts) == n_out, timeout=RUN_MS)
    return view.record


def _pane_scroll(qtbot, w: MainWindow, title: str) -> int:  # noqa: ANN001
    """How far the lens pane's own scroll area can scroll (0: the lens fits)."""
    w.lens_tabs.select(title)
    slot = w.lens_tabs.slots[title]
    qtbot.wait(50)
    scroll = slot._stack.currentWidget()
    return scroll.verticalScrollBar().maximum()


def test_a_t5_chat_reads_the_same_everywhere_and_after_a_restart(qtbot, t5: Path, data_dir: Path) -> None:
    w = _window(qtbot, t5, data_dir)
    w.conversation.send(MESSAGE)
    wait_idle(qtbot, w)
    reply = w.conversation.current.messages[-1]
    model = load_model(t5)
    try:
        n_in = len(model.tokenizer.encode(MESSAGE, add_special=True, parse_special=False))
    finally:
        model.close()
    assert f"prompt {n_in} tok ({n_in} run" in reply.stats.summary()  # the encoder's input, not the start token
    before = _record(qtbot, w, 1 + len(reply.tokens))
    assert before.output_texts[1:] == tuple(t[1] for t in reply.tokens)
    lens = w.lens_tabs.select("Model")
    qtbot.waitUntil(lambda: lens.info is not None, timeout=RUN_MS)
    assert lens.info.args and not [k for k, _ in lens.info.args if "rope" in k]
    kinds = dict(lens.info.layer_kinds)
    assert "relative position bucket (32 buckets), no RoPE" in kinds["encoder"] and "cross-attention" in kinds["decoder"]
    note = w.sampling.model_ctx.text()
    assert w.sampling.controls["context_limit"].value() == 4096 and "own context is 512 tokens" in note
    for size in ((1280, 800), (1366, 768)):
        w.resize(*size)
        assert _pane_scroll(qtbot, w, "Positions") == 0, size
        assert _pane_scroll(qtbot, w, "Attention") == 0, size
    chat_id = w.conversation.current.id
    w.close()

    again = _window(qtbot, t5, data_dir)  # a restart on the same data folder
    assert again.conversation.current is not None and again.conversation.current.id == chat_id
    after = _record(qtbot, again, len(before.output_texts))
    assert after.input_texts == before.input_texts and after.output_texts == before.output_texts
    for kind in ("encoder", "decoder", "cross"):
        assert np.array_equal(after.maps(kind), before.maps(kind)), kind
    again.close()


def test_the_footer_counts_the_layers_the_grid_draws(qtbot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(T5_SPECS, "t5_deep", T5Spec(n_layers=2, n_dec_layers=3, n_heads=4))
    model = load_model(write_t5(tmp_path / "deep.gguf", "t5_deep"))
    try:
        rec = make_model_record(model)
    finally:
        model.close()
    lens = AttentionLens()
    qtbot.addWidget(lens)
    lens.set_model(rec)
    footer = lens.status.text()
    assert "encoder 2 layers" in footer and "decoder 3 layers" in footer and "4 heads" in footer
    rng = np.random.default_rng(0)
    te, td = 5, 4
    maps = {k: rng.random(s, dtype=np.float32) for k, s in
            (("encoder", (2, 4, te, te)), ("decoder", (3, 4, td, td)), ("cross", (3, 4, td, te)))}
    lens.set_seq2seq(Seq2SeqRecord(tuple("abcde"), tuple("wxyz"), maps["encoder"], maps["decoder"], maps["cross"], 0.0))
    view = lens.seq2seq
    for index, layers, stack in ((2, 3, "decoder"), (0, 2, "encoder"), (1, 3, "decoder")):
        view.kind.setCurrentIndex(index)
        assert view.mosaic.shape == (layers, 4)
        assert f"the grid: {layers} {stack} layers × 4 heads" in view.shape_label.text()
        assert f"{stack} {layers} layers" in footer
