"""Tokens per second through `gguf-lens serve` against the engine's own loop (what `gguf-lens generate` runs).

    .venv/bin/python benchmarks/serve_overhead.py [MODEL] [-n 128] [--reps 5]

MODEL is a catalog name or a .gguf path (default smollm2-135m-instruct). `gguf-lens serve MODEL` starts in a process
of its own (as a user runs it; the client's work is not in the server's process) and the model is loaded here too;
the same greedy chat prompt then runs, repetition by repetition and interleaved (a machine busy for a while slows
all alike):
  generate: engine.generate.generate from an empty cache in this process, as `gguf-lens generate --chat` runs it;
  server:   the same request to the server with the `openai` client, not streamed;
  stream:   the same, streamed (server-sent events, one per token).
Each is timed end to end (prompt and reply, and for the server the HTTP round trip and JSON), as tokens of reply
per second; printed as JSON: the best and the median of the repetitions, the server's overhead in percent against
generate (negative: faster), and the CPU milliseconds per token of the process that generates (this one for
generate, the server's for the others: what the server adds, whatever else the machine runs). On a shared machine
the best-of figures and the CPU cost are the ones to read.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT = "Write a short story about a robot who learns to paint."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    ap.add_argument("-n", type=int, default=128, help="tokens to generate (greedy; fewer if the model stops)")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    import httpx  # noqa: PLC0415
    import openai  # noqa: PLC0415

    from engine.generate import GenerationConfig, generate  # noqa: PLC0415
    from engine.model import load_model  # noqa: PLC0415
    from engine.sampler import SamplerSettings  # noqa: PLC0415
    from engine.serve.runner import model_id_for  # noqa: PLC0415

    model = load_model(args.model)
    messages = [{"role": "user", "content": PROMPT}]
    ids = model.tokenizer.encode(model.chat.render(messages).text, add_special=True, parse_special=True)
    cfg = GenerationConfig(max_tokens=args.n, sampler=SamplerSettings(temperature=0.0))

    def direct() -> int:
        return sum(1 for s in generate(model, ids, cfg) if s.token_id >= 0 and s.finish_reason != "eos")

    server = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", args.model, "--port", "0"],
                              stderr=subprocess.PIPE, text=True, cwd=ROOT)
    first = server.stderr.readline() if server.stderr else ""
    found = re.search(r"(http://\S+/v1)", first)
    if found is None:
        server.kill()
        raise SystemExit(f"the server did not start: {first}")
    url = found.group(1)
    threading.Thread(target=lambda: [None for _ in server.stderr or ()], daemon=True).start()  # its log, unread
    served_id = model_id_for(args.model)
    while httpx.get(url.removesuffix("/v1") + "/health", timeout=60).status_code != 200:  # 503 while it loads
        if server.poll() is not None:
            raise SystemExit("the server stopped")
        time.sleep(0.5)
    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=600)

    def served() -> int:
        r = client.chat.completions.create(model=served_id, messages=messages, temperature=0, max_tokens=args.n)
        return r.usage.completion_tokens

    def streamed() -> int:
        chunks = list(client.chat.completions.create(model=served_id, messages=messages, temperature=0,
                                                     max_tokens=args.n, stream=True,
                                                     stream_options={"include_usage": True}))
        return chunks[-1].usage.completion_tokens

    kinds = {"generate": direct, "server": served, "stream": streamed}
    speed: dict[str, list[float]] = {k: [] for k in kinds}  # tokens per second, wall clock
    cost: dict[str, list[float]] = {k: [] for k in kinds}  # CPU ms per token of the process that generates
    tokens = set()
    try:
        direct(), served()  # warm-up: first-call costs (kernels, sockets) out of the figures
        for _ in range(args.reps):
            for name, fn in kinds.items():
                time.sleep(0.5)  # the other side's kernel threads settle
                cpu = _here if name == "generate" else (lambda: _cpu_s(server.pid))
                w0, c0 = time.perf_counter(), cpu()
                n = fn()
                wall, used = time.perf_counter() - w0, cpu() - c0
                tokens.add(n)
                speed[name].append(n / wall)
                cost[name].append(1000 * used / n)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(60)
    best = {k: max(v) for k, v in speed.items()}
    med = {k: statistics.median(v) for k, v in speed.items()}
    print(json.dumps({
        "model": model.path.name, "prompt_tokens": len(ids), "reply_tokens": sorted(tokens), "reps": args.reps,
        "cpu_count": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
        "best_tok_s": {k: round(v, 2) for k, v in best.items()},
        "median_tok_s": {k: round(v, 2) for k, v in med.items()},
        "overhead_pct_best": {k: round(100 * (best["generate"] / best[k] - 1), 2) for k in ("server", "stream")},
        "overhead_pct_median": {k: round(100 * (med["generate"] / med[k] - 1), 2) for k in ("server", "stream")},
        "cpu_ms_per_token_median": {k: round(statistics.median(v), 2) for k, v in cost.items()},
        "all_tok_s": {k: [round(x, 2) for x in v] for k, v in speed.items()},
    }))
    model.close()
    return 0


def _here() -> float:
    """CPU seconds of this process, all its threads."""
    return time.process_time()


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) another process has used, from /proc."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    raise SystemExit(main())
