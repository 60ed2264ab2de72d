"""The chat store: atomic writes with backups, damaged files restored with a notice, exports."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.data.chats import Chat, Message
from app.data.store import Settings, Store, export_chat, read_json, write_atomic


def test_roundtrip_keeps_tokens_and_stats(store: Store, sample_chat: Chat) -> None:
    store.save_chat(sample_chat)
    (loaded,) = Store(store.root).load_chats()
    assert json.loads(json.dumps(loaded.to_dict())) == json.loads(json.dumps(sample_chat.to_dict()))
    assert loaded.messages[1].tokens == sample_chat.messages[1].tokens
    assert loaded.messages[1].tokens[2][1] == " **bold**"
    assert loaded.messages[1].stats.gen_tok_s == 42.0
    assert loaded.system_prompt == "Be brief."


def test_write_is_atomic_and_keeps_backup(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    write_atomic(path, b'{"v": 1}')
    write_atomic(path, b'{"v": 2}')
    assert json.loads(path.read_bytes()) == {"v": 2}
    assert json.loads((tmp_path / "a.json.bak").read_bytes()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_failed_write_leaves_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.json"
    write_atomic(path, b'{"v": 1}')

    def boom(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        write_atomic(path, b'{"v": 2}')
    assert json.loads(path.read_bytes()) == {"v": 1}
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_corrupt_chat_restored_from_backup(store: Store, sample_chat: Chat) -> None:
    store.save_chat(sample_chat)
    sample_chat.messages.append(Message("user", "second"))
    store.save_chat(sample_chat)  # the first version is now the .bak
    path = store.chat_path(sample_chat.id)
    path.write_bytes(path.read_bytes()[:57])  # torn write
    fresh = Store(store.root)
    (chat,) = fresh.load_chats()
    assert len(chat.messages) == 2  # the backup's version
    assert fresh.notices and "restored from the backup" in fresh.notices[0]
    assert "damaged" in fresh.notices[0]
    assert any(p.name.startswith(path.name + ".damaged-") for p in path.parent.iterdir())
    assert json.loads(path.read_bytes())["id"] == sample_chat.id  # the restored copy is written back


def test_missing_main_file_uses_backup(store: Store, sample_chat: Chat) -> None:
    store.save_chat(sample_chat)
    store.save_chat(sample_chat)
    store.chat_path(sample_chat.id).unlink()  # killed between the two renames
    fresh = Store(store.root)
    assert [c.id for c in fresh.load_chats()] == [sample_chat.id]


def test_corrupt_without_backup_is_set_aside(store: Store) -> None:
    store.chats_dir.mkdir(parents=True)
    (store.chats_dir / "abc123.json").write_text("{not json")
    fresh = Store(store.root)
    assert fresh.load_chats() == []
    assert "no backup" in fresh.notices[0]
    assert not (store.chats_dir / "abc123.json").exists()


def test_hostile_chat_values_rejected(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"format": "gguf-lens-chat/1", "id": "../../etc", "messages": []}))
    value, notice = read_json(path, Chat.from_dict, "chat")
    assert value is None and "no backup" in notice


def test_settings_roundtrip_and_bad_types(store: Store) -> None:
    s = Settings(temperature=0.3, overflow_policy="drop_oldest", last_model="/x.gguf")
    store.save_settings(s)
    assert Store(store.root).load_settings() == s
    store.settings_path.write_text(json.dumps({"temperature": "hot", "top_k": 7, "overflow_policy": "yolo"}))
    loaded = Store(store.root).load_settings()
    assert loaded.temperature == Settings().temperature and loaded.top_k == 7
    assert loaded.overflow_policy == "refuse"


def test_delete_removes_files(store: Store, sample_chat: Chat) -> None:
    store.save_chat(sample_chat)
    store.save_chat(sample_chat)
    store.delete_chat(sample_chat.id)
    assert Store(store.root).load_chats() == []


def test_export_markdown_and_json(tmp_path: Path, sample_chat: Chat) -> None:
    sample_chat.messages[1].stopped = True
    md = tmp_path / "chat.md"
    export_chat(sample_chat, md)
    text = md.read_text()
    assert text.startswith("# Sample")
    assert "## User" in text and "## Assistant" in text and "> Be brief." in text
    assert "```python\nprint(1)\n```" in text and "[stopped]" in text
    js = tmp_path / "chat.json"
    export_chat(sample_chat, js)
    again = Chat.from_dict(json.loads(js.read_text()))
    assert again.messages[1].tokens == sample_chat.messages[1].tokens
    assert not (tmp_path / "chat.md.bak").exists()


def test_lone_surrogates_saved_as_valid_utf8(store: Store) -> None:
    chat = Chat(messages=[Message("assistant", "bad \udcff byte")])
    store.save_chat(chat)
    raw = store.chat_path(chat.id).read_bytes()
    raw.decode("utf-8")  # strict: valid UTF-8 on disk
    (loaded,) = Store(store.root).load_chats()
    assert loaded.messages[0].content.startswith("bad ")
