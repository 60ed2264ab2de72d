"""What crosses the thread boundary for a reply (plain frozen records) and how a prompt is fitted to the context."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.errors import ContextFullError

if TYPE_CHECKING:
    from engine.model import Model

from app.chats import TokenRecord


@dataclass(frozen=True)
class GenerationRequest:
    """A reply to produce: the conversation (system prompt first) and, to continue a reply, its tokens so far."""

    messages: tuple[tuple[str, str], ...]  # (role, content); the last one is the user's turn (or the partial reply)
    continue_ids: tuple[int, ...] | None = None  # continue the final assistant message from these tokens
    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    max_tokens: int = 512
    seed: int | None = None
    overflow_policy: str = "refuse"  # 'refuse' | 'drop_oldest'
    chunk_size: int = 64  # prefill chunk: Stop answers within one chunk


@dataclass(frozen=True)
class Prepared:
    """The prompt is built: how long it is, what the overflow policy dropped, any template warning."""

    prompt_tokens: int
    n_ctx: int
    dropped_messages: int  # leading non-system messages left out of the model's context
    template_warning: str


@dataclass(frozen=True)
class PrefillProgress:
    done: int
    total: int


@dataclass(frozen=True)
class TokenStep:
    """One generated token with its alternatives (texts resolved on the worker)."""

    token: TokenRecord | None  # None for a closing record (cancelled with nothing new)
    text: str  # what this step adds to the reply
    index: int
    elapsed_s: float  # since the request started
    gen_tok_s: float


@dataclass(frozen=True)
class ReplyDone:
    """Why and how the reply ended, and where the context stands now."""

    finish_reason: str  # 'eos' | 'stop' | 'length' | 'context' | 'cancelled'
    tokens: int
    prompt_tokens: int
    prefilled_tokens: int
    prompt_tok_s: float
    gen_tok_s: float
    total_s: float
    ctx_used: int
    n_ctx: int
    kv_bytes: int


def _render(model: Model, messages: list[dict[str, str]], continue_ids: tuple[int, ...] | None) -> tuple[list[int], str]:
    """Token ids of the rendered conversation; with continue_ids the last (assistant) message is resumed."""
    tok = model.tokenizer
    if continue_ids is not None:
        head, last = messages[:-1], messages[-1]
        result = model.chat.render(head, add_generation_prompt=True)
        ids = tok.encode(result.text, add_special=True, parse_special=True)
        tail = list(continue_ids) if continue_ids else tok.encode(last["content"], add_special=False, parse_special=False)
        return ids + tail, result.warning or ""
    result = model.chat.render(messages, add_generation_prompt=True)
    return tok.encode(result.text, add_special=True, parse_special=True), result.warning or ""


def _turn_starts(messages: list[dict[str, str]]) -> list[int]:
    """Indices where a droppable turn begins: each user message after the system prompt."""
    return [i for i, m in enumerate(messages) if m["role"] == "user"]


def fit_context(
    model: Model, req: GenerationRequest, n_ctx: int
) -> tuple[list[int], int, str]:
    """Prompt ids that fit n_ctx by the request's policy; returns (ids, messages dropped, template warning).

    'refuse' raises ContextFullError when the prompt leaves no room for a token. 'drop_oldest' drops whole
    turns from the front (never the system prompt, never the last turn) until the prompt leaves room for
    min(max_tokens, n_ctx // 4) tokens, and raises ContextFullError if even the last turn alone is too long.
    """
    messages = [{"role": r, "content": c} for r, c in req.messages]
    ids, warning = _render(model, messages, req.continue_ids)
    if req.overflow_policy != "drop_oldest":
        if len(ids) + 1 > n_ctx:
            raise ContextFullError(len(ids), n_ctx)
        return ids, 0, warning
    reserve = max(1, min(req.max_tokens, n_ctx // 4))
    system = [m for m in messages[:1] if m["role"] == "system"]
    rest = messages[len(system):]
    dropped = 0
    while len(ids) + reserve > n_ctx:
        starts = [i for i in _turn_starts(rest) if i > 0]
        if not starts:
            raise ContextFullError(len(ids), n_ctx)
        cut = starts[0]
        rest = rest[cut:]
        dropped += cut
        ids, warning = _render(model, system + rest, req.continue_ids)
    return ids, dropped, warning


def token_record(tokenizer: Any, token_id: int, logprob: float, top: tuple[tuple[int, float], ...]) -> TokenRecord:
    """A step's token and its alternatives with display texts."""
    alts = tuple((int(i), tokenizer.token_text(int(i)), round(float(lp), 5)) for i, lp in top)
    return (int(token_id), tokenizer.token_text(int(token_id)), round(float(logprob), 5), alts)
