"""One vector-Jacobian product per NumPy op the block graphs use; the tape composes them.

Ufuncs are in `UFUNCS` (name -> fn(g, inputs, out) returning one cotangent per input), array functions in `FUNCTIONS`
(function -> fn(tape, args, kwargs) computing and recording), the array methods below them. Ops whose result is
piecewise constant (comparisons, isfinite, argsort) leave the tape: their outputs are plain arrays, so whatever they
select (a mask, the experts a router chose) is frozen as the forward took it. An op in neither table raises NoVJP
with its name. Cotangents of broadcast inputs are summed back to the input's shape (`unbroadcast`).
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from engine.grad import tape as _tape
from engine.kernels.dispatch import dequantize_weight
from engine.kernels.fallback import scratch
from engine.grad.tape import NoVJP, Tape, Var, value_of

G = np.ndarray


class Dequantized(np.ndarray):
    """A weight's float32 copy as one product dequantized it, with the way to dequantize it again (`source`, and
    `flip` for its transpose): the product's VJP keeps that and not the copy, so the tape holds the blocks (the file)
    and one pass's activations, never every weight in float32."""

    source: Callable[[], np.ndarray] | None
    flip: bool

    def __array_finalize__(self, obj: Any) -> None:
        self.source = getattr(obj, "source", None)
        self.flip = getattr(obj, "flip", False)

    @property
    def T(self) -> Dequantized:  # noqa: N802 - ndarray's name
        out = np.ndarray.transpose(self)
        out.flip = not self.flip
        return out


def dequantized(q: Any) -> Dequantized:
    """A weight's QTensor as float32, tagged with how to make it again (its blocks, by the compiled dequantizer)."""
    blocks, qtype = q.blocks, q.qtype
    w = dequantize_weight(qtype, blocks).view(Dequantized)
    shape = w.shape

    def again() -> np.ndarray:
        """Into this thread's scratch buffer (fresh pages would cost more than the dequantization): a VJP reads the
        weight at once and is done with it before the next one asks."""
        return dequantize_weight(qtype, blocks, scratch(shape[0] * shape[1]).reshape(shape))

    w.source, w.flip = again, False
    return w


def _again(source: Callable[[], np.ndarray], flip: bool) -> np.ndarray:
    w = source()
    return w.T if flip else w


def unbroadcast(g: G, shape: tuple[int, ...]) -> G:
    """g summed over the axes NumPy broadcast an input of `shape` along."""
    if g.shape == shape:
        return g
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for ax, n in enumerate(shape):
        if n == 1 and g.shape[ax] != 1:
            g = g.sum(axis=ax, keepdims=True)
    return g


def _swap(x: G) -> G:
    return np.swapaxes(x, -1, -2)


def _matmul(g: G, ins: Sequence[Any], out: G, need: Sequence[bool] = (True, True)) -> tuple[G | None, G | None]:
    a, b = ins
    if (a is not None and a.ndim == 1) or (b is not None and b.ndim == 1):
        raise NoVJP("no gradient for a matrix-vector product yet (both operands must be matrices)")
    # a weight is a constant: its (dim x n_out) cotangent would cost as much as the product and go nowhere
    return g @ _swap(b) if need[0] else None, _swap(a) @ g if need[1] else None


def _divide(g: G, ins: Sequence[Any], out: G) -> tuple[G, G]:
    a, b = ins
    return g / b, -g * out / b


def _power(g: G, ins: Sequence[Any], out: G) -> tuple[G, G | None]:
    a, b = ins
    return g * b * np.power(a, b - 1), None  # the exponent is a constant in every graph here


def _pick(first: bool) -> Callable[[G, Sequence[Any], G], tuple[G, G]]:
    def vjp(g: G, ins: Sequence[Any], out: G) -> tuple[G, G]:
        a, b = ins
        on_a = (out == a) if first else ~(out == b)  # ties: the first input takes the gradient
        return g * on_a, g * ~on_a
    return vjp


