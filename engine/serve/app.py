"""The HTTP side of `gguf-lens serve`: starlette routes for OpenAI's /v1/models, /v1/chat/completions and
/v1/completions, plus /health; the API key, the body limit, and the bridge from the runner's thread to the event loop.

Every failure a client can cause is OpenAI's error object with its status (400 bad JSON or fields or a prompt
longer than the context, 401 a missing or wrong key, 404 an unknown model or route, 413 a body over the limit,
429 a full queue, 503 while the model loads or the server stops), and the server goes on serving. The queue
length is in every generation reply's `X-Queue-Length` header and in /health.

A client that disconnects cancels its request: a stream when starlette stops iterating it (the generator's
`finally`), a plain request through a task that waits for ASGI's http.disconnect.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.serve.protocol import ApiError, GenRequest, parse_body, parse_chat, parse_completion
from engine.serve.responses import ReplyFormat, reply_format
from engine.serve.runner import Finished, Job, Piece, Runner

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20  # bytes a request body may have (--max-body)
DRAIN_CAP = 16 << 20  # an oversized body is read and dropped up to this many bytes before the 413
_OPEN = frozenset({"/health"})  # routes that need no API key


class _Inbox:
    """Events from the runner's thread, read on the event loop: the loop is woken once for all the events that arrive
    before it gets to them (a token's wake-up is the server's main cost per streamed token)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._items: deque[object] = deque()
        self._ready = asyncio.Event()
        self._woken = False  # a wake-up is on its way to the loop

    def put(self, event: object) -> None:  # the runner's thread
        self._items.append(event)
        if not self._woken:
            self._woken = True
            try:
                self._loop.call_soon_threadsafe(self._ready.set)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

    async def get(self) -> list[object]:
        """The events that arrived, at least one, oldest first."""
        while True:
            self._woken = False  # before taking: an event put after this line wakes the loop again
            if self._items:
                taken = []
                while self._items:
                    taken.append(self._items.popleft())
                return taken
            self._ready.clear()
            await self._ready.wait()


