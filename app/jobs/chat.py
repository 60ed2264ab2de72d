"""The generate job as a plain generator (no Qt): fit the prompt to the context, stream tokens, report the cache.

app/workers/ runs it on a thread; what it yields are the frozen records of app.records.reply.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Iterator

from app.jobs.session import Emit, Session
from app.records.kv import KVInfo
from app.records.reply import GenerationRequest, PrefillProgress, Prepared, ReplyDone, TokenRecord, TokenStep
from engine.errors import ContextFullError, LensError

if TYPE_CHECKING:
    from engine.model import Model


def generate_job(session: Session, req: GenerationRequest, cancel: threading.Event, emit: Emit) -> Iterator[object]:
    """Build the prompt, stream TokenSteps, finish with ReplyDone; marks the session as generating meanwhile."""
    session.generating.set()
    try:
        result = yield from _generate(session, req, cancel, emit)
    finally:
        session.generating.clear()
    return result


def _generate(session: Session, req: GenerationRequest, cancel: threading.Event, emit: Emit) -> Iterator[object]:
    from engine.generate import GenerationConfig, generate  # noqa: PLC0415
    from engine.sampler import SamplerSettings  # noqa: PLC0415

    t0 = time.perf_counter()
    sampler = SamplerSettings(req.temperature, req.top_k, req.top_p, req.min_p, req.repeat_penalty, 64, req.seed)
    config = GenerationConfig(max_tokens=req.max_tokens, sampler=sampler, top_logprobs=10, chunk_size=req.chunk_size).check()
    with session.lock:
        model = session.model
        if model is None:
            raise LensError("no model is loaded; open a .gguf file or pick one from the catalog")
        if (session.cache is None or session.cache.n_ctx != session.n_ctx()
                or getattr(session.cache, "cache_type", "F32") != session.cache_type):
            session.fresh_cache()
        cache, recorder = session.cache, session.recorder
        ids, dropped, warning = fit_context(model, req, cache.n_ctx)
    yield Prepared(len(ids), cache.n_ctx, dropped, warning)
    tok = model.tokenizer
    paths: list[str] = []  # the attention path each prefill chunk took

    def progress(done: int, total: int) -> None:
        if done:
            paths.append(str(getattr(getattr(model, "net", None), "attention_path", "") or ""))
        emit(PrefillProgress(done, total))

    steps = generate(model, ids, config, cache=cache, recorder=recorder, cancel=cancel, progress=progress)
    last = None
    n = 0
    while True:
        with session.lock:
            step = next(steps, None)
            info = kv_info(cache, paths) if last is None else None  # the prefill has just run
        if step is None:
            break
        if info is not None:
            yield info
        last = step
        rec = None
        if step.token_id >= 0 and step.finish_reason != "eos":
            rec = token_record(tok, step.token_id, step.logprob, step.top)
            n += 1
        if rec is not None or step.text:
            yield TokenStep(rec, step.text, step.index, time.perf_counter() - t0, step.gen_tok_s)
    with session.lock:
        ctx_used, kv_bytes, n_ctx = cache.length, cache.nbytes, cache.n_ctx
    reason = last.finish_reason if last is not None and last.finish_reason else "cancelled"
    session.generating.clear()  # the cache is free now: a lens asked when ReplyDone arrives reads the whole reply
    yield ReplyDone(
        reason, n, last.prompt_tokens if last else len(ids), last.prefilled_tokens if last else 0,
        last.prompt_tok_s if last else 0.0, last.gen_tok_s if last else 0.0,
        time.perf_counter() - t0, ctx_used, n_ctx, kv_bytes,
    )
    return None


def kv_info(cache: Any, paths: list[str]) -> KVInfo:
    """The cache's type and bytes now and at its full context, and the prefill chunks' attention paths."""
    states = int(getattr(cache, "state_bytes", 0) or 0)  # a hybrid's recurrent layers: constant, in nbytes too
    return KVInfo(str(getattr(cache, "cache_type", "F32")), int(cache.nbytes), int(cache.bytes_for(cache.n_ctx)) + states,
                  int(cache.length), int(cache.n_ctx), tuple(p for p in paths if p), states)


def plain_text(messages: list[dict[str, str]]) -> str:
    """The conversation as one text for a base model: the system prompt and a blank line, then the turns, each
    reply continuing the message before it (no separator) and each user message on a new line."""
    parts: list[str] = []
    for m in messages:
        if parts and m["role"] == "user":
            parts.append("\n\n" if len(parts) == 1 and messages[0]["role"] == "system" else "\n")
        parts.append(m["content"])
    return "".join(parts)


def own_ids(tok: Any, ids: tuple[int, ...] | None, text: str | None) -> tuple[int, ...] | None:
    """`ids` if the loaded tokenizer spells `text` with them (None `text`: taken as they are); else () so that the
    message's text is encoded instead: a reply written by another model (another vocabulary) is re-tokenized with
    this one's, never read as this model's ids."""
    if not ids or text is None:
        return ids
    n_vocab = int(tok.n_vocab)
    if all(0 <= int(i) < n_vocab for i in ids) and "".join(tok.token_text(int(i)) for i in ids) == text:
        return ids
    return ()


def _render(model: Model, messages: list[dict[str, str]], continue_ids: tuple[int, ...] | None,
            plain: bool = False, variables: dict[str, object] | None = None,
            continue_text: str | None = None) -> tuple[list[int], str]:
    """Token ids of the rendered conversation; with continue_ids the last (assistant) message is resumed (checked
    against continue_text by `own_ids`: another model's ids are not resumed, the text is encoded). An
    encoder-decoder model (T5) reads one input: the last user message, as its tokenizer encodes it (EOS added);
    engine.generate encodes it and decodes from the start token."""
    tok = model.tokenizer
    continue_ids = own_ids(tok, continue_ids, continue_text)
    if getattr(getattr(model, "net", None), "is_encoder_decoder", False):
        last = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        return tok.encode(last, add_special=True, parse_special=False), ""
    if plain:  # no template: BOS as the model adds it, special-token text in the messages stays text
        if continue_ids:
            ids = tok.encode(plain_text(messages[:-1]), add_special=True, parse_special=False)
            return ids + list(continue_ids), ""
        return tok.encode(plain_text(messages), add_special=True, parse_special=False), ""
    if continue_ids is not None:
        head, last = messages[:-1], messages[-1]
        result = model.chat.render(head, add_generation_prompt=True, **_vars(variables))
        ids = tok.encode(result.text, add_special=True, parse_special=True)
        tail = list(continue_ids) if continue_ids else tok.encode(last["content"], add_special=False, parse_special=False)
        return ids + tail, result.warning or ""
    result = model.chat.render(messages, add_generation_prompt=True, **_vars(variables))
    return tok.encode(result.text, add_special=True, parse_special=True), result.warning or ""


def switch_vars(model: Model, req: GenerationRequest) -> dict[str, object]:
    """The template variables for the request: the reasoning switches the settings moved away from thinking on
    (app.controllers.conversation.template_vars), and enable_thinking=True where the settings say think and the
    model's template does not think unless asked (Gemma 4, DeepSeek-V3.1: engine.chat.reasoning.thinking_default)."""
    from engine.chat.reasoning import thinking_default  # noqa: PLC0415

    variables = dict(req.template_vars)
    if not req.plain and "enable_thinking" not in variables and thinking_default(getattr(model, "chat", None)) is False:
        variables["enable_thinking"] = True
    return variables


def _vars(variables: dict[str, object] | None) -> dict[str, object]:
    """render()'s keyword for template variables, only when there are some (the template's defaults otherwise)."""
    return {"variables": variables} if variables else {}


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
    variables = switch_vars(model, req)
    ids, warning = _render(model, messages, req.continue_ids, req.plain, variables, req.continue_text)
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
        ids, again = _render(model, system + rest, req.continue_ids, req.plain, variables, req.continue_text)
        warning = warning or again  # a note the template gives once (a folded system prompt) is kept
    return ids, dropped, warning


def token_record(tokenizer: Any, token_id: int, logprob: float, top: tuple[tuple[int, float], ...]) -> TokenRecord:
    """A step's token and its alternatives with display texts."""
    alts = tuple((int(i), tokenizer.token_text(int(i)), round(float(lp), 5)) for i, lp in top)
    return (int(token_id), tokenizer.token_text(int(token_id)), round(float(logprob), 5), alts)
