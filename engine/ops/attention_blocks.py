"""The prompt attention's two products for a block of QB queries at once, in tinyBLAS's per-output order.

engine.ops.attention_prefill walks a head's keys for QB (4) of its queries together: each fp16 key row and value
row is read and converted once for the four, where a query at a time read every row once per query (at 8,192
tokens a head's 1 MiB of keys, from L2 or L3, 512 times a batch). Each output keeps its own accumulator and its
own order, so the bits are the one-query kernel's:

  kq<lanes>(kc, ko, ks, n_keys, q, qo, qs, d, e, eo, es)
      e[r, k] = tinyBLAS's K*q of key row k (fp16 bits at byte ko + k * ks of kc) with query row r (float32 at
      byte qo + r * qs of q: already rounded to fp16): one <lanes x float> accumulator walked d / lanes times
      (fma(key, query, acc)), then reduce16 / the AVX2 build's hsum; r = 0..QB-1, stored at byte eo + r * es + 4k.
      lanes / QB keys are walked together and their QB x lanes / QB sums reduced at once (transposed_reduce: the
      same additions in the same order, a round of shuffles a level); the keys left over one at a time
  kqv<lanes>(vc, vo, vs, j0, n_keys, e, eo, es, mask, mo, ms, nq, acc, ao, as, d)
      for k in 0..n_keys-1, key j = j0 + k (value row at byte vo + k * vs of vc), query r < nq where
      mask[mo + r * ms + k] is set: acc[r, j % lanes, :] = fma(value, weight e[eo + r * es + 4k], acc[...]) (query
      r's (lanes, d) float32 block at byte ao + r * as), the V*w lanes of each output (a masked key adds nothing,
      not even a zero's sign)

The caller reserves QB rows in e and acc whatever nq is: rows past nq are computed from the block's first query and never read.
Rows of e and acc a multiple of 4 KiB apart would make the four queries' loads and stores alias in the store
buffer (4K aliasing): the caller pads them.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels.floats.tinyblas import _lanes, _reduce8, _reduce16
from engine.kernels.simd import F32, I8, I32, I64, byte_ptr, call_intrinsic, const_vec, load, shuffle, vec

QB = 4  # queries a block


def _i64(b, v):
    return v if v.type == I64 else b.sext(v, I64)


def _segments(b, u, v, width: int, take: list[int]):
    """One vector of u's and then v's segments of `width` lanes, each cut to the lanes `take` of it."""
    n = u.type.count
    idx = [seg * width + t for seg in range(n // width) for t in take]
    return b.shuffle_vector(u, v, const_vec(I32, idx + [n + k for k in idx]))


def transposed_reduce(b, vs):
    """n_lanes vectors of n_lanes floats -> one vector whose lane m is reduce16 / reduce8 of vs[m], the same additions
    in the same order (t_k = a_k + a_(k+8), u_k = t_k + t_(k+4), (u_0 + u_2) + (u_1 + u_3)), a level a round of
    shuffles and adds for all of them instead of a chain of extracts per output."""
    n = vs[0].type.count
    level = list(vs)
    for width in ([16, 8] if n == 16 else [8]):  # halves of each segment added: t (16 lanes), then u
        half = width // 2
        level = [b.fadd(_segments(b, level[2 * p], level[2 * p + 1], width, list(range(half))),
                        _segments(b, level[2 * p], level[2 * p + 1], width, list(range(half, width))))
                 for p in range(len(level) // 2)]
    for take in ([0, 1], [2, 3]), ([0], [1]):  # (u0 + u2, u1 + u3), then their sum
        width = 4 if len(take[0]) == 2 else 2
        level = [b.fadd(_segments(b, level[2 * p], level[2 * p + 1], width, take[0]),
                        _segments(b, level[2 * p], level[2 * p + 1], width, take[1]))
                 for p in range(len(level) // 2)]
    return level[0]


def _kq(n_lanes: int):
    vt, fma = vec(F32, n_lanes), f"llvm.fma.v{n_lanes}f32"
    reduce = _reduce16 if n_lanes == 16 else _reduce8
    kb = n_lanes // QB  # keys a step: QB x kb accumulators, one register of scores

    def kq(typingctx, kc, ko, ks, n_keys, q, qo, qs, d, e, eo, es):
        def codegen(context, b, signature, args):
            kc_, ko_, ks_, n_, q_, qo_, qs_, d_, e_, eo_, es_ = args
            pk = byte_ptr(context, b, signature.args[0], kc_, ko_)
            pq = byte_ptr(context, b, signature.args[4], q_, qo_)
            pe = byte_ptr(context, b, signature.args[8], e_, eo_)
            pqs = [b.gep(pq, [b.mul(ir.Constant(I64, r), _i64(b, qs_))]) for r in range(QB)]
            pes = [b.gep(pe, [b.mul(ir.Constant(I64, r), _i64(b, es_))]) for r in range(QB)]
            chunks = b.sdiv(_i64(b, d_), ir.Constant(I64, n_lanes))
            n64, ks64 = _i64(b, n_), _i64(b, ks_)
            steps = b.sdiv(n64, ir.Constant(I64, kb))
            grid = [[cgutils.alloca_once(b, vt) for _ in range(kb)] for _ in range(QB)]
            with cgutils.for_range(b, steps) as step:  # kb keys x QB queries, reduced together
                key0 = b.mul(step.index, ir.Constant(I64, kb))
                rows = [b.gep(pk, [b.mul(b.add(key0, ir.Constant(I64, kk)), ks64)]) for kk in range(kb)]
                for accs in grid:
                    for acc in accs:
                        b.store(ir.Constant(vt, None), acc)
                with cgutils.for_range(b, chunks) as chunk:
                    kvs = [_lanes(b, row, chunk.index, True, n_lanes) for row in rows]
                    for pqr, accs in zip(pqs, grid):
                        qv = _lanes(b, pqr, chunk.index, False, n_lanes)
                        for kv, acc in zip(kvs, accs):
                            b.store(call_intrinsic(b, fma, vt, [kv, qv, b.load(acc)]), acc)
                scores = transposed_reduce(b, [b.load(acc) for accs in grid for acc in accs])  # lane r * kb + kk
                seg = vec(F32, kb)
                for r, per in enumerate(pes):
                    part = shuffle(b, scores, list(range(r * kb, r * kb + kb)))
                    dst = b.gep(per, [b.mul(key0, ir.Constant(I64, 4))])
                    b.store(part, b.bitcast(dst, seg.as_pointer()), align=4)
            accs = grid[0][:1] + [row[0] for row in grid[1:]]
            with cgutils.for_range(b, b.sub(n64, b.mul(steps, ir.Constant(I64, kb)))) as tail:  # the keys left
                key = b.add(b.mul(steps, ir.Constant(I64, kb)), tail.index)
                row = b.gep(pk, [b.mul(key, ks64)])
                for acc in accs:
                    b.store(ir.Constant(vt, None), acc)
                with cgutils.for_range(b, chunks) as chunk:
                    kv = _lanes(b, row, chunk.index, True, n_lanes)
                    for pqr, acc in zip(pqs, accs):
                        qv = _lanes(b, pqr, chunk.index, False, n_lanes)
                        b.store(call_intrinsic(b, fma, vt, [kv, qv, b.load(acc)]), acc)
                at = b.mul(key, ir.Constant(I64, 4))
                for per, acc in zip(pes, accs):
                    b.store(reduce(b, b.load(acc)), b.bitcast(b.gep(per, [at]), F32.as_pointer()), align=4)
            return context.get_dummy_value()

        return types.void(kc, ko, ks, n_keys, q, qo, qs, d, e, eo, es), codegen

    kq.__name__ = kq.__qualname__ = f"kq{n_lanes}"
    return intrinsic(kq)


def _kqv(n_lanes: int):
    vt, fma = vec(F32, n_lanes), f"llvm.fma.v{n_lanes}f32"

    def kqv(typingctx, vc, vo, vs, j0, n_keys, e, eo, es, mask, mo, ms, nq, acc, ao, ast, d):
        def codegen(context, b, signature, args):
            vc_, vo_, vs_, j0_, n_, e_, eo_, es_, m_, mo_, ms_, nq_, acc_, ao_, as_, d_ = args
            pv = byte_ptr(context, b, signature.args[0], vc_, vo_)
            pe = byte_ptr(context, b, signature.args[5], e_, eo_)
            pm = byte_ptr(context, b, signature.args[8], m_, mo_)
            pa = byte_ptr(context, b, signature.args[12], acc_, ao_)
            d64 = _i64(b, d_)
            chunks = b.sdiv(d64, ir.Constant(I64, n_lanes))
            last = b.sub(_i64(b, nq_), ir.Constant(I64, 1))
            with cgutils.for_range(b, _i64(b, n_)) as key:
                k = key.index
                j = b.add(_i64(b, j0_), k)
                lane = b.srem(j, ir.Constant(I64, n_lanes))
                row = b.gep(pv, [b.mul(k, _i64(b, vs_))])
                weights, active, bases = [], [], []
                for r in range(QB):
                    live = b.icmp_signed("<", ir.Constant(I64, r), _i64(b, nq_))
                    mrow = b.select(live, ir.Constant(I64, r), last)  # a row past nq reads row nq - 1's byte
                    seen = load(b, b.gep(pm, [b.add(b.mul(mrow, _i64(b, ms_)), k)]), I8)
                    active.append(b.and_(live, b.icmp_unsigned("!=", seen, ir.Constant(I8, 0))))
                    w = load(b, b.gep(pe, [b.add(b.mul(ir.Constant(I64, r), _i64(b, es_)),
                                                 b.mul(k, ir.Constant(I64, 4)))]), F32)
                    weights.append(shuffle(b, b.insert_element(ir.Constant(vt, None), w, ir.Constant(I32, 0)),
                                           [0] * n_lanes))
                    at = b.add(b.mul(ir.Constant(I64, r), _i64(b, as_)), b.mul(lane, b.mul(d64, ir.Constant(I64, 4))))
                    bases.append(b.gep(pa, [at]))  # acc[r, lane, 0]
                with cgutils.for_range(b, chunks) as chunk:
                    vv = _lanes(b, row, chunk.index, True, n_lanes)
                    step = b.mul(chunk.index, ir.Constant(I64, 4 * n_lanes))
                    for w, on, base in zip(weights, active, bases):
                        p = b.bitcast(b.gep(base, [step]), vt.as_pointer())
                        old = b.load(p, align=4)
                        new = call_intrinsic(b, fma, vt, [vv, w, old])
                        b.store(b.select(on, new, old), p, align=4)
            return context.get_dummy_value()

        return types.void(vc, vo, vs, j0, n_keys, e, eo, es, mask, mo, ms, nq, acc, ao, ast, d), codegen

    kqv.__name__ = kqv.__qualname__ = f"kqv{n_lanes}"
    return intrinsic(kqv)


kq16, kq8 = _kq(16), _kq(8)
kqv16, kqv8 = _kqv(16), _kqv(8)
