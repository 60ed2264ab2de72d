"""Direct logit attribution on T5 (encoder-decoder): the parts sum to the decoder's own logit (difference) from its
normal encode and forward, the heads' recomputed products leave only rounding in float32 numerics (so each head's
columns of the output products are the right ones), the encoder reaches the logit through the cross-attention heads,
and the model is left as it was."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.attribute.seq2seq import decompose_seq2seq, run_seq2seq
from engine.model import load_model
from tests.engine.arch_files import arch_file
from tools.make_t5_model import t5_file

ENC = [5, 17, 3, 40, 9, 23]
REPLY = [11, 8]


def _logits(model, enc: list[int], dec: list[int]) -> np.ndarray:  # noqa: ANN001
    """The decoder's last logits from the model's own encode and forward (no attribution code involved)."""
    cache = model.new_cache(len(dec))
    model.net.encode(np.asarray(enc), cache)
    return model.net.forward(np.asarray(dec), cache)[-1].astype(np.float64)


@pytest.mark.parametrize(("name", "quant", "numerics"), [("t5", None, "float32"), ("t5_relu", None, "float32"),
                                                         ("t5", None, "ggml"), ("t5", "Q8_0", "ggml")])
def test_t5_parts_sum_to_the_decoders_logit(arch_dir: Path, name: str, quant: str | None, numerics: str) -> None:
    path = t5_file(arch_dir, name, quant) if quant else arch_file(arch_dir, name)
    model = load_model(path, numerics=numerics, warm=False)
    try:
        net = model.net
        dec = [net.decoder_start_token, *REPLY]
        row = _logits(model, ENC, dec)
        order = np.argsort(-row, kind="stable")
        target, contrast = int(order[0]), int(order[9])
        d = decompose_seq2seq(model, run_seq2seq(model, ENC, dec), target, contrast)
        assert d.logit_diff == row[target] - row[contrast]
        assert abs(float(np.sum(d.values)) - d.logit_diff) < 1e-9 * max(1.0, abs(d.logit_diff))
        kinds = [p.kind for p in d.parts]
        n_layers, n_heads = len(net.dec_layers), net.args.n_heads
        assert kinds.count("head") == kinds.count("cross_head") == n_layers * n_heads
        assert kinds.count("ffn") == n_layers and kinds.count("embed") == 1
        rem = float(np.sum(np.abs(d.values[np.array(kinds) == "remainder"])))
        biggest = float(np.max(np.abs(d.values)))
        if quant is None:  # F32 weights: the recomputed heads are the run's products up to float32 rounding
            assert rem < 1e-5 * biggest
        else:  # Q8_0 with ggml numerics: 8-bit activations before every product, booked as remainders
            assert rem < 0.1 * biggest
        cross = np.sum(np.abs(d.values[np.array(kinds) == "cross_head"]))
        assert cross > 1e-3 * biggest  # the encoder's input reaches the logit through cross-attention
        np.testing.assert_array_equal(_logits(model, ENC, dec), row)  # the products and FFNs put back
        assert all(type(layer.attn.wo).__name__ == "Linear" for layer in net.dec_layers)
    finally:
        model.close()


def test_t5_cross_heads_carry_the_encoders_input(arch_dir: Path) -> None:
    """Another encoder input changes the logit through the cross heads' values; the self heads of the first block
    (which read only the decoder's tokens) do not move."""
    model = load_model(arch_file(arch_dir, "t5"), numerics="float32", warm=False)
    try:
        dec = [model.net.decoder_start_token, *REPLY]
        a = decompose_seq2seq(model, run_seq2seq(model, ENC, dec), 7, 12)
        b = decompose_seq2seq(model, run_seq2seq(model, ENC[::-1][:4], dec), 7, 12)
        kinds = np.array([p.kind for p in a.parts])
        layers = np.array([-1 if p.layer is None else p.layer for p in a.parts])
        first_self = (kinds == "head") & (layers == 0)
        vec_a = np.stack([p.vec for p, f in zip(a.parts, first_self) if f])
        vec_b = np.stack([p.vec for p, f in zip(b.parts, first_self) if f])
        np.testing.assert_allclose(vec_a, vec_b, rtol=0, atol=1e-6)
        assert np.max(np.abs(a.values[kinds == "cross_head"] - b.values[kinds == "cross_head"])) > 1e-3
    finally:
        model.close()
