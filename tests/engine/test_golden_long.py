"""Gemma 3 past its 512-token sliding window, against llama.cpp (tools/make_golden.py --long).

1,621 tokens of llama.cpp's own tools/completion/README.md: the prompt runs in llama.cpp's 512-token batches
(engine.generate.UBATCH), so three of them start past the window, and the last 16 tokens run one at a time
through the decode step, which then reads the window at positions past 1,600. Each position's log-probabilities
are held to llama.cpp's (F16 cache) with the short prose's bounds (tests/engine/test_golden.py), past the
window on their own too, and the perplexity within 1%.
"""
from __future__ import annotations

import json

import numpy as np

from engine.generate import UBATCH, run_checked
from engine.model import load_model
from tests.engine.golden import FIXTURES, kld_topk, log_softmax

N_DECODE = 16
WINDOW = 512


def _gathered(logits: np.ndarray, top_ids: np.ndarray, next_ids: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per row: our log-probabilities of llama.cpp's top-K ids, our argmax and our log-probability of the next token,
    64 rows at a time (a 512-row batch of a 262,144-token vocabulary is 512 MiB of float32 already)."""
    q, top, nxt = [], [], []
    for r in range(0, len(logits), 64):
        lp = log_softmax(logits[r : r + 64])
        q.append(np.take_along_axis(lp, top_ids[r : r + 64].astype(np.int64), axis=-1))
        top.append(lp.argmax(-1))
        nxt.append(lp[np.arange(len(lp)), next_ids[r : r + 64]])
    return np.concatenate(q), np.concatenate(top), np.concatenate(nxt)


def test_gemma3_past_its_sliding_window_matches_llamacpp(gemma3_path) -> None:
    z = np.load(FIXTURES / "golden_gemma3_long.npz")
    meta = json.loads((FIXTURES / "golden_gemma3_long.json").read_text())
    model = load_model(gemma3_path)
    try:
        ids = model.tokenizer.encode((FIXTURES / "long_prose.txt").read_text(encoding="utf-8"), add_special=True,
                                     parse_special=False)
        assert ids == z["ids"].tolist() and len(ids) > 3 * WINDOW
        top_ids = z["f16_top_ids"]
        nexts = np.asarray(ids[1:] + [0])
        cache = model.new_cache(2048)
        parts = []
        head = len(ids) - N_DECODE
        for start in range(0, head, UBATCH):  # llama.cpp's batches (as engine.generate.prefill runs them)
            chunk = ids[start : min(head, start + UBATCH)]
            logits = run_checked(model, chunk, cache, None, all_logits=True)
            parts.append(_gathered(logits, top_ids[start : start + len(chunk)], nexts[start : start + len(chunk)]))
            del logits
        for i in range(head, len(ids)):  # the decode step, one token at a time
            logits = run_checked(model, [ids[i]], cache, None)
            parts.append(_gathered(logits, top_ids[i : i + 1], nexts[i : i + 1]))
    finally:
        model.close()
    q = np.concatenate([p[0] for p in parts])
    ours_top = np.concatenate([p[1] for p in parts])
    nll = -np.concatenate([p[2] for p in parts])[:-1]
    kl = kld_topk(np.broadcast_to(np.arange(q.shape[1]), q.shape), z["f16_top_logp"], q)  # q: already gathered
    same = ours_top == top_ids[:, 0]
    ppl = float(np.exp(nll.mean()))
    print(f"gemma3 long: KLD mean {kl.mean():.5f} (past the window {kl[WINDOW:].mean():.5f}, decode steps "
          f"{kl[-N_DECODE:].mean():.5f}), same top {same.mean():.3f}, ppl {ppl:.4f} vs llama.cpp {meta['f16_ppl']:.4f}")
    assert kl.mean() <= 0.008 and kl[WINDOW:].mean() <= 0.008 and kl[-N_DECODE:].mean() <= 0.008
    assert same.mean() >= 0.92 and same[WINDOW:].mean() >= 0.92
    assert abs(ppl / meta["f16_ppl"] - 1.0) <= 0.01
