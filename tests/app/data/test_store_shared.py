"""Two windows on one data folder: the second says that it shares the chat store with the first; once the first is
closed, a window opened next says nothing; a mark left by a window that crashed (its process is gone) is not a
window."""
from __future__ import annotations

from pathlib import Path

from app.data.store import Store
from app.main_window import MainWindow

SHARED = "has this chat store open too"


def _window(qtbot, data_dir: Path) -> MainWindow:  # noqa: ANN001 - pytest-qt
    w = MainWindow(store=Store(data_dir), load=False)
    qtbot.addWidget(w)
    return w


def _shared(w: MainWindow) -> bool:
    return any(SHARED in text for text in w.chat_view.banner_texts())


def test_a_second_window_says_it_shares_the_chat_store(qtbot, data_dir: Path) -> None:
    first = _window(qtbot, data_dir)
    second = _window(qtbot, data_dir)
    assert not _shared(first) and _shared(second)
    assert str(data_dir) in next(t for t in second.chat_view.banner_texts() if SHARED in t)
    second.close()
    first.close()
    third = _window(qtbot, data_dir)  # both closed: nobody shares it
    assert not _shared(third)
    third.close()
    assert not list((data_dir / "open").glob("*.open"))


def test_a_crashed_windows_mark_is_not_a_window(data_dir: Path) -> None:
    (data_dir / "open").mkdir(parents=True)
    stale = data_dir / "open" / "2147483646-dead.open"  # no such process
    stale.touch()
    store = Store(data_dir)
    store.load_chats()
    assert not [n for n in store.notices if SHARED in n] and not stale.exists()
    other = Store(data_dir)
    other.load_chats()
    assert [n for n in other.notices if "Another window" in n]
    store.release()
    assert store.claim is None and Store(data_dir).open_elsewhere() == 1  # `other` still holds it