class ServeApp:
    """The routes over one Runner. `api_key`: every route but /health needs `Authorization: Bearer KEY`."""

    def __init__(self, runner: Runner, *, api_key: str | None = None, max_body: int = MAX_BODY):
        self.runner = runner
        self._key = api_key.encode("utf-8") if api_key else None
        self.max_body = max_body

    def starlette(self) -> Starlette:
        """The ASGI application."""
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
        ]
        handlers: dict[Any, Any] = {ApiError: _api_error, HTTPException: _http_error, ClientDisconnect: _gone,
                                    Exception: _internal_error}
        return Starlette(routes=routes, exception_handlers=handlers)

    # --- routes ---------------------------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        state = self.runner.state
        body = {"status": "ok" if state == "ready" else state, "model": self.runner.model_id,
                "queue_length": self.runner.queue_length, "max_queue": self.runner.max_queue}
        return JSONResponse(body, status_code=200 if state == "ready" else 503)

    async def models(self, request: Request) -> Response:
        self._authorize(request)
        return JSONResponse({"object": "list", "data": [self._card()]})

    async def model(self, request: Request) -> Response:
        self._authorize(request)
        self._check_model(request.path_params["model_id"], "model_id")
        return JSONResponse(self._card())

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, parse_chat)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, parse_completion)

    # --- the steps of a generation request ------------------------------------------------------------------------

    async def _generate(self, request: Request, parse: Any) -> Response:
        self._authorize(request)
        req: GenRequest = parse(parse_body(await self._body(request)))
        if req.model is not None:
            self._check_model(req.model, "model")
        self.runner.check_ready()
        prompt = await run_in_threadpool(self.runner.prepare, req)  # the chat template runs off the event loop
        inbox = _Inbox()
        client = request.client
        job = Job(req, prompt, inbox.put, source=f"{client.host}:{client.port}" if client else "")
        length = self.runner.submit(job)
        headers = {"X-Queue-Length": str(length)}
        fmt = reply_format(req, self.runner.model_id)
        if req.stream:
            # the background task runs once the response is over, a client gone before the stream's first
            # event included (a generator never started has no `finally` to run): the job is cancelled then
            return StreamingResponse(self._stream(job, inbox, fmt), media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache"},
                                     background=BackgroundTask(self.runner.cancel, job))
        watch = asyncio.ensure_future(self._cancel_on_disconnect(request, job))
        try:
            while True:
                for event in await inbox.get():
                    if isinstance(event, Finished):
                        return JSONResponse(fmt.whole(list(event.pieces), event), headers=headers)
                    if isinstance(event, ApiError):
                        raise event
        except asyncio.CancelledError:  # the server is shutting down under this request
            self.runner.cancel(job)
            raise
        finally:
            watch.cancel()

    async def _stream(self, job: Job, inbox: _Inbox, fmt: ReplyFormat) -> AsyncIterator[str]:
        finished = False
        try:
            for event in fmt.opening():
                yield event
            while True:
                out: list[str] = []  # the events that arrived together go out in one write
                for item in await inbox.get():
                    if isinstance(item, Piece):
                        out.append(fmt.chunk(item))
                    elif isinstance(item, (Finished, ApiError)):
                        finished = True
                        out += fmt.closing(item) if isinstance(item, Finished) else fmt.error(item)
                        break
                yield "".join(out)
                if finished:
                    return
        finally:  # the client went away (starlette cancelled the stream), or the reply is complete
            if not finished:
                self.runner.cancel(job)

    async def _cancel_on_disconnect(self, request: Request, job: Job) -> None:
        """Wait for ASGI's http.disconnect (the body is read: nothing else arrives) and cancel the job."""
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                log.info("request %d: the client disconnected", job.id)
                self.runner.cancel(job)
                return

    # --- checks ---------------------------------------------------------------------------------------------------

    def _authorize(self, request: Request) -> None:
        if self._key is None or request.url.path in _OPEN:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        # compared in constant time, so the answer's timing says nothing of how much of a guess was right
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("utf-8"), self._key):
            raise ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer KEY'",
                           code="invalid_api_key")

    async def _body(self, request: Request) -> bytes:
        """The body, up to the limit, else 413. An oversized body is read to its end (kept no further than
        DRAIN_CAP) before the answer: a server that closes on unread bytes resets the connection, and the client
        would see the reset instead of the 413."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max(self.max_body, DRAIN_CAP):
            raise _too_large(int(declared), self.max_body)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size <= self.max_body:
                chunks.append(chunk)
            elif size > DRAIN_CAP:
                break
        if size > self.max_body:
            raise _too_large(size, self.max_body)
        return b"".join(chunks)

    def _check_model(self, name: str, param: str) -> None:
        if name not in self.runner.aliases:
            raise ApiError(404, f"The model '{name}' does not exist: this server serves '{self.runner.model_id}'",
                           param=param, code="model_not_found")

    def _card(self) -> dict[str, Any]:
        return {"id": self.runner.model_id, "object": "model", "created": 0, "owned_by": "gguf-lens"}


def create_app(runner: Runner, *, api_key: str | None = None, max_body: int = MAX_BODY) -> Starlette:
    """The ASGI application serving `runner`'s model."""
    return ServeApp(runner, api_key=api_key, max_body=max_body).starlette()


def _too_large(size: int, limit: int) -> ApiError:
    return ApiError(413, f"the request body is {size} bytes, over this server's limit of {limit} bytes "
                         f"(--max-body)", code="request_too_large")


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    if exc.status >= 500:
        log.warning("%s %s: %d %s", request.method, request.url.path, exc.status, exc.message)
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    what = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    err = ApiError(exc.status_code, what.get(exc.status_code, str(exc.detail)), code="not_found"
                   if exc.status_code == 404 else None)
    return JSONResponse(err.body(), status_code=exc.status_code, headers=exc.headers)


async def _gone(request: Request, exc: Exception) -> Response:
    """The client left while sending its body: nobody will read the answer."""
    return Response(status_code=400)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
    err = ApiError(500, f"internal error: {type(exc).__name__}", code="internal_error")
    return JSONResponse(err.body(), status_code=500)
