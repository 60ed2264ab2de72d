"""LoRA adapters in the compiled decode step (engine.runtime.decode_plan): each adapted matrix's two small products
bound once, and added to the matrix's rows right after its bound product runs.

llama.cpp's build_lora_mm computes res = W x, then for each adapter ab = lora_b (lora_a x), ab = ggml_scale(ab, scale),
res = ggml_add(res, ab); the op-by-op path does the same in NumPy (engine.tensor.Linear.with_loras). Here the product's
float32 input row x (the row the plan quantized for W) is read by lora_a as ggml-cpu reads it (quantized for lora_a's
vec_dot_type), lora_a's rows give (rank,), those are quantized for lora_b, lora_b's rows give (n_out,), and each is
scaled and added into the part's rows of W's output: a float32 product rounded, then a float32 sum (two ggml ops, never
a fused multiply-add). Adapters on one matrix add in the order they were applied, as the op-by-op path adds them.

- F32 and F16 halves (what convert_lora_to_gguf writes): one compiled call per adapter and matrix (`lora_float`), on
  the calling thread, with vec_dot's row functions; a rank under the dot's step leaves lora_b's rows all tail, which
  run for every row at once from a float32 transposed copy of lora_b (in the tail's order: element by element).
- other types: lora_a and lora_b bound as the plan binds its products (engine.kernels), four compiled calls.

The same operations on the same values give the same bits as the op-by-op path (tests hold the two to each other over
decode steps, and the op-by-op path to llama.cpp). The parallel one-row products the op-by-op path calls for these
tiny matrices start the thread pool twice per matrix; here a token costs a few microseconds per adapted matrix. The
plan is rebuilt when the adapters change (`key`), so nothing here looks at them while tokens run.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.kernels import isa
from engine.kernels.activations import HAVE_NUMBA
from engine.kernels.types import VEC_DOT_TYPE
from engine.quant.types import GGMLType
from engine.runtime.decode_bind import Inputs, Product
from engine.tensor import Linear

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]


def key(model: Any) -> tuple[tuple[int, float, float], ...]:  # noqa: ANN401
    """What the bound adapters depend on: the adapters a model holds (engine.intervene.lora.apply sets them, with the
    scale each is applied at); a plan made under other adapters is rebuilt."""
    return tuple((id(ad), float(ad.scale), float(ad.alpha)) for ad in getattr(model, "lora_adapters", None) or ())


FLOATS = (GGMLType.F32, GGMLType.F16)  # halves of these types run in one compiled call (`lora_float`)
_NONE32, _NONE16 = np.zeros((0, 0), np.float32), np.zeros((0, 0), np.uint16)  # 'not this type' for lora_float
_NONE32.flags.writeable = _NONE16.flags.writeable = False


def adapt(product: Product, x: F32) -> bool:
    """Make `product.run` also add the adapters on its parts, reading its float32 input row x (1, n_in); nothing for
    a product without adapters. False where an adapter's half has no compiled one-row product."""
    adapted = [(lin, start, stop) for lin, start, stop in product.parts if lin.loras]
    if not adapted:
        return True
    others = [a.weight.qtype for lin, _, _ in adapted for a, b, _ in lin.loras if not _floats(a, b)]
    a_in = Inputs(x.shape[1], others or [GGMLType.F32])
    halves: list[Callable[[], None]] = []
    for lin, start, stop in adapted:
        rows = product.out[0, start:stop]
        for a, b, scale in lin.loras:
            half = _float_half(a, b, scale, x[0], rows) if _floats(a, b) else _bound_half(a, b, scale, a_in, rows)
            if half is None:
                return False
            halves.append(half)
    quant = [(np.int64(vdt), a_in.bufs[vdt]) for vdt in a_in.vdts] if others else []
    base = product.run

    def run() -> None:
        base()
        for vdt, buf in quant:  # x quantized once per type the other adapters' lora_a read
            quantize_into(vdt, x, buf)
        for half in halves:
            half()

    product.run = run
    return True


def _floats(a: Linear, b: Linear) -> bool:
    return a.weight.qtype in FLOATS and b.weight.qtype in FLOATS and HAVE_NUMBA


def _rows_of(lin: Linear, qtype: GGMLType) -> np.ndarray:
    """The weight's rows as lora_float reads them (read-only, float32 or fp16 bits), or the empty 'not this type'."""
    if lin.weight.qtype != qtype:
        return _NONE32 if qtype == GGMLType.F32 else _NONE16
    w = np.ascontiguousarray(lin.weight.blocks).view(np.float32 if qtype == GGMLType.F32 else np.uint16)
    w.flags.writeable = False
    return w


def _float_half(a: Linear, b: Linear, scale: float, x: F32, rows: F32) -> Callable[[], None]:
    """F32 / F16 halves: lora_float with every argument prepared once. A rank under the dot's step (64 on AVX-512,
    32 on AVX2) leaves lora_b's rows all tail: they run from a float32 copy of lora_b transposed (fp16 values widen
    exactly), every row's tail sum at once."""
    f32, f16 = GGMLType.F32, GGMLType.F16
    step, rank = 4 * isa.lanes(), a.n_out
    bt = np.ascontiguousarray(b.weight.dequantize().T) if rank < step else _NONE32  # (rank, n_out)
    bt.flags.writeable = False
    args = (x, _rows_of(a, f32), _rows_of(a, f16), _rows_of(b, f32), _rows_of(b, f16), bt,
            np.bool_(b.weight.qtype == f16), np.float32(scale), rows, np.zeros(a.n_in, np.float32),
            np.zeros(2 * rank, np.float32), np.zeros(step, np.float32), np.zeros(b.n_out, np.float64))
    return partial(lora_float, *args)


