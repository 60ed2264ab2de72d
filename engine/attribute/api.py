"""`attribute(model, prompt, target, contrast=None, position=None)`: why the model gives this token (rather than that
one) at a position, as named arrays that sum to the logit (difference), and the same as one JSON object.

    from engine.model import load_model
    from engine.attribute.api import attribute

    model = load_model("smollm2-135m-instruct")
    a = attribute(model, "The capital of France is", " Paris", contrast=" London")
    a.logit_diff, a.values.sum()          # equal (float64 rounding)
    a.top(5)                              # the five parts that push hardest, either way
    a.to_json()                           # what `gguf-lens attribute ... --json` prints

The decomposition is engine.attribute.direct's (direct logit attribution on the run's own activations, exact with
labelled remainders). `method` adds gradient attributions (engine.grad's backward of the same graph):
'ixg' / 'ig' fill `inputs` (engine.attribute.inputs: input x gradient, integrated gradients with its completeness
error), 'patching' fills `patching` (engine.attribute.attribution_patching: every head's and position's estimated
patching effect for the pair prompt / `corrupt`, checked against real activation patching of the heads).

    a = attribute(model, "The capital of France is", " Paris", contrast=" London", method="ig")
    a.inputs.values, a.inputs.completeness_error
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from engine.attribute.attribution_patching import PatchingEstimate, attribution_patching
from engine.attribute.capture import check_supported, run
from engine.attribute.direct import decompose
from engine.attribute.inputs import (IG_STEPS, Cancel, InputAttribution, Progress, input_x_gradient,
                                     integrated_gradients, stop_if)
from engine.attribute.seq2seq import decompose_seq2seq, run_seq2seq
from engine.attribute.tokens import Token, decoder_ids, prompt_ids, resolve_position, resolve_token
from engine.errors import SettingError
from engine.grad.backward import check_supported as check_gradients

if TYPE_CHECKING:
    from engine.model import Model

METHODS = ("ig", "ixg", "patching")  # named by the CLI contract
NO_INDEX = -1  # `layers` / `indices` where JSON says null (the embedding's layer, a whole block's index)


@dataclass(frozen=True)
class Attribution:
    """One position's logit (difference) split into parts; the arrays are aligned, one entry per part."""

    tokens: tuple[int, ...]  # the prompt's ids
    position: int  # whose next-token logits are attributed
    target: Token
    contrast: Token | None
    logit_diff: float  # the run's logit of target minus contrast's (or target's alone), before any soft-cap
    kinds: npt.NDArray[np.str_]  # embed head ffn expert shared_expert bias control per_layer_input remainder
    layers: npt.NDArray[np.int32]  # the block (NO_INDEX: the embedding, the output head's remainder)
    indices: npt.NDArray[np.int32]  # the head or expert (NO_INDEX: a whole part)
    values: npt.NDArray[np.float64]  # each part's share of logit_diff; they sum to it
    layer_updates: npt.NDArray[np.float64]  # (n_layers,) each block's recorded residual update along the direction
    numerics: str  # 'ggml' or 'float32': the run's
    softcap: float | None  # the final soft-cap the logits pass through after (None: none)
    token_texts: tuple[str, ...] = ()  # the prompt's tokens as text (for the input attributions)
    inputs: InputAttribution | None = None  # method 'ixg' / 'ig': per prompt token up to `position`
    patching: PatchingEstimate | None = None  # method 'patching': the estimated maps and their check
    decoder_tokens: tuple[int, ...] = ()  # an encoder-decoder's decoder ids (its start token first); `tokens` are
    # then the encoder's, `position` a decoder position, and token_texts / inputs the encoder's tokens then these

    def top(self, n: int = 10) -> list[tuple[str, int | None, int | None, float]]:
        """The n parts with the largest |value| (remainders left out), largest first."""
        keep = np.flatnonzero(self.kinds != "remainder")
        order = keep[np.argsort(-np.abs(self.values[keep]), kind="stable")][:n]
        return [(str(self.kinds[i]), _opt(self.layers[i]), _opt(self.indices[i]), float(self.values[i])) for i in order]

    def remainder(self) -> float:
        """The sum of the remainder parts: what the linear parts leave to rounding and quantization."""
        return float(np.sum(self.values[self.kinds == "remainder"]))

    def to_json(self) -> dict[str, Any]:
        """The object `gguf-lens attribute --json` prints: target, contrast, position, logit_diff, components."""
        comps = [{"kind": str(k), "layer": _opt(layer), "index": _opt(i), "value": float(v)}
                 for k, layer, i, v in zip(self.kinds, self.layers, self.indices, self.values)]
        return {
            "target": {"id": self.target.id, "text": self.target.text},
            "contrast": None if self.contrast is None else {"id": self.contrast.id, "text": self.contrast.text},
            "position": self.position,
            "logit_diff": self.logit_diff,
            "pre_softcap": self.softcap is not None,
            "numerics": self.numerics,
            "n_tokens": len(self.tokens),
            **({"decoder_tokens": list(self.decoder_tokens)} if self.decoder_tokens else {}),
            "components": comps,
            "layer_updates": [float(v) for v in self.layer_updates],
            "remainder": self.remainder(),
            **({} if self.inputs is None else {"inputs": self.inputs.to_json(self.token_texts)}),
            **({} if self.patching is None else {"patching": self.patching.to_json()}),
        }


