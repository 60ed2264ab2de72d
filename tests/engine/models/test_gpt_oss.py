"""gpt-oss: each of its features moves llama.cpp's answer, and a broken gpt-oss file is refused by name.

test_arch_logits holds the gpt-oss test model (tools/make_arch_models.py) to llama.cpp's logits in F16, Q8_0, Q4_K_M,
IQ4_XS and MXFP4_MOE (ggml numerics: to the bit). Here each feature the openai-moe graph has (the attention sinks,
the sliding window, the clamp of swiglu_oai, every bias, the SOFTMAX_WEIGHT gating) is left out in turn: our
logits then move away from llama.cpp's by far more than rounding, so test_arch_logits would see any of them missing.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from engine.errors import ModelFormatError
from engine.gguf import write_gguf
from engine.model import load_model
from engine.ops import ggml as ggml_ops
from tests.engine.models.arch_cases import model_file, our_logits, reference, stats
from tools.make_arch_models import build

CORRECT_KLD_MAX = 1e-9  # ggml numerics with every feature: llama.cpp's logits
MOVED_KLD_MEAN = 1e-3  # one feature left out: the mean KLD to llama.cpp's answer is at least this


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpt_oss")


def _layers(change: Callable[[Any], None]) -> Callable[[Any], None]:
    return lambda net: [change(layer) for layer in net.layers]


def _no_sinks(layer: Any) -> None:
    layer.sinks = None


def _no_window(net: Any) -> None:
    net.specs = [replace(s, window=None) for s in net.specs]


def _set(attr: str, value: Any) -> Callable[[Any], None]:
    return _layers(lambda layer: setattr(layer.ffn, attr, value))


ABLATIONS: dict[str, Callable[[Any], None]] = {
    "no-sinks": _layers(_no_sinks),
    "no-window": _no_window,
    "no-qkv-biases": _layers(lambda layer: setattr(layer, "biases", None)),
    "no-output-bias": _layers(lambda layer: setattr(layer, "wo_bias", None)),
    "no-router-bias": _set("router_bias", None),
    "no-up-bias": _set("up_bias", None),
    "no-gate-bias": _set("gate_bias", None),
    "no-down-bias": _set("down_bias", None),
    "softmax-over-all-experts": _set("gating", "softmax"),
}


@pytest.mark.parametrize("case", [*ABLATIONS, "no-clamp"])
def test_each_feature_moves_llama_cpps_answer(folder: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    ref = reference("gpt_oss", "F16")
    path = model_file(folder, "gpt_oss", "F16")
    exact = stats(ref, our_logits(path, ref.ids, "ggml"))
    if case == "no-clamp":  # swiglu_oai without its limit: min(g, inf), clamp(u, -inf, inf)
        real = ggml_ops.swiglu_oai
        monkeypatch.setattr(ggml_ops, "swiglu_oai", lambda g, u: real(g, u, limit=np.inf))
        moved = stats(ref, our_logits(path, ref.ids, "ggml"))
    else:
        moved = stats(ref, our_logits(path, ref.ids, "ggml", ABLATIONS[case]))
    print(case, exact, moved)
    assert exact["kld_max"] <= CORRECT_KLD_MAX
    assert moved["kld_mean"] >= MOVED_KLD_MEAN


# ---- bad files: each refused with the field named


def _variant(folder: Path, tag: str, md_change: dict[str, Any] | None = None,
             tensor_change: Callable[[list], list] | None = None) -> Path:
    md, ts = build("gpt_oss")
    for k, v in (md_change or {}).items():
        md.pop(k, None) if v is None else md.__setitem__(k, v)
    if tensor_change is not None:
        ts = tensor_change(ts)
    path = folder / f"gpt_oss-{tag}.gguf"
    write_gguf(path, md, ts)
    return path


def _without(name: str) -> Callable[[list], list]:
    return lambda ts: [x for x in ts if x[0] != name]


def _resized(name: str, shape: tuple[int, ...]) -> Callable[[list], list]:
    return lambda ts: [(n, t, shape, np.zeros(tuple(reversed(shape)), np.float32)) if n == name else (n, t, s, a)
                       for n, t, s, a in ts]


BAD = {
    "no-sinks": (None, _without("blk.1.attn_sinks.weight"), r"blk\.1\.attn_sinks\.weight.*missing"),
    "sinks-width": (None, _resized("blk.0.attn_sinks.weight", (4,)), r"blk\.0\.attn_sinks\.weight.*expected 8, got 4"),
    "no-output-bias": (None, _without("blk.0.attn_output.bias"), r"blk\.0\.attn_output\.bias.*missing"),
    "no-router-bias": (None, _without("blk.0.ffn_gate_inp.bias"), r"blk\.0\.ffn_gate_inp\.bias.*missing"),
    "expert-bias-count": (None, _resized("blk.1.ffn_down_exps.bias", (256, 7)),
                          r"blk\.1\.ffn_down_exps\.bias.*expected 256x8, got 256x7"),
    "no-head": (None, _without("output.weight"), r"output\.weight.*missing"),
    "no-window": ({"gpt-oss.attention.sliding_window": None}, None, r"gpt-oss\.attention\.sliding_window.*missing"),
    "no-post-attention-norm": (None, _without("blk.0.post_attention_norm.weight"),
                               r"blk\.0\.post_attention_norm\.weight.*missing"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_broken_gpt_oss_files_are_refused_by_name(folder: Path, case: str) -> None:
    md_change, tensor_change, pattern = BAD[case]
    with pytest.raises(ModelFormatError, match=pattern):
        load_model(_variant(folder, case, md_change, tensor_change)).close()


@pytest.mark.parametrize("numerics", ["ggml", "float32"])
def test_an_mxfp4_block_that_makes_infinities_is_refused_by_name(folder: Path, numerics: str) -> None:
    """Exponent byte 255 with a code of 12: 12 * 2^127 overflows. The expert is refused the first time a token is
    routed to it (a scan at load would read every expert), at load where the warm-up pass routes one; its tensor and
    block are named."""
    from engine.gguf.reader import open_gguf
    from engine.quant.mxfp4 import BLOCK_BYTES

    path = folder / f"gpt_oss-inf-{numerics}.gguf"
    path.write_bytes(model_file(folder, "gpt_oss", "MXFP4_MOE").read_bytes())
    g = open_gguf(path)
    info = g.tensors["blk.0.ffn_up_exps.weight"]
    per_expert = info.nbytes // 8
    g.close()
    data = bytearray(path.read_bytes())
    for e in range(8):  # every expert's first block: whichever the router picks is damaged
        at = info.offset + e * per_expert
        data[at] = 255
        data[at + 1] = 0x77  # codes 7 and 7: 12 * 2^127
    assert BLOCK_BYTES == 17
    path.write_bytes(bytes(data))
    loaded = []
    with pytest.raises(ModelFormatError, match=r"blk\.0\.ffn_up_exps\.weight\[\d\].*block 0 has exponent byte 255"):
        loaded.append(load_model(path, numerics=numerics))  # ggml numerics' warm-up pass routes a token already
        loaded[0].net.forward([5, 6, 7], loaded[0].new_cache(16))
    for model in loaded:
        model.close()
