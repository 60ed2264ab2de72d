"""Chats as plain data (no Qt): messages, the tokens a reply was made of, and their JSON form."""
from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from app.records.reply import TokenRecord

ROLES = ("system", "user", "assistant")
TITLE_LIMIT = 60
PROMPT_MODES = ("template", "plain")


@dataclass
class ReplyStats:
    """How a reply was made: token counts, speeds, why it ended."""

    tokens: int = 0
    prompt_tokens: int = 0
    prefilled_tokens: int = 0
    prompt_tok_s: float = 0.0
    gen_tok_s: float = 0.0
    ttft_s: float = 0.0  # time to first token: from send to the first token on screen
    total_s: float = 0.0
    finish_reason: str | None = None
    model: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReplyStats:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)

    def summary(self, with_model: bool = False) -> str:
        """One line for under a reply: tokens, speed, time to first token (and the model that wrote it)."""
        parts = [self.model] if self.model and with_model else []
        parts += [f"{self.tokens} tokens", f"{self.gen_tok_s:.1f} tok/s", f"first token {self.ttft_s:.2f} s"]
        if self.prompt_tokens:
            parts.append(f"prompt {self.prompt_tokens} tok ({self.prefilled_tokens} run, {self.prompt_tok_s:.0f} tok/s)")
        if self.finish_reason:
            parts.append(self.finish_reason)
        return " · ".join(parts)


