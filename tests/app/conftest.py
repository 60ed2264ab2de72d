"""App test set-up: Qt runs offscreen, and chats/settings go to a temporary data folder."""
from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before anything imports Qt

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from app.data.chats import Chat, Message, ReplyStats  # noqa: E402
from app.data.store import Store  # noqa: E402


@pytest.fixture()
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh GGUF_LENS_DATA_DIR for chats and settings."""
    folder = tmp_path / "data"
    monkeypatch.setenv("GGUF_LENS_DATA_DIR", str(folder))
    return folder


@pytest.fixture()
def store(data_dir: Path) -> Store:
    return Store(data_dir)


def sample_tokens(texts: list[str]) -> list[tuple]:
    """Synthetic token records: each token with three alternatives, the chosen one first."""
    out = []
    for i, text in enumerate(texts):
        alts = ((100 + i, text, -0.2), (200 + i, text.upper(), -2.0), (300 + i, "<b>x</b>", -3.5))
        out.append((100 + i, text, -0.2 - 0.3 * (i % 3), alts))
    return out


@pytest.fixture()
def sample_chat() -> Chat:
    """A chat with a system prompt, a question and a Markdown reply made of tokens."""
    pieces = ["Here", " is", " **bold**", " and", " code", ":\n\n", "```python\n", "print(1)\n", "```"]
    reply = Message("assistant", "".join(pieces), sample_tokens(pieces),
                    ReplyStats(tokens=len(pieces), gen_tok_s=42.0, ttft_s=0.12, finish_reason="eos"))
    return Chat(title="Sample", system_prompt="Be brief.",
                messages=[Message("user", "Show me <img src=x> code"), reply])