def _bound_half(a: Linear, b: Linear, scale: float, a_in: Inputs, rows: F32) -> Callable[[], None] | None:
    """Other types: lora_a bound to the input's bytes for its type, lora_b to mid's (four compiled calls); None
    where either has no bound gemv."""
    mid = np.zeros((1, a.n_out), np.float32)
    run_a = a.product().bind(a_in.bufs[VEC_DOT_TYPE[a.weight.qtype]], mid)
    b_in = Inputs(b.n_in, [b.weight.qtype])
    b_vdt, b_buf = np.int64(b_in.vdts[0]), b_in.bufs[b_in.vdts[0]]
    ab = np.zeros((1, b.n_out), np.float32)
    run_b = b.product().bind(b_buf, ab)
    if run_a is None or run_b is None:
        return None
    s = np.float32(scale)

    def half() -> None:
        run_a()
        quantize_into(b_vdt, mid, b_buf)
        run_b()
        scale_add(rows, ab[0], s)

    return half


def warm() -> None:
    """Compile lora_float and scale_add for the argument types the step gives them (the late helper calls this on a
    first start, so that the first token with an adapter does not wait for numba)."""
    if not HAVE_NUMBA:
        return
    w32, w16 = np.zeros((2, 4), np.float32), np.zeros((2, 4), np.uint16)
    w32.flags.writeable = w16.flags.writeable = False
    y = np.zeros(4, np.float32)
    lora_float(y, w32, _NONE16, _NONE32, _NONE16, w32, np.bool_(False), np.float32(1.0), y, np.zeros(4, np.float32),
               np.zeros(4, np.float32), np.zeros(4 * isa.lanes(), np.float32), np.zeros(4, np.float64))
    scale_add(y, y, np.float32(1.0))


if HAVE_NUMBA:
    from engine.kernels.activations import f16_to_f32, f32_to_f16, njit
    from engine.kernels.floats.vec_dot import _dot_f16_row, _dot_f32_row
    from engine.runtime.decode_step import quantize_into

    @njit(cache=True)
    def scale_add(y, ab, scale):  # pragma: no cover - compiled
        """y (n,) = y + ab * scale: ggml_scale then ggml_add, each rounded to float32 (no fused multiply-add)."""
        for i in range(y.shape[0]):
            t = ab[i] * scale
            y[i] = y[i] + t

    @njit(cache=True)
    def lora_float(x, a32, a16, b32, b16, bt, b_f16, scale, y, xa, mid, acc, tail):  # pragma: no cover - compiled
        """y (n_out,) += lora_b (lora_a x) * scale for F32 / F16 halves, on the calling thread.

        Each half's weight is in a32 / b32 (float32 rows) or a16 / b16 (fp16 bits), the other empty; bt: lora_b
        transposed in float32 when the rank is under the step, else empty. The activations are ggml-cpu's (an F16
        half's input rounded to fp16, its vec_dot_type); each row is ggml_vec_dot_f32 / _f16 in the order of `acc`'s
        step (engine.kernels.floats.vec_dot), then ggml_scale and ggml_add, rounded one by one. With bt every row is
        the dot's tail alone: from +0, each product added in float (F32) or in double (F16), in element order.
        xa (n_in,), mid (2 * rank: lora_a's output, then lora_b's input) and tail (n_out,) are scratch."""
        a_f16 = a16.shape[0] > 0
        rank = mid.shape[0] // 2
        for e in range(x.shape[0]):
            xa[e] = f16_to_f32(f32_to_f16(x[e])) if a_f16 else x[e]
        for r in range(rank):
            d = _dot_f16_row(a16[r], xa, acc) if a_f16 else _dot_f32_row(a32[r], xa, acc)
            mid[rank + r] = f16_to_f32(f32_to_f16(d)) if b_f16 else d
        xb = mid[rank:]
        n = y.shape[0]
        if bt.shape[0] == 0:
            for r in range(n):
                t = (_dot_f16_row(b16[r], xb, acc) if b_f16 else _dot_f32_row(b32[r], xb, acc)) * scale
                y[r] = y[r] + t
            return
        tail[:] = 0.0
        if b_f16:
            for e in range(rank):
                for r in range(n):
                    tail[r] += np.float64(bt[e, r] * xb[e])
            for r in range(n):
                t = np.float32(tail[r]) * scale
                y[r] = y[r] + t
        else:  # float sums kept in the double scratch (a float32 value is exact there): rounded at every add
            for e in range(rank):
                for r in range(n):
                    tail[r] = np.float64(np.float32(tail[r]) + bt[e, r] * xb[e])
            for r in range(n):
                t = np.float32(tail[r]) * scale
                y[r] = y[r] + t
