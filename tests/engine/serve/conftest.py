"""Fixtures of the serve tests: a tiny random model with a chat template that shows tools, and a real uvicorn server
on a free loopback port in a thread, stopped after its test (or module)."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from engine.generate import GenerationConfig, Step, generate
from engine.sampler import SamplerSettings
from engine.serve.runner import Runner, generate_fresh
from engine.serve.server import Server
from tests.tiny_models import make_tiny_llama

HANG_S = 120.0  # a guard against a hung server, never a timing check
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("serve") / "tiny.gguf", n_ctx=256, chat_template=TOOLS_TEMPLATE)


@pytest.fixture(scope="session")
def tiny_model(tiny_path: Path):  # noqa: ANN201
    from engine.model import load_model  # noqa: PLC0415

    model = load_model(tiny_path)
    yield model
    model.close()


@contextmanager
def serving(model: Any, *, model_id: str = "tiny", api_key: str | None = None, max_body: int = 1 << 20,
            **runner_args: Any) -> Iterator[Server]:
    """A started server on 127.0.0.1 and a free port, stopped on exit."""
    server = Server(Runner(model, model_id=model_id, **runner_args), host="127.0.0.1", port=0, api_key=api_key,
                    max_body=max_body).start(timeout=HANG_S)
    try:
        yield server
    finally:
        server.stop(timeout=HANG_S)


def expected(model: Any, ids: Sequence[int], max_tokens: int, **config: Any) -> tuple[str, list[int]]:
    """The engine's own greedy reply to prompt ids (as `gguf-lens generate` runs them): text and counted token ids."""
    cfg = GenerationConfig(max_tokens=max_tokens, sampler=SamplerSettings(temperature=0.0), **config)
    text, out = [], []
    for step in generate(model, list(ids), cfg):
        text.append(step.text)
        if step.token_id >= 0 and step.finish_reason != "eos":
            out.append(step.token_id)
    return "".join(text), out


def chat_ids(model: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
    rendered = model.chat.render(messages, tools=tools)
    return model.tokenizer.encode(rendered.text, add_special=True, parse_special=True)


class Gate:
    """A generate function that waits for release() before each request runs (holds the queue still)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.seen: list[tuple[int, ...]] = []  # the prompt ids of each request that reached the model
        self._open = threading.Event()

    def release(self) -> None:
        self._open.set()

    def __call__(self, model: Any, ids: Sequence[int], cfg: GenerationConfig,
                 cancel: threading.Event) -> Iterator[Step]:
        self.seen.append(tuple(ids))
        self.entered.set()
        assert self._open.wait(3 * HANG_S), "the gate was never released"  # outlasts the tests' own guards
        yield from generate_fresh(model, ids, cfg, cancel)


class Slow:
    """A generate function that sleeps after each token and records, per token, whether cancel was already set."""

    def __init__(self, pause_s: float = 0.02) -> None:
        self.pause_s = pause_s
        self.after_cancel: list[bool] = []  # one per generated token
        self.last: Step | None = None
        self.started = threading.Event()
        self.ended = threading.Event()

    def __call__(self, model: Any, ids: Sequence[int], cfg: GenerationConfig,
                 cancel: threading.Event) -> Iterator[Step]:
        import time  # noqa: PLC0415

        try:
            for step in generate_fresh(model, ids, cfg, cancel):
                if step.token_id >= 0:
                    self.after_cancel.append(cancel.is_set())
                self.last = step
                self.started.set()
                yield step
                time.sleep(self.pause_s)
        finally:
            self.ended.set()


