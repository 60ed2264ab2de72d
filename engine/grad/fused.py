"""The ggml ops a traced pass records as one op each, with the VJP written once for the op: softmax, RMS norm, GELU,
SiLU and the gated units.

Spelled as NumPy ops they would put every intermediate on the tape (a tanh-approximated GELU makes eight arrays of
the FFN's width per layer); as one node each keeps only what its VJP reads (its input, or its output for the
softmax, and the norm's per-row scale), so the tape's memory is about one activation per op of the graph. The values
are the float32 reference's (engine.ops.reference): the same formulas on the same float32 inputs. A weight given as
a traced value (never the case in the block graphs) falls back to the composed NumPy ops.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.grad.tape import Var
from engine.ops import reference

G = np.ndarray
C_GELU = math.sqrt(2.0 / math.pi)
A_GELU = 0.044715


def softmax(x: Var) -> Var:
    """A softmax over the last axis (ggml_soft_max), shifted by the row maximum; its VJP reads only the weights it
    returned: w * (g - sum(g * w)). Masked scores (-inf) get weight 0 and no gradient."""
    v = x.value
    with np.errstate(invalid="ignore"):
        e = np.exp(v - np.max(v, axis=-1, keepdims=True))
    w = e / np.sum(e, axis=-1, keepdims=True)

    def back(g: G) -> tuple[G]:
        return (w * (g - np.sum(g * w, axis=-1, keepdims=True)),)
    return x.tape.node(w, (x,), back)


def rms_norm(x: Any, weight: Any, eps: float) -> Any:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis; d x = r (gw - x r^2 mean(gw x)), gw = g * weight."""
    if not isinstance(x, Var) or isinstance(weight, Var):
        return reference.rms_norm(x, weight, eps)
    v = x.value
    r = 1.0 / np.sqrt(np.mean(np.square(v), axis=-1, keepdims=True) + np.asarray(eps, v.dtype))
    w = np.asarray(weight, v.dtype)

    def back(g: G) -> tuple[G]:
        gw = g * w
        return (r * (gw - v * (r * r) * np.mean(gw * v, axis=-1, keepdims=True)),)
    return x.tape.node((v * r) * w, (x,), back)


def _gelu(v: G) -> tuple[G, G]:
    """GELU (tanh approximation, as ggml_gelu) and its derivative at v."""
    t = np.tanh(C_GELU * (v + A_GELU * v * v * v))
    y = 0.5 * v * (1.0 + t)
    dy = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * C_GELU * (1.0 + 3.0 * A_GELU * v * v)
    return y, dy


def _silu(v: G) -> tuple[G, G]:
    """SiLU x sigmoid(x) and its derivative s (1 + x (1 - s))."""
    with np.errstate(over="ignore"):
        s = 1.0 / (1.0 + np.exp(-v))
    return v * s, s * (1.0 + v * (1.0 - s))


ACTS = {"geglu": _gelu, "swiglu": _silu, "silu": _silu, "gelu": _gelu}


def activation(kind: str, x: Any) -> Any:
    """silu or gelu of x as one op, keeping only x."""
    if not isinstance(x, Var):
        return reference.gelu_tanh(x) if kind in ("gelu", "geglu") else reference.silu(x)
    fn = ACTS[kind]
    v = x.value

    def back(g: G) -> tuple[G]:
        return (g * fn(v)[1],)
    return x.tape.node(fn(v)[0], (x,), back)


def glu(kind: str, gate: Any, up: Any) -> Any:
    """act(gate) * up as one op (ggml_swiglu / ggml_geglu), keeping gate and up; any other GLU (gpt-oss's clamped
    one) or non-traced operands go through the composed ops."""
    if kind not in ("geglu", "swiglu") or not isinstance(gate, Var) or not isinstance(up, Var) \
            or gate.tape is not up.tape or gate.shape != up.shape:
        return None
    fn = ACTS[kind]
    a, u = gate.value, up.value

    def back(g: G) -> tuple[G, G]:
        y, dy = fn(a)
        return g * u * dy, g * y
    return gate.tape.node(fn(a)[0] * u, (gate, up), back)