UFUNCS: dict[str, Callable[[G, Sequence[Any], G], Sequence[G | None]]] = {
    "add": lambda g, ins, out: (g, g),
    "subtract": lambda g, ins, out: (g, -g),
    "multiply": lambda g, ins, out: (None if ins[1] is None else g * ins[1], None if ins[0] is None else g * ins[0]),
    "divide": _divide,
    "negative": lambda g, ins, out: (-g,),
    "positive": lambda g, ins, out: (g,),
    "exp": lambda g, ins, out: (g * out,),
    "log": lambda g, ins, out: (g / ins[0],),
    "tanh": lambda g, ins, out: (g * (1.0 - out * out),),
    "sqrt": lambda g, ins, out: (g / (2.0 * out),),
    "square": lambda g, ins, out: (2.0 * g * ins[0],),
    "reciprocal": lambda g, ins, out: (-g * out * out,),
    "absolute": lambda g, ins, out: (g * np.sign(ins[0]),),
    "matmul": _matmul,
    "power": _power,
    "maximum": _pick(True),
    "minimum": _pick(True),
}
KEEPS_INPUTS = {"divide", "log", "square", "absolute", "power", "maximum", "minimum"}
KEEPS_OUTPUT = {"divide", "exp", "tanh", "sqrt", "reciprocal", "maximum", "minimum"}
PIECEWISE_CONSTANT = {"greater", "greater_equal", "less", "less_equal", "equal", "not_equal", "isfinite", "isnan",
                      "isinf", "sign", "floor", "ceil", "rint", "logical_and", "logical_or", "logical_not"}


def apply_ufunc(tape: Tape, ufunc: np.ufunc, method: str, inputs: Sequence[Any], kwargs: dict) -> Any:
    """A ufunc called on Vars: its value, recorded with its VJP."""
    if kwargs.get("out") is not None:
        raise NoVJP(f"no gradient for numpy.{ufunc.__name__} writing into out=")
    kwargs = {k: v for k, v in kwargs.items() if k != "dtype"}
    vals = [value_of(x) for x in inputs]
    if ufunc.__name__ in PIECEWISE_CONSTANT:
        return getattr(ufunc, method)(*vals, **kwargs)
    if method == "reduce" and ufunc.__name__ in ("add", "maximum"):
        fn = np.sum if ufunc.__name__ == "add" else np.max
        return apply_function(tape, fn, inputs, kwargs)
    vjp = UFUNCS.get(ufunc.__name__)
    if method != "__call__" or vjp is None:
        raise NoVJP(f"no gradient for numpy.{ufunc.__name__}{'' if method == '__call__' else '.' + method} yet")
    name = ufunc.__name__
    vals = [np.asarray(v, tape.dtype) if isinstance(v, float) else v for v in vals]
    out = ufunc(*vals, **kwargs)
    parents = [(i, x) for i, x in enumerate(inputs) if isinstance(x, Var)]
    shapes = [np.shape(v) for v in vals]

    need = [isinstance(x, Var) for x in inputs]
    keep = _kept_inputs(name, need)
    held = [None if not k else partial(_again, v.source, v.flip) if isinstance(v, Dequantized) and v.source is not None
            else v for v, k in zip(vals, keep)]  # a weight: how to dequantize it again, not its copy
    kept_out = out if name in KEEPS_OUTPUT else None

    def back(g: G) -> list[G | None]:
        ins = [h() if isinstance(h, partial) else h for h in held]
        gs = vjp(g, ins, kept_out, need) if vjp is _matmul else vjp(g, ins, kept_out)
        return [None if gs[i] is None else unbroadcast(np.asarray(gs[i]), shapes[i]) for i in slots]

    slots = [i for i, _ in parents]  # the closure keeps positions, never the input Vars (nor their values)
    return tape.node(out, [x for _, x in parents], back)


def _kept_inputs(name: str, need: list[bool]) -> list[bool]:
    """Which inputs a ufunc's VJP reads: a product's other factor only where this one takes a gradient; what the
    tape holds until the backward is just that (an add keeps nothing)."""
    if name in ("multiply", "matmul"):
        return [need[1], need[0]]
    return [name in KEEPS_INPUTS] * len(need)


