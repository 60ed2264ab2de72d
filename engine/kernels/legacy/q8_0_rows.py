"""One-row Q8_0 products on the GGUF blocks as ggml_vec_dot_q8_0_q8_0 runs them on AVX2 (ggml-cpu/arch/x86/quants.c),
for a CPU without AVX512-VNNI (there q8_0_x16 serves).

Per block: d = fp16(d_w) * fp16(d_x); the 32 weight and activation bytes meet in mul_sum_i8_pairs_float (|w| by
vpsignb, the activation signed by the weight, vpmaddubsw, vpmaddwd with ones: lane k sums bytes 4k..4k+3), converted
to float; acc = fma(d, lanes, acc) on eight lanes. The row's value is hsum_float_8(acc): ((a0 + a4) + (a2 + a6)) +
((a1 + a5) + (a3 + a7)). This is ggml's own sequence, so its bits, vpsignb's wrap of a -128 weight included (the
byte-plane kernels leave that case out: ggml's quantizers make -128 only in non-finite rows).

Read straight from the GGUF blocks, a Q8_0 weight needs no second copy for decode steps (the byte planes the other
legacy types keep), and the instructions per block are ggml's, where the planes' float lanes spend three times more.

The four rows a loop carries are a quarter of a task apart (four streams, each read in order), not neighbours: four
neighbouring short rows (Gemma 3's 640-column head, 680 bytes a row) interleave their blocks inside one or two pages
and the prefetchers read them at half speed. On the AMD EPYC (Zen 4) host, numba targeting Haswell, 2 threads:
262,144 x 640 19 -> 37 GB/s, 40,896 x 4,096 32 -> 38 GB/s (the host's read bandwidth 35-66 GB/s between runs).

  gemv_q8_0_rows(blocks, xq, out)    out[r] = vec_dot of row r (nb * 34 bytes) with the Q8_0 row xq (nb * 34,)
"""
from __future__ import annotations

from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels.kquant import dot as kquant_dot
from engine.kernels.simd import F32, I16, I64, Ops, byte_ptr, call_intrinsic, half_to_float, load, prefetch, vec

_V32 = vec(ir.IntType(8), 32)
_ONES = ir.Constant(vec(I16, 16), [ir.Constant(I16, 1)] * 16)


ROWS = 4  # rows a loop carries at once: four independent fma chains (one per row, each in ggml's order)
TASK_BYTES = 3 << 20  # weight bytes of one parallel task (at most; at least 8 tasks a product where it has the rows)
AHEAD_ROWS = 4  # each stream prefetches the block this many rows on


def _rows(context, b, pws, nb, px, ahead=None):
    """ggml_vec_dot_q8_0_q8_0 (AVX2) of the rows at pws with the Q8_0 row at px: one fma chain per row, in ggml's
    order; the rows side by side so that one row's fma latency does not stall the loop, the activation's bytes and
    scale read once for all of them. `ahead` (bytes): each block also prefetches the one that far on in its stream
    (the hardware prefetcher alone read a large weight at 8 GB/s a core, 15 GB/s on two, where the bandwidth is 28:
    the Gemma 3 output head 12.1 -> 6.4 ms, numba targeting Haswell)."""
    ops = Ops(context, b)
    f8 = vec(F32, 8)
    accs = [cgutils.alloca_once_value(b, ir.Constant(f8, None)) for _ in pws]
    with cgutils.for_range(b, nb) as loop:
        at = b.mul(loop.index, ir.Constant(I64, 34))
        x = b.gep(px, [at])
        dx = half_to_float(context, b, load(b, x, I16))
        qx = load(b, x, _V32, 2)
        for pw, acc in zip(pws, accs):
            w = b.gep(pw, [at])
            if ahead is not None:
                prefetch(b, b.gep(w, [ahead]))
            d = b.fmul(half_to_float(context, b, load(b, w, I16)), dx)
            qw = load(b, w, _V32, 2)
            lanes = b.sitofp(ops.madd(ops.maddubs(ops.sign(qw, qw), ops.sign(qx, qw)), _ONES), f8)
            b.store(call_intrinsic(b, "llvm.fma.v8f32", f8, [kquant_dot._splat(b, d, 8), lanes, b.load(acc)]), acc)
    return [kquant_dot._hsum8(b, b.load(acc)) for acc in accs]


