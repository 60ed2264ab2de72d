"""Conversation: the chats and what happens to them (send, stop, regenerate, edit, continue), saved as you go."""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from PySide6.QtCore import QObject, QTimer, Signal

from app.data.chats import Chat, Message, ReplyStats, branch_chat
from app.data.store import Settings, Store
from app.records.reply import GenerationRequest, PrefillProgress, Prepared, ReplyDone, TokenStep
from app.workers.engine import Engine
from app.workers.saver import Saver

log = logging.getLogger(__name__)

STREAM_SAVE_MS = 1500  # a streaming reply is saved at least this often
DRAFT_SAVE_MS = 400


@dataclass
class Reply:
    """A reply in progress: where it goes and what the GUI has measured about it."""

    chat: Chat
    message: Message
    t_send: float
    from_send: bool  # it answers a message just sent (put the text back if it fails before any token)
    first: bool = True
    stopping: bool = False
    ttft_s: float = 0.0
    prompt_tokens: int = 0
    generated: int = 0


def template_vars(s: Any) -> tuple[tuple[str, object], ...]:
    """The reasoning switches the settings move away from what templates assume when they are not passed
    (thinking on, medium effort): only those go to the template, so every other template renders as before.
    A template that does not think unless asked (Gemma 4) gets enable_thinking=True (app.jobs.chat.switch_vars)."""
    out: list[tuple[str, object]] = []
    if not s.enable_thinking:
        out.append(("enable_thinking", False))
    if s.reasoning_effort != "medium":
        out.append(("reasoning_effort", s.reasoning_effort))
    return tuple(out)


