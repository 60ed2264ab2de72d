"""Running the app on uvicorn: a socket bound up front (a taken port is a clean error, port 0 picks a free one), in the
foreground for the CLI or in a thread for tests and a front end, stopped by closing the runner first so that open
streams end at their next token instead of holding the shutdown."""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import socket
import threading
import time
from types import FrameType

import uvicorn

from engine.errors import SettingError
from engine.serve.app import MAX_BODY, create_app
from engine.serve.runner import Runner

log = logging.getLogger(__name__)

GRACE_S = 5.0  # how long a stop waits for replies still being written


def is_loopback(host: str) -> bool:
    """Whether host only reaches this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port; SettingError naming the address when it cannot be had."""
    if not 0 <= port <= 65535:
        raise SettingError(f"--port {port}: must be between 0 and 65535")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise SettingError(f"--host {host}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise SettingError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


class _Uvicorn(uvicorn.Server):
    """uvicorn's server that, on Ctrl+C or SIGTERM, stops the runner before it waits for open connections."""

    def __init__(self, config: uvicorn.Config, runner: Runner):
        super().__init__(config)
        self.runner = runner
        self.interrupted = False  # a Ctrl+C stopped it (Server.run then ends as KeyboardInterrupt, always)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGINT:
            self.interrupted = True
        try:  # run it on the loop, not inside the handler: it sets the running job's Event, which takes a lock
            asyncio.get_running_loop().call_soon_threadsafe(self.runner.close)
        except RuntimeError:
            self.runner.close()
        super().handle_exit(sig, frame)


class Server:
    """The endpoint: a Runner, its routes, and uvicorn on one socket."""

    def __init__(self, runner: Runner, *, host: str = "127.0.0.1", port: int = 8080, api_key: str | None = None,
                 max_body: int = MAX_BODY):
        self.runner = runner
        self.host = host
        self.sock = bind(host, port)
        self.port = self.sock.getsockname()[1]
        app = create_app(runner, api_key=api_key, max_body=max_body)
        config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=int(GRACE_S))
        self._server = _Uvicorn(config, runner)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL clients use (…/v1)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def run(self) -> None:
        """Serve in this thread until stop() or a signal."""
        self.runner.start()
        try:
            self._server.run(sockets=[self.sock])
        finally:
            self.runner.close()
            self.sock.close()
        if self._server.interrupted:  # uvicorn re-raises the signal inside asyncio.run, whose own handler cancels a
            raise KeyboardInterrupt  # task that may be finishing anyway: it ended as 0 or 130 by chance; now always 130

    def start(self, timeout: float = 60.0) -> Server:
        """Serve in a background thread; returns once uvicorn accepts connections."""
        self._thread = threading.Thread(target=self.run, name="gguf-lens-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the runner (the running request ends at its next token), then uvicorn."""
        self.runner.close()
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self.runner.join(timeout)

    def fail(self) -> None:
        """Stop serving from any thread (the model failed to load)."""
        self._server.should_exit = True

