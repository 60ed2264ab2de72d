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
labelled remainders). `method` ('ig', 'ixg', 'patching': input attributions and patching maps) is not built yet and is
refused.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from engine.attribute.capture import check_supported, run
from engine.attribute.direct import decompose
from engine.attribute.tokens import Token, prompt_ids, resolve_position, resolve_token
from engine.errors import SettingError

if TYPE_CHECKING:
    from engine.model import Model

METHODS = ("ig", "ixg", "patching")  # named by the CLI contract; none is built yet
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
            "components": comps,
            "layer_updates": [float(v) for v in self.layer_updates],
            "remainder": self.remainder(),
        }


def _opt(v: Any) -> int | None:
    return None if int(v) == NO_INDEX else int(v)


def check_method(method: str | None) -> None:
    """Refuse a `method` (input attributions, patching maps): none is built yet."""
    if method is None:
        return
    if method in METHODS:
        raise SettingError(f"--method {method}: not built yet (direct logit attribution is; input attributions and "
                           "patching maps come later)")
    raise SettingError(f"--method {method!r} is not one of {', '.join(METHODS)}")


def attribute(model: Model, prompt: str | Sequence[int], target: str | int, contrast: str | int | None = None,
              position: int | None = None, method: str | None = None) -> Attribution:
    """Direct logit attribution of `target` (minus `contrast`) at `position` (default: the last) of the prompt (a text
    or token ids); target and contrast are token texts or '#id' strings or ids (engine.attribute.tokens)."""
    check_method(method)
    check_supported(model)
    tgt = resolve_token(model.tokenizer, target, "target")
    con = None if contrast is None else resolve_token(model.tokenizer, contrast, "contrast")
    if con is not None and con.id == tgt.id:
        raise SettingError(f"the contrast is the target ({tgt.text!r}, #{tgt.id}): their difference is 0 by definition")
    ids = prompt_ids(model, prompt)
    p = resolve_position(position, len(ids))
    cap = run(model, ids[: p + 1])  # causal: the tokens after p change nothing at p
    d = decompose(model, cap, tgt.id, None if con is None else con.id)
    return Attribution(
        tokens=tuple(ids), position=p, target=tgt, contrast=con, logit_diff=d.logit_diff,
        kinds=np.array([part.kind for part in d.parts]),
        layers=np.array([NO_INDEX if part.layer is None else part.layer for part in d.parts], np.int32),
        indices=np.array([NO_INDEX if part.index is None else part.index for part in d.parts], np.int32),
        values=d.values, layer_updates=d.layer_updates, numerics=model.numerics,
        softcap=getattr(model.args, "final_softcap", None))
