"""The Recorder in T5's decoder (engine.models.seq2seq): the residual stream after each decoder block, which the
logit lens reads, and the input rows of every decoder product, which an importance matrix would read; and the
importance matrix itself refused, as llama-imatrix has nothing to collect from a T5 file."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.errors import SettingError
from engine.observe.logit_lens import logit_lens
from engine.observe.recorder import Recorder
from engine.quality.imatrix_collect import compute_imatrix, compute_imatrix_tokens
from tools.make_t5_model import case_ids


@pytest.fixture
def model(t5_model: Any) -> Any:  # noqa: ANN401
    return t5_model  # tests/conftest.py: the T5 test model in each numerics


def run(model: Any, recorder: Recorder, case: str = "a", split: int = 12) -> tuple[list[int], np.ndarray]:  # noqa
    """Encode the case's input, then its decoder tokens as a prompt of `split` and one token per step, recording;
    the decoder tokens and the logits at every position."""
    enc, dec = case_ids(case)
    cache = model.new_cache()
    model.net.encode(enc, cache)
    rows = [model.forward(dec[:split], cache, recorder, all_logits=True)]
    cache.commit(dec[:split])
    recorder.commit()
    for tok in dec[split:]:
        rows.append(model.forward([tok], cache, recorder))
        cache.commit([tok])
        recorder.commit()
    return dec, np.concatenate(rows)


def test_the_last_blocks_stream_through_the_head_is_the_logits(model: Any) -> None:  # noqa: ANN401
    """hidden[last decoder layer] through dec.output_norm and the output matrix gives the decoder's logits, bit for
    bit, at every position (a prompt, then single steps); every decoder layer's stream is recorded."""
    rec = Recorder(capture_q=False, capture_hidden=True)
    dec, logits = run(model, rec)
    net = model.net
    assert sorted(rec.hidden) == list(range(len(net.dec_layers))) and rec.length == len(dec)
    last = rec.hidden[len(net.dec_layers) - 1][: rec.length]
    assert last.shape == (len(dec), net.args.dim)
    groups = [slice(0, 12)] + [slice(j, j + 1) for j in range(12, len(dec))]  # the rows each call ran at once
    for g in groups:  # (a BLAS product's rounding depends on how many rows it multiplies: float32 numerics)
        assert np.array_equal(net.output(net.norm(last[g], net.out_norm)), logits[g])
        assert np.array_equal(net.head(last[g], all_logits=True), logits[g])
    assert not np.array_equal(rec.hidden[0][: rec.length], last)


def test_the_logit_lens_runs_on_the_decoder(model: Any) -> None:  # noqa: ANN401
    rec = Recorder(capture_q=False, capture_hidden=True)
    dec, logits = run(model, rec)
    hidden = {i: h[: rec.length] for i, h in rec.hidden.items()}
    lens = logit_lens(lambda x: model.net.head(x, all_logits=True), hidden, dec, range(len(dec)), logits[-1:])
    assert lens.rank.shape == (2, len(dec))
    assert np.array_equal(lens.top_ids[-1, :, 0], logits.argmax(-1))  # the last layer's lens: the model's own top 1
    nxt = np.asarray(dec[1:])  # a known position's target is the next decoder token; the last one's, the top 1
    assert np.array_equal(lens.rank[-1, :-1], (logits[:-1] > logits[np.arange(len(nxt)), nxt][:, None]).sum(-1))
    assert lens.rank[-1, -1] == 0 and not lens.target_known[-1]


def test_every_decoder_product_sees_its_input(model: Any) -> None:  # noqa: ANN401
    """record_input names every matrix of the decoder (the cross K/V on the encoder output's rows, as llama.cpp's
    decoder graph multiplies them on each call) and none of the encoder's, with rows as wide as the matrix's input."""
    seen: dict[str, list[tuple[int, int]]] = {}
    linears = model.net.linears()

    def on_input(names: tuple[str, ...], x: np.ndarray) -> None:
        for name in names:
            assert x.shape[1] == linears[name].n_in, name
            seen.setdefault(name, []).append(x.shape)

    run(model, Recorder(capture_q=False, on_input=on_input), "b", split=16)
    enc, dec = case_ids("b")
    decoder = {n for n in linears if n.startswith("dec.blk.")}
    assert set(seen) == decoder
    for name, shapes in seen.items():
        rows = [s[0] for s in shapes]
        want = len(enc) if "cross_attn_k" in name or "cross_attn_v" in name else None
        assert rows == ([want] * (1 + len(dec) - 16) if want else [16] + [1] * (len(dec) - 16)), name


def test_the_recorder_changes_no_logit(model: Any) -> None:  # noqa: ANN401
    _, plain = run(model, Recorder(capture_q=False))
    _, recorded = run(model, Recorder(capture_q=False, capture_hidden=True, on_input=lambda names, x: None))
    assert np.array_equal(plain, recorded)


def test_an_importance_matrix_is_refused_as_llama_imatrix_has_none(model: Any) -> None:  # noqa: ANN401
    with pytest.raises(SettingError, match=r"encoder-decoder.*enc\.blk\.\* and dec\.blk\.\*"):
        compute_imatrix(model, "a calibration text " * 200, n_ctx=32)
    with pytest.raises(SettingError, match="encoder-decoder"):
        compute_imatrix_tokens(model, [case_ids("a")[0]] * 2)
