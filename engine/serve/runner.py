"""One model, one worker thread, requests in the order they came: the server's generation queue.

The routes hand the Runner a Job (a checked request and its prompt ids) and a function to send events back on;
the worker runs jobs one at a time, each from an empty KV cache, exactly as `gguf-lens generate` runs a prompt,
so a reply never depends on the requests before it and greedy output equals the CLI's token for token.
Events go back as plain frozen records: a Piece per generated token (a streamed request; a plain one gets its
pieces with Finished, which spares the event loop a wake-up per token), then Finished, or an ApiError.

A client that goes away cancels its job: a waiting job leaves the queue, a running one stops at the next token
(engine.generate checks the job's threading.Event after each token and between prefill chunks).

The two seams a front end (the desktop app) plugs into: `generate` is the function that turns prompt ids into
Steps (the app can route it through its own worker and recorder), and `on_exchange(source, messages, reply)` is
called after every request with what was asked and what came back.
"""
from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from engine.errors import ContextFullError, LensError, SettingError
from engine.generate import GenerationConfig, Step, generate
from engine.serve.protocol import ApiError, GenRequest, bad

if TYPE_CHECKING:
    from engine.model import Model

log = logging.getLogger(__name__)

GenerateFn = Callable[["Model", Sequence[int], GenerationConfig, threading.Event], Iterator[Step]]
Emit = Callable[[object], None]  # takes a Piece, Finished or ApiError; called from the worker thread
_POLL_S = 0.25  # the idle worker looks at the stop flag this often (close() may run in a signal handler)


@dataclass(frozen=True)
class Prompt:
    """What a request runs: token ids, and the text they came from (the rendered chat, or the completion prompt)."""

    ids: tuple[int, ...]
    text: str
    warning: str | None = None  # the chat template fell back, or folded the system prompt


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token with its log-probability and the most likely alternatives, as OpenAI reports them."""

    token: str
    logprob: float
    bytes: tuple[int, ...]
    top: tuple[tuple[str, float, tuple[int, ...]], ...]  # (token, logprob, bytes), most likely first


@dataclass(frozen=True)
class Piece:
    """Text a step added, and the token it generated when the request asked for log-probabilities."""

    text: str
    logprob: TokenLogprob | None = None


@dataclass(frozen=True)
class Finished:
    """The end of a job: OpenAI's finish_reason ('stop' | 'length', or 'cancelled') and the usage counts."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    gen_tok_s: float = 0.0
    pieces: tuple[Piece, ...] = ()  # the whole reply, for a request that does not stream


@dataclass(frozen=True)
class Reply:
    """What a request got back, for on_exchange."""

    text: str
    token_ids: tuple[int, ...]
    prompt: Prompt
    finish_reason: str


ExchangeHook = Callable[[str, "tuple[dict[str, Any], ...]", Reply], None]  # (source, messages, reply)
_FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "cancelled": "cancelled"}
_ids = itertools.count(1)


@dataclass(eq=False)
class Job:
    """One request on its way through the queue."""

    request: GenRequest
    prompt: Prompt
    emit: Emit
    source: str = ""  # who asked (the client's address)
    id: int = field(default_factory=lambda: next(_ids))
    cancel: threading.Event = field(default_factory=threading.Event)


def generate_fresh(model: Model, ids: Sequence[int], config: GenerationConfig,
                   cancel: threading.Event) -> Iterator[Step]:
    """engine.generate.generate from an empty KV cache, as `gguf-lens generate` runs a prompt."""
    return generate(model, ids, config, cancel=cancel)


def prepare(model: Model, request: GenRequest) -> Prompt:
    """The prompt ids of a request: chat messages rendered with the model's template (in its sandbox) and encoded
    with special tokens parsed, as `gguf-lens generate --chat` does; a completion's text encoded as plain text."""
    tok = model.tokenizer
    if request.kind == "chat":
        try:
            variables = {"reasoning_effort": request.reasoning_effort} if request.reasoning_effort else None
            rendered = model.chat.render(list(request.messages), tools=list(request.tools) if request.tools else None,
                                         variables=variables)
        except (TypeError, ValueError) as exc:
            raise bad(f"the messages cannot be rendered: {exc}", "messages") from None
        return Prompt(tuple(tok.encode(rendered.text, add_special=True, parse_special=True)), rendered.text,
                      rendered.warning)
    if isinstance(request.prompt, tuple):
        wrong = next((t for t in request.prompt if not 0 <= t < tok.n_vocab), None)
        if wrong is not None:
            raise bad(f"token id {wrong} is outside the vocabulary (0..{tok.n_vocab - 1})", "prompt")
        return Prompt(request.prompt, tok.decode(request.prompt))
    return Prompt(tuple(tok.encode(request.prompt, add_special=True, parse_special=False)), request.prompt)