@intrinsic
def dot_q8_0_row(typingctx, w, wo, nb, x, xo):
    """ggml_vec_dot_q8_0_q8_0 (AVX2) of the row at byte wo of w with the Q8_0 row at byte xo of x, nb blocks."""
    ints = (wo, nb, xo)
    if not (isinstance(w, types.Array) and isinstance(x, types.Array) and all(isinstance(v, types.Integer)
                                                                               for v in ints)):
        return None

    def codegen(context, builder, signature, args):
        w_, wo_, nb_, x_, xo_ = args
        pw = byte_ptr(context, builder, signature.args[0], w_, wo_)
        px = byte_ptr(context, builder, signature.args[3], x_, xo_)
        nb64 = nb_ if nb_.type == I64 else builder.sext(nb_, I64)
        return _rows(context, builder, [pw], nb64, px)[0]

    return types.float32(w, wo, nb, x, xo), codegen


@intrinsic
def dot_q8_0_rows4(typingctx, w, wo, rs, nb, x, xo, out, oo, os, ahead):
    """dot_q8_0_row of the ROWS rows at bytes wo, wo + rs, ... of w, stored as float32 at bytes oo, oo + os, ... of
    out; each block also prefetches the one `ahead` bytes on in its row's stream."""
    ints = (wo, rs, nb, xo, oo, os, ahead)
    if not (isinstance(w, types.Array) and isinstance(x, types.Array) and isinstance(out, types.Array)
            and all(isinstance(v, types.Integer) for v in ints)):
        return None

    def codegen(context, builder, signature, args):
        w_, wo_, rs_, nb_, x_, xo_, out_, oo_, os_, ahead_ = args
        i64 = lambda v: v if v.type == I64 else builder.sext(v, I64)  # noqa: E731
        pw = byte_ptr(context, builder, signature.args[0], w_, wo_)
        pws = [builder.gep(pw, [builder.mul(ir.Constant(I64, r), i64(rs_))]) for r in range(ROWS)]
        px = byte_ptr(context, builder, signature.args[4], x_, xo_)
        po = byte_ptr(context, builder, signature.args[6], out_, oo_)
        for r, value in enumerate(_rows(context, builder, pws, i64(nb_), px, i64(ahead_))):
            at = builder.gep(po, [builder.mul(ir.Constant(I64, r), i64(os_))])
            builder.store(value, builder.bitcast(at, F32.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(w, wo, rs, nb, x, xo, out, oo, os, ahead), codegen


@njit(cache=True, parallel=True, error_model="numpy")
def gemv_q8_0_rows(blocks, xq, out):
    """See the module docstring: blocks (n_rows, nb * 34) uint8 with contiguous rows, xq (nb * 34,), out (n_rows,)."""
    if blocks.ndim != 2 or (blocks.size and blocks.strides[1] != 1) or blocks.shape[1] % 34:
        raise ValueError("blocks must be (n_rows, nb * 34) Q8_0 rows with contiguous bytes")
    nb = blocks.shape[1] // 34
    if xq.ndim != 1 or xq.shape[0] != nb * 34 or (xq.size and xq.strides[0] != 1):
        raise ValueError("xq must be one contiguous Q8_0 row as long as the weight rows")
    if out.ndim != 1 or out.shape[0] != blocks.shape[0]:
        raise ValueError("out must hold one float32 per weight row")
    rs = blocks.strides[0]
    n = blocks.shape[0]
    if out.size and out.strides[0] != 4:
        raise ValueError("out must be contiguous")
    task = max(ROWS, min(TASK_BYTES // max(1, rs), n // 8) // ROWS * ROWS)
    for t in prange((n + task - 1) // task):
        r0 = task * t
        end = min(n, r0 + task)
        q = (end - r0) // ROWS  # ROWS streams q rows apart, each read in order
        for i in range(q):
            r = r0 + i
            dot_q8_0_rows4(blocks, r * rs, q * rs, nb, xq, 0, out, 4 * r, 4 * q, AHEAD_ROWS * rs)
        for k in range(r0 + ROWS * q, end):
            out[k] = dot_q8_0_row(blocks, k * rs, nb, xq, 0)
    return out
