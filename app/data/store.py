"""Chats and settings on disk: atomic writes, a backup of the last good file, damaged files restored with a notice."""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from app.data.chats import Chat, to_markdown
from engine.chat.reasoning import EFFORTS
from engine.fileio import write_bytes_atomic

log = logging.getLogger(__name__)

OVERFLOW_POLICIES = {
    "refuse": "Refuse with a message",
    "drop_oldest": "Drop oldest turns (keep system prompt)",
}
# the sampling panel's ranges: numbers from a hand-edited or damaged settings file are clamped into them
LIMITS: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 5.0), "top_k": (0, 1000), "top_p": (0.01, 1.0), "min_p": (0.0, 1.0),
    "repeat_penalty": (0.5, 3.0), "max_tokens": (1, 32768), "seed": (-1, 2**31 - 1), "context_limit": (256, 131072),
    "serve_port": (1, 65535),
}


SHARED_NOTICE = ("{n} of GGUF Lens has this chat store open too ({root}): both save into it, neither lists the "
                 "other's new chats until it is reopened, and a chat changed in both keeps the later save.")


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a mark of a window that crashed is not a window)."""
    if pid == os.getpid() or os.name != "posix":  # Windows' os.kill(pid, 0) would send Ctrl+C: count the mark
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it runs, as another user; or this system cannot tell: count it
        return True
    return True


def data_dir() -> Path:
    """Where chats and settings live: $GGUF_LENS_DATA_DIR, else the user data folder."""
    env = os.environ.get("GGUF_LENS_DATA_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs  # noqa: PLC0415

    return Path(platformdirs.user_data_dir("gguf-lens"))


@dataclass
class Settings:
    """What the app remembers between runs. Sampling defaults follow llama.cpp."""

    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    max_tokens: int = 512
    seed: int = -1  # -1 = random each reply
    overflow_policy: str = "refuse"
    context_limit: int = 4096  # the KV cache (and recorded queries) never grow past min(this, the model's context)
    enable_thinking: bool = True  # reasoning switches, for templates that read them (engine.chat.reasoning)
    reasoning_effort: str = "medium"
    serve_port: int = 8080  # File > Serve the model: the OpenAI-compatible endpoint's port on 127.0.0.1
    last_model: str = ""
    current_chat: str = ""
    geometry: str = ""
    window_state: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Settings:
        """Known keys with the right type are kept; anything else falls back to the default."""
        s = cls()
        for f in fields(cls):
            if f.name in d and type(d[f.name]) is type(getattr(s, f.name)):
                setattr(s, f.name, d[f.name])
            elif f.name in d and isinstance(getattr(s, f.name), float) and type(d[f.name]) is int:
                setattr(s, f.name, float(d[f.name]))
        if s.overflow_policy not in OVERFLOW_POLICIES:
            s.overflow_policy = "refuse"
        if s.reasoning_effort not in EFFORTS:
            s.reasoning_effort = "medium"
        for name, (lo, hi) in LIMITS.items():
            value = getattr(s, name)
            if value != value:  # NaN (json reads it)
                value = getattr(cls(), name)
            setattr(s, name, type(value)(min(max(value, lo), hi)))
        return s


def write_atomic(path: Path, data: bytes, backup: bool = True) -> None:
    """Write via temp + fsync + rename, first keeping the current file as `<name>.bak` (if backup)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    keep = (lambda: _keep_backup(path) if path.exists() else None) if backup else None
    write_bytes_atomic(path, data, before_replace=keep)


def _keep_backup(path: Path) -> None:
    bak = _bak(path)
    staged = bak.with_name(bak.name + ".tmp")
    staged.unlink(missing_ok=True)
    try:
        os.link(path, staged)  # no window without a backup: link, then rename over the old one
    except OSError:
        shutil.copy2(path, staged)
    os.replace(staged, bak)


def _bak(path: Path) -> Path:
    return path.with_name(path.name + ".bak")


def read_json(path: Path, check: Callable[[Any], Any], what: str) -> tuple[Any | None, str]:
    """Parse `path` with `check`; if it is damaged, restore the backup. Returns (value, notice for the user)."""
    try:
        return check(json.loads(path.read_bytes())), ""
    except FileNotFoundError:
        damage = None
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        damage = exc
    bak = _bak(path)
    try:
        raw = bak.read_bytes()
        value = check(json.loads(raw))
    except FileNotFoundError:
        if damage is None:
            return None, ""
        return None, _set_aside(path, f"{what} could not be read ({_why(damage)}) and has no backup")
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        if damage is None:
            return None, f"{what}: the backup is damaged too ({_why(exc)})"
        return None, _set_aside(path, f"{what} and its backup could not be read ({_why(damage)})")
    if damage is None:
        notice = f"{what} was missing; restored from its backup"
    else:
        notice = _set_aside(path, f"{what} was damaged ({_why(damage)}); restored from the backup")
    try:
        write_atomic(path, raw)
    except OSError as exc:
        notice += f" (could not write the restored copy: {exc.strerror or exc})"
    return value, notice


