"""File > Serve the model: the window's model on the OpenAI-compatible endpoint, reached with the `openai` client.

A request's greedy reply is the engine's own greedy output for the same rendered prompt, token for token; each
request becomes a chat marked with its source, saved, whose lenses read it like any chat; the endpoint follows a
model switch, and stopping it closes the port.
"""
from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from app.data.store import Store
from app.views.attention.lens import AttentionLens
from tests.app.windows import LOAD_MS, greedy_window
from tests.tiny_models import make_tiny_llama

REPLY_MS = 120_000


@pytest.fixture
def served(qtbot, tmp_path: Path, data_dir: Path):  # noqa: ANN201
    w = greedy_window(qtbot, make_tiny_llama(tmp_path / "tiny.gguf", n_ctx=512), data_dir)
    qtbot.waitUntil(lambda: w.engine.session.model is not None, timeout=LOAD_MS)
    w.serve.port = lambda: 0  # any free port
    w.serve_action.setChecked(True)  # File > Serve the model
    assert w.serve.serving and w.serve_action.isChecked()
    yield w
    w.close()


def _client(w) -> openai.OpenAI:  # noqa: ANN001
    return openai.OpenAI(base_url=w.serve.serve.url, api_key="-", max_retries=0, timeout=120)


def _engine_greedy(model, messages: list[dict[str, str]], n: int) -> list[int]:  # noqa: ANN001
    from engine.generate import GenerationConfig, generate
    from engine.sampler import SamplerSettings

    ids = model.tokenizer.encode(model.chat.render(messages).text, add_special=True, parse_special=True)
    cfg = GenerationConfig(max_tokens=n, sampler=SamplerSettings(temperature=0.0))
    return [s.token_id for s in generate(model, ids, cfg) if s.token_id >= 0 and s.finish_reason != "eos"]


def test_a_request_is_answered_filed_as_a_chat_and_read_by_the_lenses(qtbot, served, data_dir: Path) -> None:
    w = served
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    reply = _client(w).chat.completions.create(model=w.serve.serve.model_id, messages=messages, max_tokens=6,
                                               temperature=0, logprobs=True, top_logprobs=2)
    text = reply.choices[0].message.content
    qtbot.waitUntil(lambda: any(c.source.startswith("API") for c in w.conversation.chats), timeout=REPLY_MS)
    chat = next(c for c in w.conversation.chats if c.source.startswith("API"))
    assert chat.system_prompt == "Be brief." and [m.role for m in chat.messages] == ["user", "assistant"]
    assert chat.messages[0].content == "hello there" and chat.messages[1].content == text
    assert chat.title.startswith("⇄") and w.serve.serve.url in chat.source
    ids = [t[0] for t in chat.messages[1].tokens]
    with w.engine.session.lock:
        want = _engine_greedy(w.engine.session.model, messages, 6)
    assert ids == want and reply.usage.completion_tokens == len(ids)
    assert [t[2] for t in chat.messages[1].tokens] == pytest.approx(
        [c.logprob for c in reply.choices[0].logprobs.content], abs=1e-4)
    saved = {c.id: c for c in Store(data_dir).load_chats()}
    assert saved[chat.id].source == chat.source  # saved, with its source
    # the lenses read it like any chat: the attention overview covers its prompt and reply
    lens = w.lens_tabs.lens(AttentionLens)
    w.lens_tabs.select("Attention")
    w.conversation.open_chat(chat.id)
    qtbot.waitUntil(lambda: lens.attention is not None and lens.attention.n_tokens >= len(ids) + 2, timeout=REPLY_MS)
    assert lens.attention.token_texts[-len(ids):] == [t[1] for t in chat.messages[1].tokens][-len(ids):] or \
        "".join(lens.attention.token_texts).endswith(text)


def test_the_endpoint_follows_a_model_switch_and_stops(qtbot, served, tmp_path: Path) -> None:
    w = served
    first = w.serve.serve.model_id
    other = make_tiny_llama(tmp_path / "other.gguf", n_ctx=512, seed=3)
    w.open_model(str(other))
    qtbot.waitUntil(lambda: w.serve.serving and w.serve.serve.model_id == "other", timeout=LOAD_MS)
    assert first == "tiny"
    done = _client(w).completions.create(model="other", prompt="once upon", max_tokens=3, temperature=0)
    assert done.choices[0].text is not None
    qtbot.waitUntil(lambda: any(c.source.startswith("API") and c.prompt_mode == "plain" for c in w.conversation.chats),
                    timeout=REPLY_MS)
    url = w.serve.serve.url
    w.serve_action.setChecked(False)
    assert not w.serve.serving and not w.serve.label.isVisible()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url.replace("/v1", "/health"), timeout=300)  # a hang guard: it must be refused


def test_serving_on_a_taken_port_says_why_and_leaves_the_endpoint_alone(qtbot, served) -> None:
    w = served
    taken = int(w.serve.serve.url.rsplit(":", 1)[1].split("/")[0])
    banners: list[tuple[str, str]] = []
    second = type(w.serve)(w.engine, w.conversation, port=lambda: taken, model_label=lambda: "x",
                           banner=lambda kind, text: banners.append((kind, text)))
    assert not second.set_serving(True) and banners[-1][0] == "error" and str(taken) in banners[-1][1]
    assert w.serve.serving  # the first endpoint is untouched