class Runner:
    """The generation queue of one model: submit() jobs from any thread; one worker thread runs them in order."""

    def __init__(self, model: Model | Callable[[], Model], *, model_id: str, generate: GenerateFn = generate_fresh,
                 max_queue: int = 64, on_exchange: ExchangeHook | None = None,
                 on_failed: Callable[[BaseException], None] | None = None):
        if max_queue < 1:
            raise SettingError(f"max_queue = {max_queue}: must be at least 1")
        self._load = model if callable(model) else None
        self._model: Model | None = None if callable(model) else model
        self.model_id = model_id
        self.aliases: set[str] = {model_id}
        self._generate = generate
        self.max_queue = max_queue  # jobs waiting or running; more are refused (429)
        self.on_exchange = on_exchange
        self._on_failed = on_failed
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: Job | None = None
        self._closing = threading.Event()
        self._state = "loading"
        self.error: BaseException | None = None  # why loading failed
        self._thread: threading.Thread | None = None
        if self._model is not None:
            self._ready(self._model)

    # --- what the routes ask --------------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """'loading', 'ready', 'failed' or 'stopping'."""
        return "stopping" if self._closing.is_set() and self._state == "ready" else self._state

    @property
    def model(self) -> Model | None:
        return self._model

    @property
    def queue_length(self) -> int:
        """Jobs waiting plus the one running."""
        return len(self._waiting) + (self._running is not None)

    def check_ready(self) -> Model:
        """The model, or ApiError(503) while it loads, after it failed to, or once the server stops."""
        state = self.state
        if state != "ready" or self._model is None:
            why = {"loading": "the model is still loading", "failed": f"the model failed to load: {self.error}",
                   "stopping": "the server is stopping"}.get(state, state)
            raise ApiError(503, f"{why}; try again later", code="model_not_ready")
        return self._model

    def prepare(self, request: GenRequest) -> Prompt:
        """The request's prompt ids (runs the chat template: call it off the event loop). ApiError(400) when the
        prompt leaves no room in the context."""
        model = self.check_ready()
        prompt = prepare(model, request)
        n_ctx = model.args.n_ctx
        param = "messages" if request.kind == "chat" else "prompt"
        if not prompt.ids:
            raise bad("the prompt is empty: nothing to continue from", param)
        if len(prompt.ids) >= n_ctx:
            raise bad(f"the prompt is {len(prompt.ids)} tokens; this model's context is {n_ctx}, which leaves no room "
                      f"for a reply", param, "context_length_exceeded")
        return prompt

    def submit(self, job: Job) -> int:
        """Queue a job; returns the queue length with it. ApiError 429 when the queue is full, 503 when stopping."""
        self.check_ready()
        with self._cond:
            if self._closing.is_set():
                raise ApiError(503, "the server is stopping", code="model_not_ready")
            length = self.queue_length
            if length >= self.max_queue:
                raise ApiError(429, f"{length} requests are queued, the most this server takes (--max-queue "
                                    f"{self.max_queue}); try again later", code="queue_full")
            self._waiting.append(job)
            self._cond.notify()
        log.info("request %d (%s, %s): %d prompt tokens, queue %d", job.id, job.request.kind, job.source or "?",
                 len(job.prompt.ids), length + 1)
        return length + 1

    def cancel(self, job: Job) -> None:
        """The client went away: stop the job at its next token, or take it off the queue if it has not started."""
        job.cancel.set()
        with self._cond:
            try:
                self._waiting.remove(job)
            except ValueError:
                return
        log.info("request %d cancelled before it started (queue %d)", job.id, self.queue_length)
        job.emit(Finished("cancelled", len(job.prompt.ids), 0))

    # --- the worker -----------------------------------------------------------------------------------------------

    def start(self) -> Runner:
        """Start the worker thread (it loads the model first when given a loader)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="gguf-lens-serve", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop: the running job at its next token, the waiting ones answered 503. Safe in a signal handler: it
        only sets events; the worker does the rest."""
        self._closing.set()
        running = self._running
        if running is not None:
            running.cancel.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _ready(self, model: Model) -> None:
        self.aliases |= {model.path.name, model.path.stem, model.name}
        self._state = "ready"

    def _work(self) -> None:
        if self._load is not None and self._model is None:
            try:
                self._model = self._load()
            except BaseException as exc:  # noqa: BLE001 - reported to the server, which says it and stops
                self.error, self._state = exc, "failed"
                if self._on_failed is None:
                    log.error("the model failed to load: %s", exc)
                else:
                    self._on_failed(exc)
                return
            self._ready(self._model)
            log.info("%s is loaded", self.model_id)
        while True:
            with self._cond:
                while not self._waiting and not self._closing.is_set():
                    self._cond.wait(_POLL_S)
                if self._closing.is_set():
                    left, self._waiting = list(self._waiting), deque()
                    break
                job = self._running = self._waiting.popleft()
            final: object = ApiError(500, "internal error: the request was not run", code="internal_error")
            reply = None
            try:
                final, reply = self._run(job)
            finally:
                with self._cond:  # off the queue before the client hears its answer (and may ask again at once)
                    self._running = None
                job.emit(final)
            if isinstance(final, Finished):
                log.info("request %d done: %d tokens, %.1f tok/s, %s (queue %d)", job.id, final.completion_tokens,
                         final.gen_tok_s, final.finish_reason, self.queue_length)
            if reply is not None and self.on_exchange is not None:
                try:
                    self.on_exchange(job.source, job.request.messages, reply)
                except Exception:  # noqa: BLE001 - an observer's fault must not stop the server
                    log.exception("the exchange hook failed on request %d", job.id)
        for job in left:
            job.emit(ApiError(503, "the server is stopping", code="model_not_ready"))

    def _run(self, job: Job) -> tuple[object, Reply | None]:
        """Generate a job's reply, sending a Piece per token; returns the closing event (Finished or ApiError) and,
        for a finished reply, what on_exchange hears."""
        model, req, ids = self._model, job.request, job.prompt.ids
        assert model is not None
        room = model.args.n_ctx - len(ids)
        cfg = GenerationConfig(max_tokens=room if req.max_tokens is None else req.max_tokens, stop=req.stop,
                               sampler=req.sampler(), top_logprobs=req.top_logprobs if req.logprobs else 0)
        text: list[str] = []
        out: list[int] = []
        kept: list[Piece] = []  # a plain request's pieces, sent with Finished
        last: Step | None = None
        try:
            for step in self._generate(model, ids, cfg, job.cancel):
                last = step
                counted = step.token_id >= 0 and step.finish_reason != "eos"
                if counted:
                    out.append(step.token_id)
                lp = token_logprob(model, step) if req.logprobs and counted else None
                if step.text or lp is not None:
                    (job.emit if req.stream else kept.append)(Piece(step.text, lp))
                text.append(step.text)
        except ContextFullError as exc:
            return bad(str(exc), code="context_length_exceeded"), None
        except SettingError as exc:
            return bad(str(exc)), None
        except LensError as exc:
            log.error("request %d failed: %s", job.id, exc)
            return ApiError(500, str(exc), code="inference_error"), None
        except Exception as exc:  # noqa: BLE001 - a bug fails its request, never the server
            log.exception("request %d failed", job.id)
            return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error"), None
        reason = _FINISH.get(last.finish_reason or "", "stop") if last is not None else "cancelled"
        if reason == "cancelled" and self._closing.is_set():
            return ApiError(503, "the server is stopping", code="model_not_ready"), None
        speed = last.gen_tok_s if last is not None else 0.0
        done = Finished(reason, len(ids), len(out), speed, tuple(kept))
        return done, Reply("".join(text), tuple(out), job.prompt, reason)


def token_logprob(model: Model, step: Step) -> TokenLogprob:
    """A step's token and its alternatives with their text and UTF-8 bytes (a token may hold part of a character)."""
    tok = model.tokenizer

    def piece(token_id: int) -> tuple[str, tuple[int, ...]]:
        raw = tok.token_bytes(token_id)
        return raw.decode("utf-8", errors="replace"), tuple(raw)

    text, raw = piece(step.token_id)
    top = []
    for token_id, logprob in step.top:
        alt_text, alt_raw = piece(token_id)
        top.append((alt_text, _finite(logprob), alt_raw))
    return TokenLogprob(text, _finite(step.logprob), raw, tuple(top))


def _finite(logprob: float) -> float:
    """JSON has no -Infinity: a probability that underflowed is reported as OpenAI does, -9999."""
    return logprob if math.isfinite(logprob) else -9999.0


def model_id_for(source: str) -> str:
    """The id /v1/models lists for a MODEL argument: a catalog name as given, a file by its name without .gguf."""
    path = Path(source)
    return path.stem if path.suffix == ".gguf" else source