def _set_aside(path: Path, notice: str) -> str:
    if not path.exists():
        return notice
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        os.replace(path, aside)
    except OSError:
        return notice
    return f"{notice}; the damaged file was kept as {aside.name}"


def _why(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 120 else text[:119] + "…"


class Store:
    """One JSON file per chat under chats/, plus settings.json; every write is atomic with a backup."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else data_dir()
        self.chats_dir = self.root / "chats"
        self.notices: list[str] = []  # what went wrong while reading, for the user
        self.claim: Path | None = None  # this store's mark under open/ while a window reads and writes it

    def open_elsewhere(self) -> int:
        """How many other windows (this process's or another's still running) have this data folder open."""
        n = 0
        for p in (self.root / "open").glob("*.open") if (self.root / "open").is_dir() else ():
            pid = p.name.split("-", 1)[0]
            if p == self.claim or not pid.isdigit():
                continue
            if _alive(int(pid)):
                n += 1
            else:
                p.unlink(missing_ok=True)  # a window that crashed left its mark
        return n

    def take(self) -> None:
        """Mark the data folder as open by this store (a window) until `release`; a notice says when another
        window has it open too, since both then save to one chat store."""
        if self.claim is not None:
            return
        others = self.open_elsewhere()
        self.claim = self.root / "open" / f"{os.getpid()}-{id(self):x}.open"
        try:
            self.claim.parent.mkdir(parents=True, exist_ok=True)
            self.claim.touch()
        except OSError:
            self.claim = None
        if others:
            self.notices.append(SHARED_NOTICE.format(n="Another window" if others == 1 else f"{others} other windows",
                                                     root=self.root))

    def release(self) -> None:
        """The window closes: its mark goes."""
        if self.claim is not None:
            self.claim.unlink(missing_ok=True)
            self.claim = None

    def chat_path(self, chat_id: str) -> Path:
        if not chat_id.isalnum():
            raise ValueError(f"chat id {chat_id!r} is not alphanumeric")
        return self.chats_dir / f"{chat_id}.json"

    def load_chats(self) -> list[Chat]:
        """Every readable chat, newest first; damaged files are restored from backups with a notice. The window
        that reads them holds the folder from now on (`take`)."""
        self.take()
        ids: set[str] = set()
        if self.chats_dir.is_dir():
            for p in self.chats_dir.iterdir():
                stem = p.name.split(".", 1)[0]
                if stem.isalnum() and (p.name.endswith(".json") or p.name.endswith(".json.bak")):
                    ids.add(stem)
        chats = []
        for cid in sorted(ids):
            chat, notice = read_json(self.chat_path(cid), Chat.from_dict, f"Chat file {cid}.json")
            if notice:
                self.notices.append(notice)
            if chat is not None:
                chats.append(chat)
        chats.sort(key=lambda c: c.updated, reverse=True)
        return chats

    def save_chat(self, chat: Chat) -> None:
        """Write one chat now (raises OSError when the disk refuses)."""
        write_atomic(self.chat_path(chat.id), chat_bytes(chat))

    def delete_chat(self, chat_id: str) -> None:
        path = self.chat_path(chat_id)
        for p in (path, _bak(path)):
            p.unlink(missing_ok=True)

    @property
    def settings_path(self) -> Path:
        return self.root / "settings.json"

    def load_settings(self) -> Settings:
        value, notice = read_json(self.settings_path, _settings_dict, "Settings file")
        if notice:
            self.notices.append(notice)
        return Settings.from_dict(value or {})

    def save_settings(self, settings: Settings) -> None:
        write_atomic(self.settings_path, json.dumps(asdict(settings), indent=1).encode())


def _settings_dict(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("settings are not a JSON object")
    return value


def chat_bytes(chat: Chat) -> bytes:
    """A chat as the UTF-8 JSON the store writes (also the JSON export)."""
    return json.dumps(chat.to_dict(), ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")


def export_chat(chat: Chat, path: Path) -> None:
    """Export to Markdown (.md) or JSON (anything else), atomically."""
    path = Path(path)
    if path.suffix.lower() in (".md", ".markdown"):
        data = to_markdown(chat).encode("utf-8", "replace")
    else:
        data = json.dumps(chat.to_dict(), ensure_ascii=False, indent=1).encode("utf-8", "replace")
    write_atomic(path, data, backup=False)
