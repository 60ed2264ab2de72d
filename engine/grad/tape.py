"""The tape and the traced array: NumPy ops on a `Var` are computed on plain values and recorded for the backward.

A `Var` is not an ndarray. NumPy dispatches ufuncs (`x + y`, `np.exp`, `x @ w`) to `Var.__array_ufunc__` and array
functions (`np.mean`, `np.where`, `np.concatenate`) to `Var.__array_function__`; each looks its op up in
engine.grad.vjps, computes the value and appends one node (the VJP closure, the parent nodes) to the tape. Methods the
graph calls (`reshape`, `transpose`, `[...]`, `[...] = v`, `copy`, `astype`) are recorded the same way. Anything that
would turn a Var into a plain array (`np.asarray`, a compiled kernel) raises NoVJP instead of losing the gradient
silently. Values are kept in the tape's dtype (float32, or float64 for finite-difference checks): a float cast in
the graph (`astype(np.float32)`, `dtype=np.float32`) keeps that dtype.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from engine.errors import LensError

Vjp = Callable[[np.ndarray], Sequence[np.ndarray | None]]  # output cotangent -> one cotangent per parent (or None)


class NoVJP(LensError):
    """An op the backward has no vector-Jacobian product for (an architecture whose backward is not built yet)."""



_OPS: list[Any] = []  # engine.grad.vjps, which registers itself here when imported (it imports this module)


def install(ops: Any) -> None:
    """Called by engine.grad.vjps at import: the table of VJPs the Var's NumPy dispatch goes through."""
    _OPS[:] = [ops]


def _ops() -> Any:
    if not _OPS:
        raise NoVJP("engine.grad.vjps is not loaded: import engine.grad.backward to trace a model")
    return _OPS[0]

class Tape:
    """The recorded ops of one traced pass, in order: per node its VJP and parent node indices."""

    def __init__(self, dtype: np.dtype | type = np.float32):
        self.dtype = np.dtype(dtype)
        self.vjps: list[Vjp | None] = []
        self.parents: list[tuple[int, ...]] = []
        self.shapes: list[tuple[int, ...]] = []

    def __len__(self) -> int:
        return len(self.vjps)

    def leaf(self, value: np.ndarray) -> Var:
        """A new input of the pass (no parents): its gradient is what backward returns for it."""
        return self.node(np.asarray(value, self.dtype).copy(), (), None)

    def node(self, value: np.ndarray, parents: Sequence[Var], vjp: Vjp | None) -> Var:
        """Record `value` computed from `parents` (Vars on this tape) with its VJP."""
        value = np.asarray(value)
        if value.dtype.kind == "f" and value.dtype != self.dtype:
            value = value.astype(self.dtype)
        for p in parents:
            if p.tape is not self:
                raise NoVJP("a traced value from another pass was mixed into this one")
        self.vjps.append(vjp)
        self.parents.append(tuple(p.idx for p in parents))
        self.shapes.append(value.shape)
        return Var(value, self, len(self.vjps) - 1)

    def backward(self, out: Var, keep: Sequence[int], seed: np.ndarray | None = None) -> dict[int, np.ndarray]:
        """Cotangents of the nodes `keep` for d out (seed: ones of out's shape): each node's VJP once, last first.

        A node's cotangent is freed once its VJP ran, unless kept: memory stays at the tape's values plus a frontier.
        """
        wanted = set(keep)
        grads: dict[int, np.ndarray] = {out.idx: np.ones(out.shape, self.dtype) if seed is None
                                        else np.asarray(seed, self.dtype)}
        kept: dict[int, np.ndarray] = {}
        for i in range(out.idx, -1, -1):
            g = grads.pop(i, None)
            if g is None:
                continue
            if i in wanted:
                kept[i] = g
            vjp = self.vjps[i]
            if vjp is None:
                continue
            for p, gp in zip(self.parents[i], vjp(g)):
                if gp is None:
                    continue
                gp = np.asarray(gp, self.dtype)
                if gp.shape != self.shapes[p]:
                    raise AssertionError(f"VJP of node {i} gave shape {gp.shape} for parent {p} of {self.shapes[p]}")
                have = grads.get(p)
                grads[p] = gp if have is None else have + gp
        return {i: kept.get(i, np.zeros(self.shapes[i], self.dtype)) for i in wanted}


def value_of(x: Any) -> Any:
    """The plain value of a Var, or x itself."""
    return x.value if isinstance(x, Var) else x


