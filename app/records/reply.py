"""What crosses the thread boundary for a reply: the request, then plain frozen records as it is made."""
from __future__ import annotations

from dataclasses import dataclass

# one generated token: (id, text, logprob, ((alt_id, alt_text, alt_logprob), ...) best first)
TokenRecord = tuple[int, str, float, tuple[tuple[int, str, float], ...]]


@dataclass(frozen=True)
class GenerationRequest:
    """A reply to produce: the conversation (system prompt first) and, to continue a reply, its tokens so far."""

    messages: tuple[tuple[str, str], ...]  # (role, content); the last one is the user's turn (or the partial reply)
    continue_ids: tuple[int, ...] | None = None  # continue the final assistant message from these tokens
    continue_text: str | None = None  # what continue_ids spelled with the tokenizer that made them (their texts):
    # ids that spell something else with the loaded model's tokenizer were another model's, so this text is encoded
    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    max_tokens: int = 512
    seed: int | None = None
    overflow_policy: str = "refuse"  # 'refuse' | 'drop_oldest'
    chunk_size: int = 64  # prefill chunk: Stop answers within one chunk
    plain: bool = False  # the text alone, no chat template (a base model continues it)
    template_vars: tuple[tuple[str, object], ...] = ()  # reasoning switches set away from the template's default


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