@dataclass
class Message:
    """One turn. Assistant turns keep the tokens they were generated from, with each token's alternatives."""

    role: str
    content: str
    tokens: list[TokenRecord] = field(default_factory=list)
    stats: ReplyStats | None = None
    stopped: bool = False  # the user stopped it: shown with "[stopped]", can be continued
    error: str = ""  # why it ended early (NaN, out of memory, context full)
    in_context: bool = True  # False once the overflow policy dropped it from the model's context
    created: float = field(default_factory=time.time)
    # the other versions of this reply (Regenerate keeps them, as LM Studio's "< 2/3 >"), oldest first; this
    # message is version number `version` (0-based) among versions[:version] + [self] + versions[version:]
    versions: list[Message] = field(default_factory=list)
    version: int = 0

    @property
    def n_versions(self) -> int:
        return len(self.versions) + 1

    def all_versions(self) -> list[Message]:
        """Every version of this turn in order, this one included (each without versions of its own)."""
        v = min(self.version, len(self.versions))
        return [*self.versions[:v], self, *self.versions[v:]]

    def with_version(self, index: int) -> Message:
        """The message to show instead of this one: version `index`, carrying the others."""
        every = self.all_versions()
        index = max(0, min(index, len(every) - 1))
        chosen = every[index]
        others = every[:index] + every[index + 1:]
        for m in every:
            m.versions, m.version = [], 0
        chosen.versions, chosen.version = others, index
        return chosen

    def detach_versions(self) -> list[Message]:
        """Every version of this turn, each with no versions of its own (to hang under a new version)."""
        every = self.all_versions()
        for m in every:
            m.versions, m.version = [], 0
        return every

    def without(self, other: Message) -> Message:
        """This message with `other` dropped from its versions."""
        keep = [m for m in self.versions if m is not other]
        self.version = min(self.version, len(keep)) if len(keep) == len(self.versions) else sum(
            1 for m in self.versions[: self.version] if m is not other)
        self.versions = keep
        return self

    def to_dict(self) -> dict[str, Any]:
        d = self._fields()
        if self.versions:
            d["versions"] = [v._fields() for v in self.versions]
            d["version"] = min(self.version, len(self.versions))
        return d

    def _fields(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "content": self.content,
            "tokens": self.tokens,  # tuples of plain values: json writes them as arrays, no copying here
            "stats": self.stats.to_dict() if self.stats else None,
            "stopped": self.stopped,
            "error": self.error,
            "in_context": self.in_context,
            "created": self.created,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        role = d.get("role")
        if role not in ROLES:
            raise ValueError(f"message role {role!r} is not one of {ROLES}")
        content = d.get("content")
        if not isinstance(content, str):
            raise ValueError("message content is not text")
        tokens = [_token(t) for t in d.get("tokens") or []]
        stats = ReplyStats.from_dict(d["stats"]) if isinstance(d.get("stats"), dict) else None
        msg = cls(role, content, tokens, stats, bool(d.get("stopped")), str(d.get("error") or ""),
                  bool(d.get("in_context", True)), float(d.get("created") or time.time()))
        versions = d.get("versions")
        if isinstance(versions, list) and role == "assistant":  # chats saved before versions have none
            msg.versions = [cls.from_dict({**v, "versions": None}) for v in versions if isinstance(v, dict)]
            version = d.get("version")
            msg.version = max(0, min(int(version) if isinstance(version, int) else len(msg.versions), len(msg.versions)))
        return msg


def _token(t: Any) -> TokenRecord:
    tid, text, logprob, alts = t
    return (int(tid), str(text), float(logprob), tuple((int(a), str(s), float(p)) for a, s, p in alts))


@dataclass
class Chat:
    """A conversation: its system prompt, messages, and the unsent draft."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    title: str = "New chat"
    system_prompt: str = ""
    messages: list[Message] = field(default_factory=list)
    draft: str = ""
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    titled_by_user: bool = False
    prompt_mode: str = ""  # 'template' (the model's chat template), 'plain' (the text alone), '' = as the model suits
    source: str = ""  # where it came from: '' this window, 'API · client · url' a request the endpoint answered

    def touch(self) -> None:
        self.updated = time.time()

    def auto_title(self) -> None:
        """Name the chat after its first user message unless the user named it."""
        if self.titled_by_user:
            return
        first = next((m.content for m in self.messages if m.role == "user" and m.content.strip()), "")
        if first:
            line = " ".join(first.split())
            self.title = line if len(line) <= TITLE_LIMIT else line[: TITLE_LIMIT - 1] + "…"

    def written_by(self) -> list[str]:
        """The names of the models whose replies are on screen (the first part of each reply's signature, 'name ·
        quant · ...'), once each, in order."""
        names: list[str] = []
        for m in self.messages:
            name = m.stats.model.split(" · ")[0] if m.role == "assistant" and m.stats is not None else ""
            if name and name not in names:
                names.append(name)
        return names

    def conversation(self) -> list[dict[str, str]]:
        """The messages the model sees: the system prompt, then every turn still in context."""
        out = [{"role": "system", "content": self.system_prompt}] if self.system_prompt.strip() else []
        out += [{"role": m.role, "content": m.content} for m in self.messages if m.in_context]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "gguf-lens-chat/1",
            "id": self.id,
            "title": self.title,
            "titled_by_user": self.titled_by_user,
            "prompt_mode": self.prompt_mode,
            "source": self.source,
            "system_prompt": self.system_prompt,
            "draft": self.draft,
            "created": self.created,
            "updated": self.updated,
            "messages": [m.to_dict() for m in self.messages],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Chat:
        if not isinstance(d, dict) or d.get("format") != "gguf-lens-chat/1":
            raise ValueError("not a GGUF Lens chat (format gguf-lens-chat/1)")
        cid = str(d.get("id") or "")
        if not cid or not cid.isalnum():
            raise ValueError(f"chat id {cid!r} is not alphanumeric")
        return cls(
            id=cid,
            title=str(d.get("title") or "Untitled"),
            system_prompt=str(d.get("system_prompt") or ""),
            messages=[Message.from_dict(m) for m in d.get("messages") or []],
            draft=str(d.get("draft") or ""),
            created=float(d.get("created") or time.time()),
            updated=float(d.get("updated") or time.time()),
            titled_by_user=bool(d.get("titled_by_user")),
            prompt_mode=d.get("prompt_mode") if d.get("prompt_mode") in PROMPT_MODES else "",
            source=str(d.get("source") or "")[:500],
        )


def branch_chat(chat: Chat, index: int, text: str) -> Chat:
    """A new chat: `chat`'s turns before message `index` (copies), then a user message `text`."""
    new = Chat(title=f"{chat.title} (branch)"[:80], system_prompt=chat.system_prompt,
               titled_by_user=chat.titled_by_user, prompt_mode=chat.prompt_mode)
    new.messages = [dataclasses.replace(m, tokens=list(m.tokens), versions=list(m.versions)) for m in chat.messages[:index]]
    new.messages.append(Message("user", text))
    return new


def to_markdown(chat: Chat) -> str:
    """The chat as a Markdown document (replies verbatim, stats as italics)."""
    out = [f"# {chat.title}", ""]
    if chat.system_prompt.strip():
        out += ["**System prompt**", "", _quote(chat.system_prompt), ""]
    for m in chat.messages:
        out += [f"## {m.role.capitalize()}", "", m.content + (" [stopped]" if m.stopped else ""), ""]
        if m.error:
            out += [f"*Error: {m.error}*", ""]
        if m.stats:
            out += [f"*{m.stats.summary(with_model=True)}*", ""]
    return "\n".join(out).rstrip() + "\n"


def _quote(text: str) -> str:
    return "\n".join("> " + line for line in text.splitlines())
