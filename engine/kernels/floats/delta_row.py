"""One row of the gated delta rule's state in ggml-cpu's order, as explicit vector code.

ggml_compute_forward_gated_delta_net (engine.ops.delta_rule) walks a value head's state row by row, each row j
(column j of S, held transposed) in four steps that touch no other row:

  row = src_row * exp(g)                         ggml_vec_scale_f32
  d_j = (v[j] - row . k) * beta                  ggml_vec_dot_f32: four accumulators, GGML_F32x16_REDUCE
  row = fma(k, d_j, row)                         ggml_vec_mad_f32
  o_j = row . q                                  ggml_vec_dot_f32 again (the caller scales it)

numba code of those four steps made a view per row (a reference count that both parallel threads update) and
called a dot function per step; as this code a 128-token layer of 32 heads of 128 takes 5 ms instead of 15-19.
Here the four steps are two passes over the row, each a step of four vectors at a time: the decay stored and
dotted with k, then the update stored and dotted with q. Every element sees the same roundings in the same order,
so the bits are those of the four separate steps.

  delta_row16(dst, do, src, so, k, ko, q, qo, n_steps, dec, vj, beta)   AVX-512's step of 64 (16-lane vectors)
  delta_row8(...)                                                        the AVX2 build's step of 32

dst's row at byte do (src's at so: the same row for an update in place), k's and q's rows at ko and qo, n_steps
steps of 4 * lanes float32 values (the row's length must be a multiple of the step). Returns o_j unscaled.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels.floats.tinyblas import _hadd8, _reduce16
from engine.kernels.simd import F32, I32, I64, byte_ptr, call_intrinsic, shuffle, vec


def _delta_row(n_lanes: int):
    vt, fma = vec(F32, n_lanes), f"llvm.fma.v{n_lanes}f32"
    reduce = _reduce16 if n_lanes == 16 else _hadd8

    def row(typingctx, dst, do, src, so, k, ko, q, qo, n_steps, dec, vj, beta):
        def codegen(context, b, sig, args):
            dst_, do_, src_, so_, k_, ko_, q_, qo_, n_, dec_, vj_, beta_ = args
            pd = byte_ptr(context, b, sig.args[0], dst_, do_)
            ps = byte_ptr(context, b, sig.args[2], src_, so_)
            pk = byte_ptr(context, b, sig.args[4], k_, ko_)
            pq = byte_ptr(context, b, sig.args[6], q_, qo_)

            def splat(x):
                return shuffle(b, b.insert_element(ir.Constant(vt, None), x, ir.Constant(I32, 0)), [0] * n_lanes)

            def at(p, i):
                return b.bitcast(b.gep(p, [b.mul(i, ir.Constant(I64, 4 * n_lanes))]), vt.as_pointer())

            def one_pass(first: bool, scalar):
                """The decay (first) or the update, stored, and its dot with k (first) or q: the dot's element e
                of a step into accumulator e // lanes, then (s0 + s2) + (s1 + s3) reduced."""
                sv = splat(scalar)
                accs = [cgutils.alloca_once_value(b, ir.Constant(vt, None)) for _ in range(4)]
                with cgutils.for_range(b, n_) as loop:
                    for a, acc in enumerate(accs):
                        i = b.add(b.mul(loop.index, ir.Constant(I64, 4)), ir.Constant(I64, a))
                        kv = b.load(at(pk, i), align=4)
                        if first:
                            r, other = b.fmul(b.load(at(ps, i), align=4), sv), kv
                        else:
                            r, other = call_intrinsic(b, fma, vt, [kv, sv, b.load(at(pd, i), align=4)]), b.load(
                                at(pq, i), align=4)
                        b.store(r, at(pd, i), align=4)
                        b.store(call_intrinsic(b, fma, vt, [r, other, b.load(acc)]), acc)
                s = [b.load(acc) for acc in accs]
                return reduce(b, b.fadd(b.fadd(s[0], s[2]), b.fadd(s[1], s[3])))

            dj = b.fmul(b.fsub(vj_, one_pass(True, dec_)), beta_)
            return one_pass(False, dj)

        return types.float32(dst, do, src, so, k, ko, q, qo, n_steps, dec, vj, beta), codegen

    row.__name__ = row.__qualname__ = f"delta_row{n_lanes}"
    return intrinsic(row)


delta_row16, delta_row8 = _delta_row(16), _delta_row(8)