# ---- array functions


def _axes(axis: Any, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    return tuple(a % ndim for a in (axis if isinstance(axis, tuple | list) else (axis,)))


def _expand(g: G, shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> G:
    if not keepdims:
        for a in sorted(axes):
            g = np.expand_dims(g, a)
    return np.broadcast_to(g, shape)


def _reduce(kind: str) -> Callable[[Tape, tuple, dict], Var]:
    def fn(tape: Tape, args: tuple, kwargs: dict) -> Var:
        x, axis = args[0], kwargs.get("axis", args[1] if len(args) > 1 else None)
        keepdims = bool(kwargs.get("keepdims", False))
        v = x.value
        axes = _axes(axis, v.ndim)
        if kind == "max":
            out = np.max(v, axis=axes, keepdims=keepdims)

            def back(g: G) -> tuple[G]:
                hit = v == _expand(out, v.shape, axes, keepdims)
                share = hit / np.sum(hit, axis=axes, keepdims=True)
                return (_expand(g, v.shape, axes, keepdims) * share,)
        else:
            out = np.sum(v, axis=axes, keepdims=keepdims)
            n = int(np.prod([v.shape[a] for a in axes])) if kind == "mean" else 1
            out = out / n if n != 1 else out
            shape = v.shape  # the input's shape only: a sum's VJP reads no value

            def back(g: G) -> tuple[G]:
                return (_expand(g, shape, axes, keepdims) / n,)
        return tape.node(out, (x,), back)
    return fn


def _where(tape: Tape, args: tuple, kwargs: dict) -> Var:
    cond, a, b = (value_of(args[0]), *args[1:])
    out = np.where(cond, value_of(a), value_of(b))
    parents = [(k, x) for k, x in ((0, a), (1, b)) if isinstance(x, Var)]
    slots = [(k, np.shape(x.value)) for k, x in parents]

    def back(g: G) -> list[G]:
        return [unbroadcast(np.where(cond, g, 0.0) if k == 0 else np.where(cond, 0.0, g), shape) for k, shape in slots]
    return tape.node(out, [x for _, x in parents], back)


def _join(stack: bool) -> Callable[[Tape, tuple, dict], Var]:
    def fn(tape: Tape, args: tuple, kwargs: dict) -> Var:
        seq, axis = list(args[0]), kwargs.get("axis", args[1] if len(args) > 1 else 0)
        vals = [value_of(x) for x in seq]
        out = np.stack(vals, axis=axis) if stack else np.concatenate(vals, axis=axis)
        ax = axis % out.ndim
        bounds = np.cumsum([0] + [1 if stack else v.shape[ax] for v in vals])
        parents = [(k, x) for k, x in enumerate(seq) if isinstance(x, Var)]
        slots = [k for k, _ in parents]

        def back(g: G) -> list[G]:
            parts = []
            for k in slots:
                piece = np.take(g, np.arange(bounds[k], bounds[k + 1]), axis=ax)
                parts.append(np.squeeze(piece, axis=ax) if stack else piece)
            return parts
        return tape.node(out, [x for _, x in parents], back)
    return fn


def _like(np_fn: Callable) -> Callable[[Tape, tuple, dict], np.ndarray]:
    def fn(tape: Tape, args: tuple, kwargs: dict) -> np.ndarray:  # a constant: shape and dtype only
        return np_fn(value_of(args[0]), *args[1:], **kwargs)
    return fn


def _clip(tape: Tape, args: tuple, kwargs: dict) -> Var:
    x, lo, hi = (*args, None, None)[:3]
    lo, hi = kwargs.get("a_min", lo), kwargs.get("a_max", hi)
    y = x if lo is None else np.maximum(x, lo)
    return y if hi is None else np.minimum(y, hi)


def _repeat(tape: Tape, args: tuple, kwargs: dict) -> Var:
    """np.repeat of each entry `repeats` times along an axis (an int count: what the graphs use)."""
    x, repeats = args[0], kwargs.get("repeats", args[1] if len(args) > 1 else None)
    axis = kwargs.get("axis", args[2] if len(args) > 2 else None)
    if axis is None or not isinstance(repeats, int | np.integer):
        raise NoVJP("no gradient for numpy.repeat without an axis or with per-entry counts yet")
    v = x.value
    ax, r, shape = axis % v.ndim, int(repeats), v.shape

    def back(g: G) -> tuple[G]:
        return (g.reshape(shape[:ax] + (shape[ax], r) + shape[ax + 1 :]).sum(axis=ax + 1),)
    return tape.node(np.repeat(v, r, axis=ax), (x,), back)


FUNCTIONS: dict[Callable, Callable[[Tape, tuple, dict], Any]] = {
    np.sum: _reduce("sum"), np.mean: _reduce("mean"), np.max: _reduce("max"), np.amax: _reduce("max"),
    np.where: _where, np.concatenate: _join(False), np.stack: _join(True),
    np.zeros_like: _like(np.zeros_like), np.ones_like: _like(np.ones_like), np.empty_like: _like(np.zeros_like),
    np.shape: lambda tape, args, kwargs: args[0].shape,
    np.ndim: lambda tape, args, kwargs: args[0].ndim,
    np.reshape: lambda tape, args, kwargs: reshape(args[0], args[1] if len(args) > 1 else kwargs["shape"]),
    np.transpose: lambda tape, args, kwargs: args[0].transpose(*args[1:]),
    np.swapaxes: lambda tape, args, kwargs: args[0].transpose(_swapped(args[0].ndim, args[1], args[2])),
    np.clip: _clip,
    np.repeat: _repeat,
    np.tanh: lambda tape, args, kwargs: apply_ufunc(tape, np.tanh, "__call__", args, kwargs),
}


def _swapped(ndim: int, a: int, b: int) -> tuple[int, ...]:
    axes = list(range(ndim))
    axes[a], axes[b] = axes[b], axes[a]
    return tuple(axes)


def apply_function(tape: Tape, func: Callable, args: Any, kwargs: dict) -> Any:
    """An array function called with Vars among its arguments."""
    fn = FUNCTIONS.get(func)
    if fn is None:
        raise NoVJP(f"no gradient for numpy.{func.__name__} yet")
    return fn(tape, tuple(args), dict(kwargs))


# ---- array methods


def reshape(x: Var, shape: Any) -> Var:
    old = x.value.shape
    return x.tape.node(x.value.reshape(shape), (x,), lambda g: (g.reshape(old),))


def transpose(x: Var, axes: tuple[int, ...]) -> Var:
    inverse = tuple(np.argsort(axes))
    return x.tape.node(x.value.transpose(axes), (x,), lambda g: (g.transpose(inverse),))


def _fancy(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, list | np.ndarray) for i in items)


def getitem(x: Var, index: Any) -> Var:
    index = value_of(index)
    shape, fancy = x.value.shape, _fancy(index)

    def back(g: G) -> tuple[G]:
        full = np.zeros(shape, g.dtype)
        if fancy:
            np.add.at(full, index, g)
        else:
            full[index] = g
        return (full,)
    return x.tape.node(x.value[index], (x,), back)


def setitem(x: Var, index: Any, item: Any) -> Var:
    """x with x[index] = item, as a new node (the cotangent of the overwritten entries goes nowhere)."""
    index = value_of(index)
    out = x.value.copy()
    out[index] = value_of(item)
    parents = [x] + ([item] if isinstance(item, Var) else [])
    item_shape, traced_item = np.shape(value_of(item)), len(parents) > 1

    def back(g: G) -> list[G]:
        rest = g.copy()
        rest[index] = 0.0
        return [rest] + ([unbroadcast(np.asarray(g[index]), item_shape)] if traced_item else [])
    return x.tape.node(out, parents, back)


_tape.install(sys.modules[__name__])  # the Var's NumPy dispatch goes through this module
