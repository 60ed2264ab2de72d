"""Serving the app's loaded model on the OpenAI-compatible endpoint (engine.serve), and what each request leaves.

The server's worker runs each request with `engine.generate` on the model the app holds, quantization overrides,
adapters and interventions included, each step under `Session.lock`: a request and the chat's reply take turns
token by token (the lock is the one the chat's generate job releases between tokens), so the window's chat is
never blocked for a whole request and neither run ever sees the other's half-made step. Each request runs from a
KV cache of its own, so a reply never depends on the chat, nor the chat on a request.

After a request, `on_exchange` gets a ServedExchange: the messages, the reply's text and its tokens with their
log-probabilities, as the chat stores a reply (app.data.chats), so the window can save it as a chat marked with
its source, which every lens reads like any other chat. No Qt here: the controller (app.controllers.serve) brings
the exchange to the GUI thread.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from app.jobs.chat import token_record
from app.jobs.session import Session
from app.records.reply import TokenRecord


@dataclass(frozen=True)
class ServedExchange:
    """One finished request: who asked, what (chat messages, or a completion's prompt text) and what came back."""

    source: str  # the client's address
    url: str  # the endpoint it reached
    model_id: str
    messages: tuple[dict[str, Any], ...]  # chat requests; () for a completion
    prompt_text: str  # the completion's prompt, or the rendered chat
    text: str
    tokens: tuple[TokenRecord, ...]
    finish_reason: str
    prompt_tokens: int
    gen_tok_s: float

    @property
    def completion(self) -> bool:
        return not self.messages


class ModelChanged(RuntimeError):
    """The app loaded another model while a request ran on the old one."""


@dataclass
class AppServe:
    """The endpoint on the session's model: start(), stop(), the queue length; on_exchange after each request."""

    session: Session
    model_id: str
    on_exchange: Callable[[ServedExchange], None]
    server: Any = None
    _steps: list[Any] = field(default_factory=list)  # the running request's Steps (the server's one worker thread)
    _model: Any = None

    def start(self, host: str = "127.0.0.1", port: int = 8080, api_key: str | None = None) -> str:
        """Serve the session's model; returns the base URL. engine.errors.SettingError when the port is taken."""
        from engine.serve.runner import Runner  # noqa: PLC0415 - starlette and uvicorn only when serving
        from engine.serve.server import Server  # noqa: PLC0415

        self.stop()
        model = self.session.model
        if model is None:
            raise RuntimeError("no model is loaded")
        self._model = model
        runner = Runner(model, model_id=self.model_id, generate=self._generate, on_exchange=self._exchanged)
        self.server = Server(runner, host=host, port=port, api_key=api_key or None)
        self.server.start()
        return str(self.server.url)

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    @property
    def serving(self) -> bool:
        return self.server is not None

    @property
    def url(self) -> str:
        return str(self.server.url) if self.server is not None else ""

    @property
    def queue_length(self) -> int:
        return int(self.server.runner.queue_length) if self.server is not None else 0

    def _generate(self, model: Any, ids: Sequence[int], config: Any, cancel: threading.Event) -> Iterator[Any]:
        """engine.generate from a cache of its own, each step under the session's lock (see the module)."""
        from engine.generate import generate  # noqa: PLC0415

        self._steps = []
        steps = generate(model, ids, config, cancel=cancel)
        while True:
            with self.session.lock:
                if self.session.model is not model:
                    raise ModelChanged("the app loaded another model; send the request again")
                try:
                    step = next(steps)
                except StopIteration:
                    return
            self._steps.append(step)
            yield step

    def _exchanged(self, source: str, messages: Sequence[dict[str, Any]], reply: Any) -> None:
        """The Runner's on_exchange (its worker thread): the reply as the chat stores one."""
        tok = self._model.tokenizer
        tokens = [token_record(tok, s.token_id, s.logprob, s.top) for s in self._steps
                  if s.token_id >= 0 and s.finish_reason != "eos"]
        last = self._steps[-1] if self._steps else None
        self._steps = []
        self.on_exchange(ServedExchange(
            source=source, url=self.url, model_id=self.model_id, messages=tuple(dict(m) for m in messages),
            prompt_text=str(reply.prompt.text), text=str(reply.text), tokens=tuple(tokens),
            finish_reason=str(reply.finish_reason), prompt_tokens=len(reply.prompt.ids),
            gen_tok_s=float(last.gen_tok_s) if last is not None else 0.0))
