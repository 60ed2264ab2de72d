"""A tiny llama whose matrices are i-quants (every type, mixed, the tied embedding too) loads and runs.

GGUF Lens cannot quantize to the i-quants, so the weights are random blocks with their fp16 scale set for
weights of about 1/sqrt(n_in). Both numerics run the model; with ggml numerics every product goes through the
compiled i-quant kernels (no float copy kept) and stays close to the float32 reference.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.generate import prefill
from engine.gguf.reader import open_gguf
from engine.gguf.writer import write_gguf
from engine.model import load_model
from engine.quant import TYPES, GGMLType, dequantize
from tests.tiny_models import make_tiny_llama

T = GGMLType
# which i-quant each matrix gets (layer 1 shifts the list by two, so all nine types appear)
ROLES = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
IQ = [T.IQ2_XXS, T.IQ3_XXS, T.IQ4_NL, T.IQ2_S, T.IQ1_S, T.IQ2_XS, T.IQ4_XS, T.IQ3_S, T.IQ1_M]


def _set_scale(blocks: np.ndarray, qtype: GGMLType, d: float) -> None:
    """The fp16 super-block scale of every block (n, type_size), in place (IQ1_M: the top nibbles of its scales)."""
    half = np.full(len(blocks), d, np.float32).astype("<f2").view("<u2")
    if qtype != T.IQ1_M:
        blocks[:, 0:2] = half[:, None].view(np.uint8)
        return
    words = np.ascontiguousarray(blocks[:, 48:56]).view("<u2") & np.uint16(0x0FFF)
    for j in range(4):
        words[:, j] |= ((half >> np.uint16(4 * j)) & np.uint16(0xF)) << np.uint16(12)
    blocks[:, 48:56] = words.view(np.uint8)


def random_iq(rng: np.random.Generator, qtype: GGMLType, n_rows: int, n_cols: int) -> np.ndarray:
    """Random (n_rows, row_bytes) blocks of `qtype` whose weights have a standard deviation of about 1/sqrt(n_cols)."""
    info = TYPES[qtype]
    blocks = rng.integers(0, 256, (n_rows * n_cols // info.block_size, info.type_size), dtype=np.uint8)
    _set_scale(blocks, qtype, 1.0)
    std = float(dequantize(blocks, qtype).std())
    _set_scale(blocks, qtype, 1.0 / (std * np.sqrt(n_cols)))
    return blocks.reshape(n_rows, -1)


@pytest.fixture(scope="module")
def tiny_iq(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("iq")
    f32 = make_tiny_llama(folder / "f32.gguf", n_layers=2, dim=256, n_heads=4, n_kv_heads=2, hidden=512, n_ctx=128)
    rng = np.random.default_rng(13)
    with open_gguf(f32) as g:
        tensors = []
        for t in g.tensors.values():
            data = np.asarray(g.raw(t.name))
            if t.name == "token_embd.weight":
                qtype = T.IQ4_NL
            elif t.name.startswith("blk.") and t.name.split(".")[2] in ROLES:
                layer, role = int(t.name.split(".")[1]), t.name.split(".")[2]
                qtype = IQ[(ROLES.index(role) + 2 * layer) % len(IQ)]
            else:
                tensors.append((t.name, t.qtype, t.shape, data))
                continue
            tensors.append((t.name, qtype, t.shape, random_iq(rng, qtype, t.shape[1], t.shape[0]).reshape(-1)))
        path = folder / "tiny_iq.gguf"
        write_gguf(path, dict(g.metadata), tensors)
    return path


def test_an_i_quant_model_runs_in_both_numerics(tiny_iq: Path) -> None:
    ids = list(range(5, 37))
    g, f = load_model(tiny_iq), load_model(tiny_iq, numerics="float32")
    try:
        types = {t.qtype for t in g.gguf.tensors.values()}
        assert set(IQ) <= types
        lg = prefill(g, ids, g.new_cache(128), all_logits=True, chunk_size=len(ids))
        lf = prefill(f, ids, f.new_cache(128), all_logits=True, chunk_size=len(ids))
        assert all(lin._dense is None for lin in g.net.linears().values())  # products on the blocks
        assert np.isfinite(lg).all() and not np.array_equal(lg, lf)
        assert (lg.argmax(-1) == lf.argmax(-1)).mean() >= 0.8
        np.testing.assert_allclose(lg, lf, atol=0.1 * float(np.abs(lf).max()))
        # one token at a time (the decode step's bound kernels) gives the same next-token choices
        step = prefill(g, ids[:8], g.new_cache(128), all_logits=True, chunk_size=1)
        np.testing.assert_allclose(step, lg[:8], atol=0.05 * float(np.abs(lg).max()))
    finally:
        g.close()
        f.close()
