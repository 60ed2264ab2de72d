"""The real SmolLM2: greedy replies through the server equal `gguf-lens generate`'s token for token, and the openai
client streams a chat with log-probabilities."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from engine.cli.main import main
from engine.serve.server import Server
from tests.engine.serve.conftest import HANG_S, serving

PROMPT = "Name three colours of the rainbow."
N = 20


@pytest.fixture(scope="module")
def smol(smollm2_path: Path) -> Iterator[tuple[Any, Server]]:
    from engine.model import load_model  # noqa: PLC0415

    model = load_model(smollm2_path)  # as the CLI loads it (warm)
    with serving(model, model_id="smollm2") as server:
        yield model, server
    model.close()


def cli_generate(path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["generate", str(path), "--prompt", PROMPT, "-n", str(N), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completion"])
def test_greedy_equals_generate_token_for_token(smollm2_path: Path, smol: tuple[Any, Server], chat: bool,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    model, server = smol
    cli = cli_generate(smollm2_path, capsys, *(["--chat"] if chat else []))
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=HANG_S)
    if chat:
        r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": PROMPT}],
                                           temperature=0, max_tokens=N, logprobs=True)
        text, pieces = r.choices[0].message.content, [bytes(c.bytes) for c in r.choices[0].logprobs.content]
    else:
        r = client.completions.create(model="smollm2", prompt=PROMPT, temperature=0, max_tokens=N, logprobs=0)
        text = r.choices[0].text
        pieces = [t.encode("utf-8") for t in r.choices[0].logprobs.tokens]
    assert cli["tokens"] > 0 and text == cli["text"]
    assert pieces == [model.tokenizer.token_bytes(t) for t in cli["token_ids"]]
    assert r.usage.completion_tokens == cli["tokens"]


def test_openai_client_streams_a_chat_with_logprobs(smol: tuple[Any, Server]) -> None:
    _, server = smol
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=HANG_S)
    stream = client.chat.completions.create(model="smollm2", temperature=0, max_tokens=12, stream=True, logprobs=True,
                                            top_logprobs=2,
                                            messages=[{"role": "system", "content": "Answer in one word."},
                                                      {"role": "user", "content": "What colour is the sky?"}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert text.strip() and "".join(t.token for t in tokens) == text
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token for t in tokens)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
