"""200 requests from 8 concurrent clients on loopback: none lost, none mixed up, memory flat."""
from __future__ import annotations

import itertools
import threading
from typing import Any

import openai

from engine.generate import GenerationConfig, generate
from engine.sampler import SamplerSettings
from tests.engine.serve.conftest import HANG_S, serving

N_REQUESTS = 200
N_CLIENTS = 8
MAX_TOKENS = 4
WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "in", "sun"]


def rss_kib() -> int:
    """This process's resident memory (VmRSS), in KiB."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def greedy(model: Any, prompt: str) -> tuple[str, tuple[float, ...]]:
    """The engine's greedy reply to a completion prompt, with each token's log-probability (which depends on the whole
    prompt, so two prompts with the same reply text still differ)."""
    ids = model.tokenizer.encode(prompt, add_special=True, parse_special=False)
    cfg = GenerationConfig(max_tokens=MAX_TOKENS, sampler=SamplerSettings(temperature=0.0), top_logprobs=0)
    steps = [s for s in generate(model, ids, cfg)]
    counted = [s for s in steps if s.token_id >= 0 and s.finish_reason != "eos"]
    return "".join(s.text for s in steps), tuple(s.logprob for s in counted)


def test_200_requests_from_8_clients(tiny_model: Any) -> None:
    prompts = [" ".join(p) for p in itertools.islice(itertools.permutations(WORDS, 3), N_REQUESTS)]
    assert len(set(prompts)) == N_REQUESTS
    want = [greedy(tiny_model, p) for p in prompts]
    assert len(set(want)) > N_REQUESTS // 2  # replies differ (their log-probabilities at least): a mix-up would show
    got: dict[int, tuple[str, tuple[float, ...]]] = {}
    lengths: list[int] = []
    rss: dict[int, int] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []
    with serving(tiny_model, max_queue=N_CLIENTS) as server:
        def client_loop(k: int) -> None:
            client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=HANG_S)
            try:
                for i in range(k, N_REQUESTS, N_CLIENTS):
                    raw = client.completions.with_raw_response.create(model="tiny", prompt=prompts[i],
                                                                      max_tokens=MAX_TOKENS, temperature=0, logprobs=0)
                    choice = raw.parse().choices[0]
                    with lock:
                        got[i] = (choice.text, tuple(choice.logprobs.token_logprobs))
                        lengths.append(int(raw.headers["x-queue-length"]))
                        if len(got) in (20, N_REQUESTS):
                            rss[len(got)] = rss_kib()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                client.close()

        threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(N_CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(HANG_S * 5)
        assert not any(t.is_alive() for t in threads), "a client hung"
    assert not errors, errors[:3]
    assert sorted(got) == list(range(N_REQUESTS))  # none lost
    mixed = [i for i in range(N_REQUESTS) if got[i] != want[i]]
    assert not mixed, f"{len(mixed)} replies are not their prompt's greedy reply, e.g. #{mixed[0]}"
    assert all(1 <= n <= N_CLIENTS for n in lengths)  # never more queued than clients asking
    assert rss[N_REQUESTS] <= rss[20] * 1.10, f"resident memory grew from {rss[20]} KiB to {rss[N_REQUESTS]} KiB"