class Conversation(QObject):
    """Owns the chats; the chat view and chat list show it, the engine makes the replies."""

    chats_changed = Signal()  # titles, order or membership of the list
    chat_opened = Signal(object)  # the Chat now shown
    messages_changed = Signal(str)  # chat id: messages added, removed or cut
    message_updated = Signal(str, int, bool)  # (chat id, index, repaint at once)
    generating_changed = Signal(bool)
    prefill = Signal(int, int)
    banner = Signal(str, str)  # (kind: info | warning | error, plain text)
    input_consumed = Signal()  # the input box's text was sent
    input_restored = Signal(str)  # a message that could not be answered goes back into the box
    reply_done = Signal(object)  # ReplyDone of the last reply
    live_stats = Signal(float, int)  # while streaming: (tokens per second, tokens in the context)

    def __init__(self, store: Store, engine: Engine, saver: Saver, settings: Callable[[], Settings],
                 parent: QObject | None = None):
        super().__init__(parent)
        self.store = store
        self.engine = engine
        self.saver = saver
        self.settings = settings
        self.chats: list[Chat] = []
        self.current: Chat | None = None
        self.replies: dict[int, Reply] = {}
        self.model_ready = False
        self.model_name = ""  # written into each reply's stats: which model (and quantization) made it
        self.base_model = False  # a base model: chats without a prompt mode of their own get plain text
        self.encoder_decoder = False  # T5: a reply is the decoder's output for one input, never continued
        self._unsaved: set[str] = set()
        self._save_timer = QTimer(self, singleShot=True)
        self._save_timer.timeout.connect(self.save_pending)
        engine.reply_event.connect(self._on_event)
        engine.reply_failed.connect(self._on_failed)
        engine.reply_ended.connect(self._on_ended)

    # -- the list
    def load(self, current_id: str = "") -> None:
        """Read the saved chats (restoring damaged ones) and open the last one used."""
        self.chats = self.store.load_chats()
        for notice in self.store.notices:
            self.banner.emit("warning", notice)
        self.store.notices.clear()
        found = next((c for c in self.chats if c.id == current_id), None)
        if found is None and self.chats:
            found = self.chats[0]
        self.chats_changed.emit()
        if found is None:
            self.new_chat()
        else:
            self.open_chat(found.id)

    def new_chat(self) -> Chat:
        if self.current is not None and not self.current.messages and not self.current.draft and self.current in self.chats:
            return self.current  # reuse an untouched empty chat
        chat = Chat()
        self.chats.insert(0, chat)
        self.chats_changed.emit()
        self.open_chat(chat.id)
        self.save(chat, now=True)
        return chat

    def chat(self, chat_id: str) -> Chat | None:
        return next((c for c in self.chats if c.id == chat_id), None)

    def open_chat(self, chat_id: str) -> None:
        chat = self.chat(chat_id)
        if chat is None or chat is self.current:
            return
        self.current = chat
        self.chat_opened.emit(chat)

    def rename(self, chat_id: str, title: str) -> None:
        chat = self.chat(chat_id)
        title = " ".join(title.split())[:200]
        if chat is not None and title:
            chat.title, chat.titled_by_user = title, True
            self.save(chat, now=True)
        self.chats_changed.emit()  # also puts an emptied title back

    def delete(self, chat_id: str) -> None:
        chat = self.chat(chat_id)
        if chat is None:
            return
        if any(r.chat is chat for r in self.replies.values()):
            self.engine.stop()
        self.chats.remove(chat)
        self._unsaved.discard(chat_id)
        self.saver.submit(chat_id, lambda: self.store.delete_chat(chat_id))  # after any write already queued
        self.chats_changed.emit()
        if chat is self.current:
            self.current = None
            if self.chats:
                self.open_chat(self.chats[0].id)
            else:
                self.new_chat()

    # -- editing
    def set_system_prompt(self, text: str) -> None:
        if self.current is not None and text != self.current.system_prompt:
            self.current.system_prompt = text
            self.save(self.current, delay_ms=DRAFT_SAVE_MS)

    def set_draft(self, text: str) -> None:
        if self.current is not None and text != self.current.draft:
            self.current.draft = text
            self.save(self.current, delay_ms=DRAFT_SAVE_MS)

    # -- replies
    @property
    def generating(self) -> bool:
        return bool(self.replies)

    def _busy(self) -> bool:
        """A reply is running that the user has not stopped."""
        return any(not r.stopping for r in self.replies.values())

    def send(self, text: str) -> bool:
        """Add a user message and start the reply; False (text kept in the box) when that can't happen now."""
        chat = self.current
        if chat is None or not text.strip() or self._busy():
            return False
        if not self.model_ready:
            self.banner.emit("error", "No model is loaded yet: open a .gguf file or pick one from the catalog. "
                                      "Your message is still in the box.")
            return False
        chat.messages.append(Message("user", text))
        chat.draft = ""
        chat.auto_title()
        self.input_consumed.emit()
        self._start(chat, from_send=True)
        self.chats_changed.emit()
        return True

    def stop(self) -> None:
        """Stop the reply within one token (or one prefill chunk); the partial reply is kept as [stopped]."""
        for r in self.replies.values():
            r.stopping = True
        self.engine.stop()

    def regenerate(self) -> None:
        """A new version of the last reply; the earlier ones are kept (select_version shows them)."""
        chat = self.current
        if chat is None or self._busy() or not chat.messages or not self.model_ready:
            return
        earlier = chat.messages.pop().detach_versions() if chat.messages[-1].role == "assistant" else []
        if chat.messages and chat.messages[-1].role == "user":
            self._start(chat, from_send=False, versions=earlier)

    def select_version(self, index: int, version: int) -> None:
        """Show another version of reply `index` (its `< 2/3 >` arrows); the chat continues from the one shown."""
        chat = self.current
        if chat is None or self._busy() or not (0 <= index < len(chat.messages)):
            return
        msg = chat.messages[index]
        if msg.role != "assistant" or not msg.versions or version == msg.version:
            return
        chat.messages[index] = msg.with_version(version)
        self.messages_changed.emit(chat.id)
        self.save(chat, now=True)

    def prompt_mode(self, chat: Chat | None = None) -> str:
        """'plain' or 'template': the chat's own choice, else what suits the model (plain for a base model)."""
        chat = chat or self.current
        return (chat.prompt_mode if chat is not None else "") or ("plain" if self.base_model else "template")

    def set_prompt_mode(self, mode: str) -> None:
        if self.current is not None and mode in ("template", "plain", ""):
            self.current.prompt_mode = mode
            self.save(self.current, now=True)

    def branch(self, index: int, text: str) -> Chat | None:
        """A new chat with the turns before user message `index`, then `text` in its place, and reply there."""
        chat = self.current
        if chat is None or self._busy() or not (0 <= index < len(chat.messages)) or not self.model_ready:
            return None
        if chat.messages[index].role != "user" or not text.strip():
            return None
        new = branch_chat(chat, index, text)
        self.chats.insert(0, new)
        self.chats_changed.emit()
        self.open_chat(new.id)
        self._start(new, from_send=False)
        return new

    def edit_resend(self, index: int, text: str) -> None:
        """Replace user message `index`, forget everything after it, and reply again."""
        chat = self.current
        if chat is None or self._busy() or not (0 <= index < len(chat.messages)) or not self.model_ready:
            return
        if chat.messages[index].role != "user" or not text.strip():
            return
        chat.messages[index].content = text
        del chat.messages[index + 1:]
        chat.auto_title()
        self.chats_changed.emit()
        self._start(chat, from_send=False)

    def continue_reply(self) -> None:
        chat = self.current
        if chat is None or self._busy() or not chat.messages or not self.model_ready:
            return
        last = chat.messages[-1]
        if last.role != "assistant":
            return
        if self.encoder_decoder:
            self.banner.emit("info", "An encoder-decoder model writes its output for one input: Regenerate makes a "
                                     "new one (or raise Max tokens first); it cannot continue a reply.")
            return
        last.stopped = False
        last.error = ""
        self._start(chat, from_send=False, resume=last)

    def shown_request(self, chat: Chat | None = None) -> GenerationRequest | None:
        """The conversation on screen as the model reads it: the reply versions shown, the last reply with its own
        tokens. The lenses read this, not whatever the KV cache ran last. None: no turns yet, or a reply is being
        made (its cache is in use)."""
        chat = chat or self.current
        if chat is None or self.generating:
            return None
        messages = list(chat.messages)
        while messages and messages[-1].role == "assistant" and not messages[-1].content:
            messages.pop()  # an empty reply (it failed before its first token) is not on screen
        if not any(m.role != "system" and m.in_context for m in messages):
            return None
        last = messages[-1]
        view = dataclasses.replace(chat, messages=messages)
        req = self._request(view, last if last.role == "assistant" else None)
        ids = tuple(t[0] for t in last.tokens) if last.role == "assistant" else ()
        spelled = "".join(t[1] for t in last.tokens) if ids else req.continue_text
        return GenerationRequest(messages=req.messages, continue_ids=ids or req.continue_ids,  # the tokens it ran
                                 continue_text=spelled,
                                 max_tokens=req.max_tokens, overflow_policy=req.overflow_policy, plain=req.plain)

    def _request(self, chat: Chat, resume: Message | None) -> GenerationRequest:
        s = self.settings()
        msgs = tuple((m["role"], m["content"]) for m in chat.conversation())
        continue_ids = None
        if resume is not None:
            ids = tuple(t[0] for t in resume.tokens)
            continue_ids = ids if ids and "".join(t[1] for t in resume.tokens) == resume.content else ()
        return GenerationRequest(
            messages=msgs, continue_ids=continue_ids, continue_text=resume.content if continue_ids else None,
            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
            min_p=s.min_p, repeat_penalty=s.repeat_penalty, max_tokens=s.max_tokens,
            seed=None if s.seed < 0 else s.seed, overflow_policy=s.overflow_policy,
            plain=self.prompt_mode(chat) == "plain", template_vars=template_vars(s),
        )

    def _start(self, chat: Chat, from_send: bool, resume: Message | None = None,
               versions: list[Message] | None = None) -> None:
        request = self._request(chat, resume)
        message = resume if resume is not None else Message("assistant", "")
        if versions:
            message.versions, message.version = list(versions), len(versions)
        if resume is None:
            chat.messages.append(message)
        chat.touch()
        rid = self.engine.generate(request)
        self.replies[rid] = Reply(chat, message, time.perf_counter(), from_send)
        self.messages_changed.emit(chat.id)
        self.generating_changed.emit(True)
        self.save(chat, now=True)

    def _index(self, reply: Reply) -> int:
        msgs = reply.chat.messages
        return next((i for i in range(len(msgs) - 1, -1, -1) if msgs[i] is reply.message), -1)

    def _on_event(self, rid: int, item: object) -> None:
        reply = self.replies.get(rid)
        if reply is None:
            return
        if isinstance(item, TokenStep):
            msg = reply.message
            if item.token is not None:
                msg.tokens.append(item.token)
                reply.generated += 1
            msg.content += item.text
            first = reply.first
            if first:
                reply.first = False
                reply.ttft_s = time.perf_counter() - reply.t_send
                self.prefill.emit(0, 0)
            self.message_updated.emit(reply.chat.id, self._index(reply), first)
            self.live_stats.emit(item.gen_tok_s, reply.prompt_tokens + reply.generated)
            self.save(reply.chat, delay_ms=STREAM_SAVE_MS, keep_timer=True)
        elif isinstance(item, PrefillProgress):
            self.prefill.emit(item.done, item.total)
        elif isinstance(item, Prepared):
            self._prepared(reply, item)
        elif isinstance(item, ReplyDone):
            self._done(reply, item)

    def _prepared(self, reply: Reply, item: Prepared) -> None:
        reply.prompt_tokens = item.prompt_tokens
        self.live_stats.emit(0.0, item.prompt_tokens)
        if item.template_warning:
            self.banner.emit("warning", f"Chat template: {item.template_warning}")
        if item.dropped_messages:
            left = 0
            for m in reply.chat.messages:
                if left < item.dropped_messages and m.in_context and m is not reply.message:
                    m.in_context = False
                    left += 1
            self.banner.emit("info", f"The conversation no longer fits the model's context ({item.n_ctx} tokens): "
                                     f"the {item.dropped_messages} oldest messages were left out of it. They stay "
                                     "in the chat, greyed out; the system prompt is kept.")
            self.messages_changed.emit(reply.chat.id)

    def _done(self, reply: Reply, item: ReplyDone) -> None:
        msg = reply.message
        msg.stats = ReplyStats(
            tokens=len(msg.tokens) or item.tokens, prompt_tokens=item.prompt_tokens,
            prefilled_tokens=item.prefilled_tokens, prompt_tok_s=item.prompt_tok_s, gen_tok_s=item.gen_tok_s,
            ttft_s=reply.ttft_s, total_s=item.total_s, finish_reason=item.finish_reason,
            model=self.model_name,
        )
        if item.finish_reason == "cancelled":
            msg.stopped = True
        elif item.finish_reason == "context":
            advice = ("your next message leaves the oldest turns out of the context"
                      if self.settings().overflow_policy == "drop_oldest" else
                      "start a new chat, or set 'Context full' to 'Drop oldest turns' in the sampling panel")
            msg.error = f"The model's context is full ({item.n_ctx} tokens), so the reply ends here: {advice}."
            self.banner.emit("error", msg.error)
        self.reply_done.emit(item)
        self.message_updated.emit(reply.chat.id, self._index(reply), True)

    def _on_failed(self, rid: int, message: str) -> None:
        reply = self.replies.get(rid)
        if reply is None:
            return
        msg = reply.message
        chat = reply.chat
        if not msg.content and not msg.tokens:
            if msg in chat.messages:
                at = chat.messages.index(msg)
                chat.messages.remove(msg)
                if msg.versions:  # a failed regeneration: the last version before it comes back
                    chat.messages.insert(at, msg.with_version(len(msg.versions) - 1).without(msg))
            last = chat.messages[-1] if chat.messages else None
            if reply.from_send and not reply.stopping and last is not None and last.role == "user" and not chat.draft:
                chat.messages.pop()
                chat.draft = last.content
                if chat is self.current:
                    self.input_restored.emit(last.content)
        else:
            msg.error = message
            if reply.stopping:
                msg.stopped = True
        if not reply.stopping:
            if message.startswith("conversation is "):  # ContextFullError
                message += (" (even your last message alone is too long: shorten it)"
                            if self.settings().overflow_policy == "drop_oldest" else
                            " (or set 'Context full' to 'Drop oldest turns' in the sampling panel)")
            self.banner.emit("error", message)
        self.messages_changed.emit(chat.id)

    def _on_ended(self, rid: int) -> None:
        reply = self.replies.pop(rid, None)
        if reply is None:
            return
        if reply.stopping and (reply.message.tokens or reply.message.content):
            reply.message.stopped = True
        reply.chat.touch()
        self.save(reply.chat, now=True)
        self.chats_changed.emit()
        if not self.replies:
            self.generating_changed.emit(False)

    # -- saving
    def save(self, chat: Chat, now: bool = False, delay_ms: int = 0, keep_timer: bool = False) -> None:
        """Save `chat` off the GUI thread, now or after delay_ms (typing and streaming are batched)."""
        if chat not in self.chats:
            return
        self._unsaved.add(chat.id)
        if now:
            self.save_pending()
        elif not (keep_timer and self._save_timer.isActive()):
            self._save_timer.start(delay_ms)

    def save_pending(self) -> None:
        self._save_timer.stop()
        ids, self._unsaved = self._unsaved, set()
        for cid in ids:
            chat = self.chat(cid)
            if chat is not None:
                snap = snapshot(chat)
                self.saver.submit(cid, lambda s=snap: self.store.save_chat(s))


def snapshot(chat: Chat) -> Chat:
    """A copy the saver thread can serialise while the GUI keeps appending tokens to the original."""
    msgs = [dataclasses.replace(m, tokens=list(m.tokens), versions=list(m.versions)) for m in chat.messages]
    return dataclasses.replace(chat, messages=msgs)