class Var:
    """A traced array: a value and its node on a tape."""

    __slots__ = ("value", "tape", "idx")
    __array_priority__ = 1000.0

    def __init__(self, value: np.ndarray, tape: Tape, idx: int):
        self.value, self.tape, self.idx = value, tape, idx

    # --- what the graph reads without computing
    shape = property(lambda self: self.value.shape)
    ndim = property(lambda self: self.value.ndim)
    dtype = property(lambda self: self.value.dtype)
    size = property(lambda self: self.value.size)
    nbytes = property(lambda self: self.value.nbytes)

    def __len__(self) -> int:
        return len(self.value)

    def __repr__(self) -> str:
        return f"Var(node {self.idx}, shape {self.shape}, {self.dtype})"

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise NoVJP("a traced value was turned into a plain array (a compiled kernel or np.asarray in the graph): "
                    "that op has no gradient yet")

    # --- NumPy's dispatch
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        vjps = _ops()

        return vjps.apply_ufunc(self.tape, ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Callable, types: Any, args: Any, kwargs: Any) -> Any:
        vjps = _ops()

        return vjps.apply_function(self.tape, func, args, kwargs)

    # --- operators: through the ufuncs, so the same VJPs serve both spellings
    def __add__(self, o: Any) -> Var: return np.add(self, o)
    def __radd__(self, o: Any) -> Var: return np.add(o, self)
    def __sub__(self, o: Any) -> Var: return np.subtract(self, o)
    def __rsub__(self, o: Any) -> Var: return np.subtract(o, self)
    def __mul__(self, o: Any) -> Var: return np.multiply(self, o)
    def __rmul__(self, o: Any) -> Var: return np.multiply(o, self)
    def __truediv__(self, o: Any) -> Var: return np.true_divide(self, o)
    def __rtruediv__(self, o: Any) -> Var: return np.true_divide(o, self)
    def __matmul__(self, o: Any) -> Var: return np.matmul(self, o)
    def __rmatmul__(self, o: Any) -> Var: return np.matmul(o, self)
    def __pow__(self, o: Any) -> Var: return np.power(self, o)
    def __neg__(self) -> Var: return np.negative(self)
    def __pos__(self) -> Var: return self
    def __abs__(self) -> Var: return np.absolute(self)
    def __gt__(self, o: Any) -> np.ndarray: return self.value > value_of(o)
    def __ge__(self, o: Any) -> np.ndarray: return self.value >= value_of(o)
    def __lt__(self, o: Any) -> np.ndarray: return self.value < value_of(o)
    def __le__(self, o: Any) -> np.ndarray: return self.value <= value_of(o)

    # --- methods the graph calls
    def reshape(self, *shape: Any, **kwargs: Any) -> Var:
        vjps = _ops()

        return vjps.reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], tuple | list) else shape)

    def transpose(self, *axes: Any) -> Var:
        vjps = _ops()

        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], tuple | list) else axes
        return vjps.transpose(self, tuple(axes) if axes else tuple(range(self.ndim))[::-1])

    @property
    def T(self) -> Var:  # noqa: N802 - ndarray's name
        return self.transpose()

    def ravel(self) -> Var:
        return self.reshape(-1)

    def __getitem__(self, index: Any) -> Var:
        vjps = _ops()

        return vjps.getitem(self, index)

    def __setitem__(self, index: Any, item: Any) -> None:
        """NumPy's in-place write, as a new node this Var now stands for (its earlier node keeps its value)."""
        vjps = _ops()

        new = vjps.setitem(self, index, item)
        self.value, self.idx = new.value, new.idx

    def copy(self, *args: Any, **kwargs: Any) -> Var:
        return self.tape.node(self.value.copy(), (self,), lambda g: (g,))

    def astype(self, dtype: Any, copy: bool = True, **kwargs: Any) -> Var | np.ndarray:
        """A float cast keeps the tape's dtype (and the gradient); any other cast leaves the tape."""
        if np.dtype(dtype).kind == "f":
            return self.copy() if copy else self
        return self.value.astype(dtype)

    def sum(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Var:
        return np.sum(self, axis=axis, keepdims=keepdims)

    def mean(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> Var:
        return np.mean(self, axis=axis, keepdims=keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> Var:
        return np.max(self, axis=axis, keepdims=keepdims)

    def detach(self) -> np.ndarray:
        """The plain value, outside the tape (a stop-gradient)."""
        return self.value