def _opt(v: Any) -> int | None:
    return None if int(v) == NO_INDEX else int(v)


def _target_and_contrast(model: Model, target: str | int, contrast: str | int | None) -> tuple[Token, Token | None]:
    tgt = resolve_token(model.tokenizer, target, "target")
    con = None if contrast is None else resolve_token(model.tokenizer, contrast, "contrast")
    if con is not None and con.id == tgt.id:
        raise SettingError(f"the contrast is the target ({tgt.text!r}, #{tgt.id}): their difference is 0 by definition")
    return tgt, con


def _attribute_seq2seq(model: Model, prompt: str | Sequence[int], target: str | int, contrast: str | int | None,
                       position: int | None, method: str | None, steps: int, rule: str, cancel: Cancel | None,
                       progress: Progress | None, decoder: str | Sequence[int] | None) -> Attribution:
    """`attribute` on an encoder-decoder (T5): the prompt is the encoder's input, `decoder` the decoder's tokens
    after its start token (a text, or ids), `position` a decoder position (default: the last); the parts are
    engine.attribute.seq2seq's (self- and cross-attention heads, FFNs). Attribution patching needs hook points, which
    the encoder-decoder graph does not have: refused."""
    if model.backend.is_device:
        raise SettingError("attribution runs on the CPU path only: load the model with --backend numpy")
    if method == "patching":
        raise SettingError(f"attribution patching is not available for {model.arch} (encoder-decoder) models: it "
                           "patches hook points, which their graph does not have; --method ixg or ig work")
    tgt, con = _target_and_contrast(model, target, contrast)
    enc = prompt_ids(model, prompt)
    dec = [model.net.decoder_start_token, *decoder_ids(model, decoder)]
    p = resolve_position(position, len(dec))
    upto, con_id = dec[: p + 1], None if con is None else con.id
    d = decompose_seq2seq(model, run_seq2seq(model, enc, upto), tgt.id, con_id)
    inputs = None
    if method is not None:
        stop_if(cancel)
    if method == "ixg":
        inputs = input_x_gradient(model, enc, tgt.id, con_id, decoder=upto)
    elif method == "ig":
        inputs = integrated_gradients(model, enc, tgt.id, con_id, steps, rule, cancel=cancel, progress=progress,
                                      decoder=upto)
    return Attribution(
        tokens=tuple(enc), position=p, target=tgt, contrast=con, logit_diff=d.logit_diff,
        kinds=np.array([part.kind for part in d.parts]),
        layers=np.array([NO_INDEX if part.layer is None else part.layer for part in d.parts], np.int32),
        indices=np.array([NO_INDEX if part.index is None else part.index for part in d.parts], np.int32),
        values=d.values, layer_updates=d.layer_updates, numerics=model.numerics, softcap=None,
        token_texts=tuple(model.tokenizer.token_text(i) for i in [*enc, *upto]), inputs=inputs,
        decoder_tokens=tuple(dec))


