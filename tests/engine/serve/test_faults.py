"""Faults over HTTP: the API key, a full queue (429), loading and stopping (503), clients that disconnect, the CLI."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from engine.serve import app as serve_app
from tests.engine.serve.conftest import HANG_S, Gate, Slow, serving

MSG = [{"role": "user", "content": "the cat"}]


def _wait_for(what: Any, guard_s: float = HANG_S) -> None:
    deadline = time.monotonic() + guard_s
    while not what():
        assert time.monotonic() < deadline, "gave up waiting (hang guard)"
        time.sleep(0.01)


def test_api_key(tiny_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[bytes] = []
    real = serve_app.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append(a)
        return real(a, b)

    monkeypatch.setattr(serve_app.hmac, "compare_digest", spy)
    with serving(tiny_model, api_key="s3cret") as server:
        good = openai.OpenAI(base_url=server.url, api_key="s3cret", max_retries=0, timeout=HANG_S)
        assert good.chat.completions.create(model="tiny", messages=MSG, max_tokens=2).choices
        wrong = openai.OpenAI(base_url=server.url, api_key="s3cre", max_retries=0, timeout=HANG_S)
        with pytest.raises(openai.AuthenticationError) as info:
            wrong.models.list()
        assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"
        assert httpx.get(f"{server.url}/models", timeout=HANG_S).status_code == 401  # no header at all
        assert httpx.post(f"{server.url}/completions", json={"prompt": "x"}, timeout=HANG_S).status_code == 401
        health = httpx.get(server.url.removesuffix("/v1") + "/health", timeout=HANG_S)
        assert health.status_code == 200  # the health check needs no key
    assert b"s3cre" in compared and b"s3cret" in compared  # every check went through compare_digest


def test_full_queue_is_429_with_the_length_shown(tiny_model: Any) -> None:
    gate = Gate()
    with serving(tiny_model, generate=gate, max_queue=2) as server:
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=HANG_S)
        results: list[Any] = []

        def ask() -> None:
            raw = client.completions.with_raw_response.create(model="tiny", prompt="x", max_tokens=2)
            results.append(raw.headers["x-queue-length"])

        threads = [threading.Thread(target=ask) for _ in range(2)]
        threads[0].start()
        assert gate.entered.wait(HANG_S)
        threads[1].start()
        health = server.url.removesuffix("/v1") + "/health"
        _wait_for(lambda: httpx.get(health, timeout=HANG_S).json()["queue_length"] == 2)
        with pytest.raises(openai.RateLimitError) as info:
            client.completions.create(model="tiny", prompt="x", max_tokens=2)
        assert info.value.status_code == 429 and info.value.body["code"] == "queue_full"
        gate.release()
        for t in threads:
            t.join(HANG_S)
        assert sorted(results) == ["1", "2"]
        assert client.completions.create(model="tiny", prompt="x", max_tokens=1).choices  # serving again


def test_503_while_loading_then_served(tiny_model: Any) -> None:
    loaded = threading.Event()

    def load() -> Any:
        assert loaded.wait(HANG_S)
        return tiny_model

    with serving(load) as server:
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=HANG_S)
        health = server.url.removesuffix("/v1") + "/health"
        r = httpx.get(health, timeout=HANG_S)
        assert r.status_code == 503 and r.json()["status"] == "loading"
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model="tiny", messages=MSG)
        assert info.value.status_code == 503 and info.value.body["code"] == "model_not_ready"
        loaded.set()
        _wait_for(lambda: httpx.get(health, timeout=HANG_S).status_code == 200)
        assert client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2).choices


def test_503_once_stopping(tiny_model: Any) -> None:
    with serving(tiny_model) as server:
        server.runner.close()
        r = httpx.post(f"{server.url}/completions", json={"prompt": "x"}, timeout=HANG_S)
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"


def test_stream_disconnect_cancels_within_a_token(tiny_model: Any) -> None:
    slow = Slow()
    with serving(tiny_model, generate=slow) as server:
        body = {"messages": MSG, "max_tokens": 200, "temperature": 0, "stream": True}
        url = f"{server.url}/chat/completions"
        with httpx.Client(timeout=HANG_S) as http, http.stream("POST", url, json=body) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]  # a few tokens arrive, then the client goes away
        assert any(line.startswith("data: ") for line in got)
        assert slow.ended.wait(HANG_S)
        assert slow.last is not None and slow.last.finish_reason == "cancelled"
        assert sum(slow.after_cancel) <= 1, slow.after_cancel  # at most the token already being computed
        assert len(slow.after_cancel) < 100
        _wait_for(lambda: server.runner.queue_length == 0)


def test_plain_request_disconnect_cancels(tiny_model: Any) -> None:
    slow = Slow()
    with serving(tiny_model, generate=slow) as server:
        body = json.dumps({"model": "tiny", "messages": MSG, "max_tokens": 200, "temperature": 0}).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=HANG_S) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            assert slow.started.wait(HANG_S)
        assert slow.ended.wait(HANG_S)
        assert slow.last is not None and slow.last.finish_reason == "cancelled"
        assert sum(slow.after_cancel) <= 1 and len(slow.after_cancel) < 100


def test_waiting_request_that_disconnects_leaves_the_queue(tiny_model: Any) -> None:
    gate = Gate()
    with serving(tiny_model, generate=gate) as server:
        first = threading.Thread(target=lambda: httpx.post(f"{server.url}/completions", timeout=HANG_S,
                                                           json={"prompt": "x", "max_tokens": 1}))
        first.start()
        assert gate.entered.wait(HANG_S)
        body = json.dumps({"prompt": "y", "max_tokens": 1}).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=HANG_S) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            _wait_for(lambda: server.runner.queue_length == 2)
        _wait_for(lambda: server.runner.queue_length == 1)  # gone before it ran
        gate.release()
        first.join(HANG_S)
        _wait_for(lambda: server.runner.queue_length == 0)
    assert len(gate.seen) == 1  # the request that went away never reached the model


def test_cli_serves_logs_and_stops_on_ctrl_c(tiny_path: Path) -> None:
    """`gguf-lens serve` in its own process: the URL on stderr, /health, a request logged with the queue length,
    and SIGINT ends it."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", str(tiny_path), "--port", "0"],
                            stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        _wait_for(lambda: any("serving" in line for line in lines) or proc.poll() is not None)
        found = re.search(r"(http://\S+/v1)", "".join(lines))
        assert found is not None, "".join(lines)
        url = found.group(1)
        assert url.startswith("http://127.0.0.1:")
        _wait_for(lambda: httpx.get(url.removesuffix("/v1") + "/health", timeout=HANG_S).status_code == 200)
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=HANG_S)
        assert client.models.list().data[0].id == "tiny"
        client.chat.completions.create(model="tiny", messages=MSG, max_tokens=3)
        _wait_for(lambda: any("done:" in line for line in lines))
        assert any(re.search(r"request \d+ \(chat, 127\.0\.0\.1:\d+\): \d+ prompt tokens, queue 1", ln) for ln in lines)
        proc.send_signal(signal.SIGINT)
        proc.wait(HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(HANG_S)
    assert proc.returncode == 130  # Ctrl+C ends it as it ends every command, not a hang
    reader.join(HANG_S)
    assert not any("Traceback" in line for line in lines), "".join(lines)


def test_cli_refuses_a_taken_port_and_warns_off_loopback(tiny_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from engine.cli.main import main  # noqa: PLC0415
    from engine.serve import server as serve_server  # noqa: PLC0415

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        assert main(["serve", str(tiny_path), "--port", str(taken.getsockname()[1])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot listen on 127.0.0.1" in err
    assert main(["serve", str(tiny_path.parent / "missing.gguf"), "--port", "0"]) == 2  # refused before listening
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err
    (tiny_path.parent / "bad.gguf").write_bytes(b"not a gguf file")
    assert main(["serve", str(tiny_path.parent / "bad.gguf"), "--port", "0"]) == 2  # fails loading: stops serving
    assert "not a GGUF file" in capsys.readouterr().err.splitlines()[-1]
    # an address beyond this machine: bound to loopback here (the test never listens outside), and warned about
    real_bind = serve_server.bind
    monkeypatch.setattr(serve_server, "bind", lambda host, port: real_bind("127.0.0.1", 0))
    monkeypatch.setattr(serve_server.Server, "run", lambda self: self.sock.close())
    assert main(["serve", str(tiny_path), "--host", "0.0.0.0", "--port", "0"]) == 0
    err = capsys.readouterr().err
    assert "warning: listening on 0.0.0.0" in err and "no --api-key" in err
    assert main(["serve", str(tiny_path), "--port", "0"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_hostile_template_stays_in_the_sandbox(tmp_path: Path) -> None:
    """A template reaching for Python internals is stopped by the sandbox; the request is answered with the built-in
    template instead, and the warning reaches the exchange hook."""
    from engine.model import load_model  # noqa: PLC0415
    from tests.tiny_models import make_tiny_llama  # noqa: PLC0415

    path = make_tiny_llama(tmp_path / "hostile.gguf", chat_template=(
        "{{ ''.__class__.__mro__[1].__subclasses__() }}{% for m in messages %}{{ m.content }}{% endfor %}"))
    model = load_model(path, warm=False)
    seen: list[Any] = []
    try:
        with serving(model, on_exchange=lambda *a: seen.append(a)) as server:
            client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=HANG_S)
            assert client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2).choices
    finally:
        model.close()
    prompt = seen[0][2].prompt
    assert "forbidden" in (prompt.warning or "") and prompt.text.startswith("<|im_start|>user\nthe cat")
    assert "subclasses" not in prompt.text and "<class" not in prompt.text


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("127.8.0.1", True), ("localhost", True),
                                                ("::1", True), ("[::1]", True), ("0.0.0.0", False), ("::", False),
                                                ("192.168.1.20", False), ("example.org", False)])
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    from engine.serve.server import is_loopback  # noqa: PLC0415

    assert is_loopback(host) is loopback


def test_bind_refuses_bad_ports_and_hosts() -> None:
    from engine.errors import SettingError  # noqa: PLC0415
    from engine.serve.server import bind  # noqa: PLC0415

    with pytest.raises(SettingError, match="--port 70000"):
        bind("127.0.0.1", 70000)
    with pytest.raises(SettingError, match="--host"):
        bind("no such host.invalid", 0)
    sock = bind("127.0.0.1", 0)
    assert sock.getsockname()[0] == "127.0.0.1" and sock.getsockname()[1] > 0
    sock.close()
