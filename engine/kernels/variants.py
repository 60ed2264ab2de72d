"""Compiled copies of one kernel with some of its globals fixed, so that each copy holds only the code it runs.

numba folds a branch on a global constant before it compiles (its dead-branch pruning reads globals as
constants), but not a branch on an argument, even a literal one. A kernel written for several weight types or
both ISA orders behind an argument therefore compiles every type's code at once, seconds each at a first start.
A copy whose global (`KIND`, `W8`) is a constant compiles one type's code only; each copy has its own name
(`<name>_<suffix>`) and so its own entries in numba's on-disk cache, and copies are made when first asked for,
so a model compiles the copies of the types it holds and no others.

  specialise(py_func, suffix, scope, **njit_options)   one copy, the globals in `scope` replaced
  lane_variants(py_func, **njit_options)               {False: AVX-512 order, True: AVX2 order} (global W8)
  per_kind(kinds)(build)                               a lazily filled {type id: copy} made by build(kind)
  serial_until_late(kernel)                            a parallel kernel, or its serial copy before the late ones
  early(kernel) / serial_twin(kernel)                  the same choice at a call / the serial copy itself
  by_lane_order(avx2, avx512)                          f(*args, w8) in compiled code, one side typed for a literal w8
"""
from __future__ import annotations

import functools
import types
from collections.abc import Callable, Mapping
from typing import Any

from engine.kernels import precompile
from engine.kernels.activations import njit


COPIES: set[tuple[str, int, str]] = set()  # (file, first line, name) of every copy's code, as cProfile keys it:
# a copy shares py_func's code object, so a profile names its calls after py_func (benchmarks/decode_overhead.py)


def specialise(py_func: Callable[..., Any], suffix: str, scope: Mapping[str, Any], **options: Any) -> Any:
    """A numba dispatcher (njit with `options`) of a copy of the plain function py_func whose module globals
    named in `scope` hold the given values (constants, or other copies it calls), named `<name>_<suffix>`.
    The module must be fully imported before the copy is made: its globals are read then."""
    code = py_func.__code__
    COPIES.add((code.co_filename, code.co_firstlineno, code.co_name))
    glob = dict(py_func.__globals__)
    glob.update(scope)
    fn = types.FunctionType(py_func.__code__, glob, f"{py_func.__name__}_{suffix}", py_func.__defaults__,
                            py_func.__closure__)
    fn.__qualname__ = f"{py_func.__qualname__}_{suffix}"
    fn.__module__ = py_func.__module__
    fn.__doc__ = py_func.__doc__
    return njit(**options)(fn)


def lane_variants(py_func: Callable[..., Any], tag: str = "", **options: Any) -> dict[bool, Any]:
    """{False: the AVX-512 build's order, True: the AVX2 build's}: two compiled copies of py_func, whose global W8 is
    the constant False or True (engine.kernels.isa), `<name>_avx512` and `<name>_avx2` (`<name>_<tag>_avx512` ...
    with a tag: copies with other options, a serial one beside a parallel one, need names of their own, or numba's
    cache would hand one the other's code)."""
    pre = f"{tag}_" if tag else ""
    return {w8: specialise(py_func, pre + suffix, {"W8": w8}, **options) for w8, suffix in ((False, "avx512"),
                                                                                             (True, "avx2"))}


def by_lane_order(avx2: Any, avx512: Any) -> Callable[..., Any]:
    """f(*args, w8) = avx2(*args) if w8 else avx512(*args), for compiled code that passes w8 on (a helper of both
    ISA orders, called from a lane_variants copy with its W8). Where w8 is typed as a literal (a constant argument,
    or a copy's W8) only that side is typed and so compiled: as a plain argument, `a if w8 else b` would compile
    both (on an AVX2 host, AVX-512's reduce16 and v_expf: 2.6 s of a first start's dry pass). Called from Python,
    it runs the chosen dispatcher."""
    def pick(*args: Any) -> Any:
        return (avx2 if args[-1] else avx512)(*args[:-1])

    try:
        from numba import types as nbtypes  # noqa: PLC0415 - kept out of this module's import (numba-free users)
        from numba.extending import overload  # noqa: PLC0415
    except ImportError:  # no numba: the NumPy paths never call it compiled
        return pick

    @overload(pick, prefer_literal=True, jit_options={"forceinline": True})
    def _typed(*args):  # noqa: ANN002, ANN202 - numba matches this signature to the lambdas' (no annotations)
        w8 = args[-1]
        if isinstance(w8, nbtypes.BooleanLiteral):
            side = avx2 if w8.literal_value else avx512
            return lambda *args: side(*args[:-1])
        return lambda *args: avx2(*args[:-1]) if args[-1] else avx512(*args[:-1])

    pick.__name__ = f"{avx2.__name__}_or_{avx512.__name__}"
    return pick


_TWINS: dict[int, tuple[Any, Any]] = {}  # id(parallel kernel) -> (kernel, its serial twin)
_TWIN_OPTIONS = ("error_model", "fastmath", "boundscheck", "nogil")


def serial_twin(kernel: Any) -> Any:
    """The serial copy of a parallel numba kernel (`<name>_serial`: its options but `parallel`, made once and cached
    on disk like the kernel); anything else (a plain dispatcher, a Python function) is returned as it is. The same
    bits on the calling thread: a prange loop runs as a range."""
    options = getattr(kernel, "targetoptions", None)
    if not options or not options.get("parallel"):
        return kernel
    held = _TWINS.get(id(kernel))
    if held is None or held[0] is not kernel:
        keep = {k: options[k] for k in _TWIN_OPTIONS if options.get(k) is not None}
        held = _TWINS[id(kernel)] = (kernel, specialise(kernel.py_func, "serial", {}, cache=True, **keep))
    return held[1]


def early(kernel: Any) -> Any:
    """`kernel` once the late kernels may run (engine.kernels.precompile), its serial twin before: on a first start
    the product helpers compile the twins (numba's parallel lowering is half of a product kernel's compile: Q4_K's
    and Q6_K's kernels took 15.7 s parallel, 8.1 s serial on an AMD EPYC), the late helper the parallel kernels."""
    return kernel if precompile.late_ready() else serial_twin(kernel)


def serial_until_late(kernel: Any) -> Callable[..., Any]:
    """A callable running the parallel compiled `kernel` once the late kernels may run (engine.kernels.precompile),
    and before that its serial twin (the same bits on the calling thread; numba's parallel loop costs more to
    compile than the rest of a small kernel, and a first start's first prompt is short)."""
    def run(*args: Any) -> Any:
        return early(kernel)(*args)

    run.__name__, run.__doc__ = kernel.__name__, kernel.__doc__
    return run


class PerKind(Mapping[int, Any]):
    """{type id: compiled copy}, each made by `build(kind)` the first time it is asked for (and kept)."""

    def __init__(self, build: Callable[[int], Any], kinds: tuple[int, ...]):
        self._build, self._kinds = functools.cache(build), tuple(kinds)

    def __getitem__(self, kind: int) -> Any:
        if int(kind) not in self._kinds:
            raise KeyError(kind)
        return self._build(int(kind))

    def __iter__(self):  # noqa: ANN204 - Mapping's protocol
        return iter(self._kinds)

    def __len__(self) -> int:
        return len(self._kinds)


def per_kind(kinds: tuple[int, ...]) -> Callable[[Callable[[int], Any]], PerKind]:
    """Decorator: `build(kind)` becomes a PerKind over these type ids."""
    return lambda build: PerKind(build, kinds)