def check_method(method: str | None, corrupt: str | Sequence[int] | None = None) -> None:
    """Refuse a `method` that is not one of METHODS, patching without a corrupted prompt, or one given without it."""
    if method is not None and method not in METHODS:
        raise SettingError(f"--method {method!r} is not one of {', '.join(METHODS)}")
    if method == "patching" and corrupt is None:
        raise SettingError("--method patching needs --corrupt TEXT: the corrupted prompt (as many tokens as the "
                           "prompt)")
    if method != "patching" and corrupt is not None:
        raise SettingError("--corrupt is the corrupted prompt of --method patching: give --method patching")


def attribute(model: Model, prompt: str | Sequence[int], target: str | int, contrast: str | int | None = None,
              position: int | None = None, method: str | None = None, corrupt: str | Sequence[int] | None = None,
              steps: int = IG_STEPS, rule: str = "uniform", cancel: Cancel | None = None,
              progress: Progress | None = None, decoder: str | Sequence[int] | None = None) -> Attribution:
    """Direct logit attribution of `target` (minus `contrast`) at `position` (default: the last) of the prompt (a text
    or token ids); target and contrast are token texts or '#id' strings or ids (engine.attribute.tokens). `method`:
    'ixg' / 'ig' (`steps` points, `rule` 'uniform' or 'log') add input attributions, 'patching' attribution patching
    of the pair prompt / `corrupt` (the wrong token: `contrast`, else the corrupted run's top token). `cancel()` is
    asked between the method's passes (True: engine.attribute.inputs.AttributionCancelled), `progress(done, total)`
    told of them (integrated gradients' steps, attribution patching's gradient and real-patching runs)."""
    check_method(method, corrupt)
    if getattr(model.net, "is_encoder_decoder", False):
        return _attribute_seq2seq(model, prompt, target, contrast, position, method, steps, rule, cancel, progress,
                                  decoder)
    if decoder is not None:
        raise SettingError(f"--decoder is the decoder's text of an encoder-decoder model; {model.arch} reads one "
                           "sequence: give it all as the prompt")
    check_supported(model)
    if method is not None:
        check_gradients(model)
    tgt, con = _target_and_contrast(model, target, contrast)
    ids = prompt_ids(model, prompt)
    p = resolve_position(position, len(ids))
    bad_ids = None if corrupt is None else prompt_ids(model, corrupt)
    if bad_ids is not None and len(bad_ids) != len(ids):
        raise SettingError(f"the prompt is {len(ids)} tokens, the corrupted one {len(bad_ids)}: attribution patching "
                           "needs prompts of the same length")
    cap = run(model, ids[: p + 1])  # causal: the tokens after p change nothing at p
    d = decompose(model, cap, tgt.id, None if con is None else con.id)
    upto, con_id = ids[: p + 1], None if con is None else con.id
    inputs = patching = None
    if method is not None:
        stop_if(cancel)
    if method == "ixg":
        inputs = input_x_gradient(model, upto, tgt.id, con_id)
    elif method == "ig":
        inputs = integrated_gradients(model, upto, tgt.id, con_id, steps, rule, cancel=cancel, progress=progress)
    elif method == "patching":
        patching = attribution_patching(model, upto, bad_ids[: p + 1], tgt.id, con_id, cancel=cancel,
                                        progress=progress)
    return Attribution(
        tokens=tuple(ids), position=p, target=tgt, contrast=con, logit_diff=d.logit_diff,
        kinds=np.array([part.kind for part in d.parts]),
        layers=np.array([NO_INDEX if part.layer is None else part.layer for part in d.parts], np.int32),
        indices=np.array([NO_INDEX if part.index is None else part.index for part in d.parts], np.int32),
        values=d.values, layer_updates=d.layer_updates, numerics=model.numerics,
        softcap=getattr(model.args, "final_softcap", None),
        token_texts=tuple(model.tokenizer.token_text(i) for i in upto), inputs=inputs, patching=patching)
