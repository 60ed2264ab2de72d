"""One window, many models: llama, gemma3, a Mixture-of-Experts file and T5 opened one after another in the same
window, each lens checked against the file's own metadata after a reply (read here with engine.gguf, not through
the app's records).

* The Attention lens's pickers and its overview have each model's layers and heads (T5: its Encoder-decoder view
  alone, with the encoder's and decoder's layers); the Experts lens routes the MoE file's experts and says a dense
  model has none; the Positions lens and the Model tab describe the model loaded; the window names its file.
* A reply of another model is read with the loaded model's tokenizer (its text re-tokenized, never its ids), and a
  banner says so.
* A lens record asked of the model before is dropped when it arrives after the switch; opening a model stops the
  jobs that run on the old one; the Experiments fields that name a head, layer, expert or adapter file of the model
  before are emptied.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.jobs.lens import LensResult
from app.main_window import MainWindow
from app.views.attention.lens import AttentionLens
from app.views.experts import DENSE_TEXT, ExpertsLens
from app.views.positions import PositionsLens
from engine.gguf import open_gguf
from tests.app.windows import LOAD_MS, greedy_window
from tests.tiny_models import make_tiny_gemma3, make_tiny_llama
from tools.make_arch_models import write_arch
from tools.make_t5_model import write_t5

REPLY_MS = 120_000


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("switch")
    return {"llama": make_tiny_llama(d / "llama.gguf"), "gemma3": make_tiny_gemma3(d / "gemma3.gguf"),
            "moe": write_arch(d / "moe.gguf", "qwen3moe"), "t5": write_t5(d / "t5.gguf", "t5")}


def _meta(path: Path) -> dict[str, object]:
    f = open_gguf(path)
    try:
        arch = str(f.metadata["general.architecture"])
        get = lambda key, default=0: f.metadata.get(f"{arch}.{key}", default)  # noqa: E731
        return {"arch": arch, "name": str(f.metadata.get("general.name", "")), "layers": int(get("block_count")),
                "heads": int(get("attention.head_count")), "experts": int(get("expert_count")),
                "dec_layers": int(get("decoder_block_count", 0)), "n_vocab": len(f.metadata["tokenizer.ggml.tokens"])}
    finally:
        f.close()


def _open(qtbot, w: MainWindow, path: Path) -> None:
    w.open_model(str(path))
    qtbot.waitUntil(lambda: w.state.model is not None and Path(str(w.state.model.path)) == path
                    and w.state.model_record is not None and w.state.model_record.path == str(path), timeout=LOAD_MS)


def _reply(qtbot, w: MainWindow, text: str) -> None:
    assert w.conversation.send(text)
    qtbot.waitUntil(lambda: not w.conversation.generating, timeout=REPLY_MS)


def _check_decoder_only(qtbot, w: MainWindow, meta: dict[str, object]) -> None:
    lens = w.lens_tabs.select("Attention")
    assert isinstance(lens, AttentionLens)
    n_layers, n_heads = meta["layers"], meta["heads"]
    layers = [lens.layer_box.itemData(i) for i in range(lens.layer_box.count())]
    assert layers == [*range(n_layers), "mean", "max"]
    heads = [lens.head_box.itemData(i) for i in range(lens.head_box.count())]
    assert heads == [*range(n_heads), "mean", "max"]
    assert not lens.views.isTabVisible(lens.views.indexOf(lens.seq2seq))
    cache = w.engine.session.cache  # the overview of the reply (its last token, sampled, may not have run yet)
    qtbot.waitUntil(lambda: w.state.attention_record is not None
                    and w.state.attention_record.n_tokens >= cache.length - 1, timeout=REPLY_MS)
    assert w.state.attention_record.thumbs.shape[:2] == (n_layers, n_heads)
    experts = w.lens_tabs.select("Experts")
    assert isinstance(experts, ExpertsLens)
    if meta["experts"]:
        assert experts.layer_box.count() == n_layers
        qtbot.waitUntil(lambda: experts.record is not None and experts.record.n_tokens >= cache.length - 1,
                        timeout=REPLY_MS)
        assert experts.record.n_expert == meta["experts"]
    else:
        assert experts.layer_box.count() == 0 and experts.empty.text() == DENSE_TEXT and experts.record is None


def _check_t5(qtbot, w: MainWindow, meta: dict[str, object]) -> None:
    lens = w.lens_tabs.select("Attention")
    assert isinstance(lens, AttentionLens)
    shown = [lens.views.tabText(i) for i in range(lens.views.count()) if lens.views.isTabVisible(i)]
    assert shown == ["Encoder-decoder"]
    view = lens.seq2seq
    qtbot.waitUntil(lambda: view.record is not None, timeout=REPLY_MS)
    n_dec = meta["dec_layers"] or meta["layers"]
    assert view.record.encoder.shape[:2] == (meta["layers"], meta["heads"])
    assert view.record.decoder.shape[:2] == (n_dec, meta["heads"])
    experts = w.lens_tabs.select("Experts")
    assert experts.layer_box.count() == 0 and experts.empty.text() == DENSE_TEXT


def test_four_models_in_one_window(qtbot, files: dict[str, Path], data_dir: Path) -> None:
    w = greedy_window(qtbot, files["llama"], data_dir)
    for name in ("llama", "gemma3", "moe", "t5", "llama"):
        path, meta = files[name], _meta(files[name])
        panel = w.experiments_view.interventions
        if w.state.model_record.path != str(path):
            panel.heads.setText("1:0")  # typed for the model before: a head of a model never asked about
            panel.lora.path.setText(str(files["llama"]))
            _open(qtbot, w, path)
            assert panel.heads.text() == "" and panel.lora.path.text() == ""
        assert w.state.model_record.arch == meta["arch"] and path.name in w.windowTitle()
        w.conversation.new_chat()
        _reply(qtbot, w, "The house is wonderful.")
        if meta["arch"] == "t5":
            _check_t5(qtbot, w, meta)
        else:
            _check_decoder_only(qtbot, w, meta)
        positions = w.lens_tabs.select("Positions")
        assert isinstance(positions, PositionsLens)
        summary = positions.summary.text()
        assert ("no RoPE" in summary) == (meta["arch"] == "t5") and meta["name"] in summary
        model_tab = w.lens_tabs.select("Model")
        assert model_tab.info is not None and model_tab.info.path == str(path)
    w.close()


def test_a_reply_of_another_model_is_re_tokenized_and_said(qtbot, files: dict[str, Path], data_dir: Path) -> None:
    w = greedy_window(qtbot, files["llama"], data_dir, max_tokens=6)
    w.lens_tabs.select("Attention")
    _reply(qtbot, w, "hello there")
    assert not any("written by" in t for t in w.chat_view.banner_texts())
    reply = w.conversation.current.messages[-1]
    llama = w.engine.session.model.tokenizer  # the reply as the llama writes " the house" (merged tokens: ids
    llama_ids = llama.encode(" the house", add_special=False, parse_special=False)  # the moe file spells otherwise)
    reply.tokens = [(i, llama.token_text(i), 0.0, ()) for i in llama_ids]
    reply.content = "".join(t[1] for t in reply.tokens)
    _open(qtbot, w, files["moe"])
    assert any("written by tiny-llama" in t and "re-tokenized" in t for t in w.chat_view.banner_texts())
    cache = w.engine.session.cache
    qtbot.waitUntil(lambda: w.state.attention_record is not None and cache.length > 0, timeout=REPLY_MS)
    tok = w.engine.session.model.tokenizer
    held = list(cache.tokens)
    assert "".join(tok.token_text(t) for t in llama_ids) != reply.content  # the llama's ids are not the moe's text
    again = tok.encode(reply.content, add_special=False, parse_special=False)  # the reply's text, re-tokenized
    assert held[-len(again):] == again and held[-len(llama_ids):] != llama_ids
    _open(qtbot, w, files["llama"])
    assert not any("written by" in t for t in w.chat_view.banner_texts())
    w.close()


def test_a_lens_record_of_the_model_before_is_dropped(qtbot, files: dict[str, Path], data_dir: Path) -> None:
    w = greedy_window(qtbot, files["moe"], data_dir)
    w.lens_tabs.select("Experts")
    _reply(qtbot, w, "route me")
    experts = w.lens_tabs.lens(ExpertsLens)
    qtbot.waitUntil(lambda: experts.record is not None, timeout=REPLY_MS)
    routing = experts.record
    asked: list[object] = []
    w.engine.request_lens = lambda kind, compute: asked.append(compute)  # keep the next request, run it by hand
    w.bridge.request_routing()
    tagged = asked[-1]
    del w.engine.request_lens
    _open(qtbot, w, files["llama"])
    session = w.engine.session
    late = tagged(session.model, session.recorder, session.cache, [])  # what a job started before the switch sends
    w.engine.lens_ready.emit(LensResult("routing", late))
    assert experts.record is None and experts.empty.text() == DENSE_TEXT
    assert routing.n_expert == _meta(files["moe"])["experts"]
    w.close()


def test_opening_a_model_stops_the_old_models_jobs(qtbot, files: dict[str, Path], data_dir: Path) -> None:
    w = greedy_window(qtbot, files["llama"], data_dir)
    cancelled: list[str] = []
    w.engine.task_failed.connect(lambda kind, msg: cancelled.append(kind))
    started = np.zeros(1)

    def job(emit, cancel):  # noqa: ANN001, ANN202 - a task that runs until it is cancelled
        started[0] = 1
        while not cancel.wait(0.05):
            yield None
        raise RuntimeError("cancelled")

    w.engine.run_task("compare", "compare", job)
    w.engine.run_task("compare", "heads", job)  # waits behind the running one
    qtbot.waitUntil(lambda: started[0] == 1, timeout=LOAD_MS)
    _open(qtbot, w, files["gemma3"])
    qtbot.waitUntil(lambda: w.engine.task_running("compare") is None, timeout=LOAD_MS)
    assert "heads" in cancelled and "compare" in cancelled
    w.close()
