"""Reply versions (Regenerate keeps them), edit-and-branch, base vs instruct models, the quiet backend note, the
window's panes and layout reset."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.data.chats import Chat, Message, ReplyStats
from app.data.store import Settings, Store
from app.jobs.chat import fit_context, plain_text
from app.jobs.load import Loaded, _quiet_backend_note
from app.main_window import MainWindow
from app.records.model_info import ModelInfo
from app.records.model_kind import BASE_MAX_TOKENS, BASE_NOTE, ModelKind, model_kind
from app.records.reply import GenerationRequest
from app.views.chat.token_popup import TokenPopup
from engine.backend import get_backend
from tests.app.controllers.test_conversation import FakeEngine


@pytest.fixture()
def conv(qtbot, store: Store):
    from app.controllers.conversation import Conversation
    from app.workers.saver import Saver

    saver = Saver()
    c = Conversation(store, FakeEngine(), saver, lambda: Settings(max_tokens=64))
    c.load()
    c.model_ready = True
    c.model_name = "Tiny · Q4_1"
    yield c
    saver.stop()


def test_regenerate_keeps_every_version_and_they_are_saved(conv, store: Store) -> None:
    conv.send("hi")
    conv.engine.stream(1, ["one"])
    conv.regenerate()
    conv.engine.stream(2, ["two"])
    conv.regenerate()
    conv.engine.stream(3, ["three"])
    last = conv.current.messages[-1]
    assert last.content == "three" and [m.content for m in last.all_versions()] == ["one", "two", "three"]
    assert (last.version, last.n_versions) == (2, 3)
    assert conv.engine.requests[-1].messages == (("user", "hi"),)  # the earlier versions are not in the prompt
    conv.select_version(1, 0)
    shown = conv.current.messages[-1]
    assert shown.content == "one" and shown.version == 0 and shown.n_versions == 3
    conv.save_pending()
    conv.saver.stop()
    saved = json.loads((store.chats_dir / f"{conv.current.id}.json").read_text())
    reloaded = Chat.from_dict(saved).messages[-1]
    assert [m.content for m in reloaded.all_versions()] == ["one", "two", "three"] and reloaded.version == 0
    assert reloaded.stats.model == "Tiny · Q4_1"


def test_old_chats_without_versions_still_load() -> None:
    d = Chat(messages=[Message("user", "q"), Message("assistant", "a")]).to_dict()
    assert "versions" not in d["messages"][1]
    d["messages"][1].pop("in_context")
    m = Chat.from_dict(d).messages[1]
    assert m.content == "a" and m.n_versions == 1 and m.versions == []


def test_failed_regeneration_brings_the_last_version_back(conv) -> None:
    conv.send("hi")
    conv.engine.stream(1, ["one"])
    conv.regenerate()
    conv.engine.reply_failed.emit(2, "out of memory")
    conv.engine.reply_ended.emit(2)
    last = conv.current.messages[-1]
    assert last.content == "one" and last.n_versions == 1


def test_version_arrows_in_the_message(qtbot, conv) -> None:
    from app.views.chat.view import ChatView

    conv.send("hi")
    conv.engine.stream(1, ["one"])
    conv.regenerate()
    conv.engine.stream(2, ["two"])
    view = ChatView()
    qtbot.addWidget(view)
    view.show()
    view.version_requested.connect(conv.select_version)
    conv.messages_changed.connect(lambda _cid: view.sync())
    view.show_chat(conv.current)
    reply = view.widgets[-1]
    assert reply.version_label.isVisible() and reply.version_label.text() == "2/2"
    assert reply.prev_version.isEnabled() and not reply.next_version.isEnabled()
    assert reply.model_label.text() == "written by Tiny · Q4_1"
    reply.prev_version.click()
    assert view.widgets[-1].message.content == "one" and view.widgets[-1].version_label.text() == "1/2"


def test_edit_with_later_turns_can_branch(qtbot, conv) -> None:
    from app.views.chat.view import ChatView

    conv.send("first")
    conv.engine.stream(1, ["one"])
    conv.send("second")
    conv.engine.stream(2, ["two"])
    original = conv.current
    view = ChatView()
    qtbot.addWidget(view)
    view.branch_requested.connect(conv.branch)
    view.show_chat(original)
    view.confirm_edit(0, "FIRST")
    assert "3 messages after it" in view.edit_box.informativeText()
    branch = next(b for b in view.edit_box.buttons() if b.text().startswith("Branch"))
    branch.click()
    assert conv.current is not original and [m.content for m in original.messages] == ["first", "one", "second", "two"]
    assert [m.content for m in conv.current.messages] == ["FIRST", ""]
    assert conv.engine.requests[-1].messages == (("user", "FIRST"),)


def test_token_popup_says_which_distribution(qtbot) -> None:
    popup = TokenPopup()
    qtbot.addWidget(popup)
    popup.set_token(0, (5, "a", -0.83, ((5, "a", -0.83), (6, "b", -1.2))))
    assert "model p = 43.6" in popup._title.text()
    assert "temperature 1" in popup.note.text() and "before" in popup.note.text()


def test_base_or_instruct_from_catalog_and_file(gemma3_path: Path, smollm2_path: Path) -> None:
    from engine.catalog import entry_for_file
    from engine.gguf.reader import open_gguf

    for path, base in ((gemma3_path, True), (smollm2_path, False)):
        e = entry_for_file(path)
        g = open_gguf(path)
        try:
            by_catalog = model_kind(str(path), g.metadata, None if e is None else e.instruct)
            by_file = model_kind(str(path), g.metadata)
        finally:
            g.close()
        assert by_catalog.base is base and by_file.base is base
    assert by_catalog.quant == "Q4_1" and "catalog" in by_catalog.why
    assert model_kind("x/gemma-3-270m-it.gguf", {}).base is False
    assert model_kind("x/gemma-3-270m.gguf", {"general.name": "Gemma 3"}).base is True
    assert model_kind("x/a.gguf", {"tokenizer.chat_template": "{{ x }}"}).base is False


def test_plain_prompt_has_no_template() -> None:
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Once"},
            {"role": "assistant", "content": " upon"}, {"role": "user", "content": "Next"}]
    assert plain_text(msgs) == "S\n\nOnce upon\nNext"
    calls = []
    tok = SimpleNamespace(encode=lambda text, add_special, parse_special: calls.append((text, parse_special)) or [1] * 5)
    chat = SimpleNamespace(render=lambda *a, **k: pytest.fail("a plain prompt must not use the chat template"))
    req = GenerationRequest(messages=tuple((m["role"], m["content"]) for m in msgs), plain=True)
    ids, _dropped, _warning = fit_context(SimpleNamespace(tokenizer=tok, chat=chat), req, 100)
    assert len(ids) == 5 and calls == [("S\n\nOnce upon\nNext", False)]


def _loaded(kind: ModelKind, note: str = "") -> Loaded:
    info = ModelInfo(name="Gemma 3 270m", path="/m/x.gguf", file_bytes=1, arch="gemma3", backend="CPU · numba kernels",
                     args=(), n_ctx=2048, metadata=(), template_source="", template_origin="", tokenizer=(),
                     warnings=(), n_tensors=1)
    return Loaded(info, None, "/m/x.gguf", 2048, kind, note)


def test_window_base_model_defaults_and_quiet_backend(qtbot, data_dir: Path) -> None:
    w = MainWindow(load=False)
    qtbot.addWidget(w)
    w.show()
    w._loaded(_loaded(ModelKind(True, "the catalog lists it as a base model", "Q4_K_M"),
                      "CuPy is not installed (ModuleNotFoundError); running on the CPU"))
    assert w.chat_view.kind_label.isVisible() and BASE_NOTE in w.chat_view.kind_label.text()
    assert w.state.settings.max_tokens == BASE_MAX_TOKENS
    assert w.chat_view.prompt_mode.currentData() == "plain" and w.conversation._request(w.conversation.current, None).plain
    assert w.status.backend.text() == "CPU · numba kernels" and "CuPy is not installed" in w.status.backend.toolTip()
    assert not any("CuPy" in t for t in w.chat_view.banner_texts())
    assert w.conversation.model_name == "Gemma 3 270m · Q4_K_M"
    w.chat_view.prompt_mode.setCurrentIndex(0)
    w.chat_view.prompt_mode.activated.emit(0)  # this chat asks for the template after all
    assert w.conversation.current.prompt_mode == "template"
    w._loaded(_loaded(ModelKind(False, "the file has a chat template", "Q4_1")))
    assert not w.chat_view.kind_label.isVisible() and w.state.settings.max_tokens == Settings().max_tokens
    w.close()


def test_auto_backend_without_cupy_is_no_warning() -> None:
    b = get_backend("auto")
    if b.is_device:
        pytest.skip("CuPy and a GPU are here")
    info = SimpleNamespace(warnings=(b.note, "3 tensors not used"))
    info = dataclasses.make_dataclass("I", ["warnings"], frozen=True)(info.warnings)
    kept, note = _quiet_backend_note(info, b)
    if b.quiet:
        assert kept.warnings == ("3 tensors not used",) and note == b.note
    else:  # CuPy installed but no device: a GPU was meant to be used, so it stays a warning
        assert b.note in kept.warnings and note == ""


def test_panes_cannot_vanish_and_layout_resets(qtbot, data_dir: Path) -> None:
    w = MainWindow(load=False)
    qtbot.addWidget(w)
    w.resize(1280, 800)
    w.show()
    w.split.moveSplitter(0, 1)  # drag the handle to the far left
    assert w.chat_view.width() >= w.chat_view.minimumWidth() > 0
    titles = [a.text() for a in w.view_menu.actions() if a.text()]
    for want in ("Chats", "Sampling", "Chat pane", "Lenses pane", "Attention tab", "Positions tab",
                 "Quantization tab", "Compare tab", "Model tab", "Reset layout"):
        assert want in titles
    w.chat_pane_action.setChecked(False)
    w.lenses_pane_action.setChecked(False)  # hiding both leaves the chat back
    assert not w.chat_view.isHidden() or not w.lens_tabs.isHidden()
    w.chat_dock.close()
    w.sampling_dock.setFloating(True)
    w.reset_layout()
    assert w.chat_dock.isVisible() and not w.sampling_dock.isFloating()
    assert w.chat_view.isVisible() and w.lens_tabs.isVisible()
    w.close()


def test_reply_stats_can_name_the_model() -> None:
    s = ReplyStats(tokens=3, model="SmolLM2 · Q4_1")
    assert s.summary(with_model=True).startswith("SmolLM2 · Q4_1 · 3 tokens") and "SmolLM2" not in s.summary()


def test_replies_after_apply_name_the_overrides(qtbot, data_dir: Path) -> None:
    from app.data.overrides import OverrideSpec

    w = MainWindow(load=False)
    qtbot.addWidget(w)
    w._loaded(_loaded(ModelKind(False, "the file has a chat template", "Q4_1")))
    w.quant_bridge.applied.emit(OverrideSpec(None, ("attn_v=Q8_0",)))
    assert w.conversation.model_name == "Gemma 3 270m · Q4_1 + 1 override (attn_v=Q8_0)"
    w.quant_bridge.applied.emit(OverrideSpec("Q2_K", ("attn_v=Q8_0", "ffn_down=Q6_K", "output=Q8_0")))
    assert w.conversation.model_name == "Gemma 3 270m · Q4_1 → Q2_K preset + 3 overrides (attn_v=Q8_0, ffn_down=Q6_K, …)"
    w.quant_bridge.applied.emit(OverrideSpec())
    assert w.conversation.model_name == "Gemma 3 270m · Q4_1"
    w.close()


def test_catalog_says_which_model_is_a_base_model(qtbot) -> None:
    from app.views.catalog import CatalogDialog

    d = CatalogDialog()
    qtbot.addWidget(d)
    texts = {d.list.item(i).data(256): d.list.item(i).text() for i in range(d.list.count())}
    assert "base model: continues text, does not follow instructions" in texts["gemma3-270m"]
    assert "instruct model" in texts["smollm2-135m-instruct"]
