"""The scale searches behind the k-quant reference quantizers, vectorised over sub-blocks.

Each function takes sub-blocks element-major, x of shape (n, N): n weights (16 or 32) of N
independent sub-blocks, so every step of the C loop over a sub-block's weights becomes one
NumPy operation over all N sub-blocks. Sums run in the C order and every product is grouped
as the C expression groups it, so scales and quants come out bit-identical to make_qx_quants /
make_q3_quants / make_qkx2_quants in ggml-quants.c.

Speed: the trial loops are most of the k-quant time, so they work in place on preallocated
(n, N) buffers, sum with one `np.add.reduce` over axis 0 (it adds row after row, the C order),
round with np.rint where that is provably the same as nearest_int, and remember only
the winning trial's scale per sub-block, recomputing its quants once at the end as C does.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .ggml_math import GROUP_MAX_EPS, first_absmax, nearest_int, seq_extreme, seq_sum_from_first

F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]
_f = np.float32
# below this |v| (half the exact range, leaving room for the bound's own rounding) np.rint(v) == nearest_int(v)
_FLOAT_ROUND_LIMIT = _f(2.0**21)


def _sum0(terms: F32) -> F32:
    """seq_sum over axis 0 in one call: NumPy reduces a leading axis row after row, as `s += t` does."""
    return np.add.reduce(terms, axis=0) + _f(0.0)  # + 0.0f as the C sum starting from 0.0f


def _sum0_from_first(terms: F32) -> F32:
    """seq_sum_from_first (`s = t[0]; s += t[i]`): as _sum0 except that all -0.0 terms give -0.0."""
    s = np.add.reduce(terms, axis=0)
    zero = s == 0
    if zero.any():
        s = np.where(zero, seq_sum_from_first(terms), s)
    return s


class _Rounder:
    """clamp(nearest_int(scale * (x - offset)), lo, hi) as float32 into a buffer, fast when it is safe.

    np.rint (round half to even) equals nearest_int's 1.5*2^23 bit trick for |v| < 2^22; the
    fast path is taken only when a per-sub-block bound of |v| proves that for every live lane
    (and x is finite), else the exact integer path runs.
    """

    def __init__(self, x: F32, lo: int, hi: int, live: npt.NDArray[np.bool_]):
        self.x = x
        self.lo, self.hi = lo, hi
        self.dead = ~live
        with np.errstate(invalid="ignore"):
            self.finite = bool(np.isfinite(x).all())
            self.xmin = np.fmin.reduce(x, axis=0)
            self.xmax = np.fmax.reduce(x, axis=0)
            self.xabs = np.maximum(np.abs(self.xmin), np.abs(self.xmax))
        self.buf = np.empty_like(x)

    def _safe(self, scale: F32, offset: F32 | None) -> bool:
        if not self.finite:
            return False
        with np.errstate(all="ignore"):
            if offset is None:
                reach = self.xabs
            else:
                reach = np.maximum(np.abs(self.xmin - offset), np.abs(self.xmax - offset))
            bound = np.abs(scale) * reach
            return bool(np.all((bound < _FLOAT_ROUND_LIMIT) | self.dead))

    def __call__(self, scale: F32, offset: F32 | None = None, out: F32 | None = None) -> F32:
        out = self.buf if out is None else out
        v = out
        if offset is None:
            np.multiply(scale, self.x, out=v)
        else:
            np.subtract(self.x, offset, out=v)
            np.multiply(scale, v, out=v)
        if self._safe(scale, offset):
            np.rint(v, out=v)  # ties to even, as nearest_int for |v| < 2^22
            return np.clip(v, self.lo, self.hi, out=out)
        l = np.clip(nearest_int(v), self.lo, self.hi)
        out[...] = l
        return out


def make_qx_quants(x: F32, nmax: int) -> tuple[F32, I32]:
    """Symmetric scale search with weights x*x (rmse_type 1, no imatrix), as make_qx_quants.

    Returns (scale (N,), quants (n, N) in [0, 2 nmax)); a sub-block below GROUP_MAX_EPS gives 0s.
    """
    with np.errstate(all="ignore"):
        amax, mx = first_absmax(x, axis=0)
        zero = amax < GROUP_MAX_EPS
        w = x * x
        wx = w * x
        rnd = _Rounder(x, -nmax, nmax - 1, ~zero)
        tmp = np.empty_like(x)

        def sums(iscale: F32) -> tuple[F32, F32]:
            l = rnd(iscale)
            sumlx = _sum0(np.multiply(wx, l, out=tmp))
            np.multiply(w, l, out=tmp)
            return sumlx, _sum0(np.multiply(tmp, l, out=tmp))

        best_iscale = _f(-nmax) / mx
        sumlx, suml2 = sums(best_iscale)
        scale = np.where(suml2 != 0, sumlx / suml2, _f(0.0)).astype(np.float32)
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = -(_f(nmax) + _f(0.1) * _f(step)) / mx
            sumlx, suml2 = sums(iscale)
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            best_iscale = np.where(better, iscale, best_iscale)
            scale = np.where(better, sumlx / suml2, scale)
            best = np.where(better, scale * sumlx, best)
        best_l = rnd(best_iscale)  # the C loop recomputes L with the winning iscale the same way
    quants = np.where(zero, 0, best_l.astype(np.int32) + nmax)
    return np.where(zero, _f(0.0), scale).astype(np.float32), quants


def make_q3_quants(x: F32, nmax: int) -> tuple[F32, I32]:
    """Symmetric search with one-weight-at-a-time refinement (do_rmse), as make_q3_quants.

    Returns (scale (N,), quants (n, N) in [0, 2 nmax)).
    """
    with np.errstate(all="ignore"):
        amax, mx = first_absmax(x, axis=0)
        zero = amax < GROUP_MAX_EPS
        l = _clamped((_f(-nmax) / mx) * x, -nmax, nmax - 1)
        w = x * x
        wx = w * x
        sumlx = _sum0(wx * l)
        suml2 = _sum0((w * l) * l)
        # each weight's move depends on the sums left by the previous one: loop over weights,
        # vectorise over sub-blocks; a pass that changes nothing would repeat unchanged
        for _ in range(5):
            changed = False
            for i in range(len(x)):
                li = l[i]
                slx = sumlx - wx[i] * li
                sl2 = suml2 - (w[i] * li) * li
                new_l = _clamped((x[i] * sl2) / slx, -nmax, nmax - 1)
                slx_new = slx + wx[i] * new_l
                sl2_new = sl2 + (w[i] * new_l) * new_l
                take = (
                    (slx > 0)
                    & (new_l != li)
                    & (sl2_new > 0)
                    & ((slx_new * slx_new) * suml2 > (sumlx * sumlx) * sl2_new)
                    & ~zero
                )
                if take.any():
                    changed = True
                    l[i] = np.where(take, new_l, li)
                    sumlx = np.where(take, slx_new, sumlx)
                    suml2 = np.where(take, sl2_new, suml2)
            if not changed:
                break
        scale = np.where(suml2 > 0, sumlx / suml2, _f(0.0))
    quants = np.where(zero, 0, l.astype(np.int32) + nmax)
    return np.where(zero, _f(0.0), scale).astype(np.float32), quants


def _clamped(v: F32, lo: int, hi: int) -> F32:
    """nearest_int(v) clamped to [lo, hi], as float32 (the C code multiplies the ints as floats)."""
    return np.clip(nearest_int(v), lo, hi).astype(np.float32)


def make_qkx2_quants(
    x: F32, weights: F32, nmax: int, rmin: float, rdelta: float, nstep: int, use_mad: bool
) -> tuple[F32, F32, I32]:
    """Asymmetric (scale, min) search over nstep + 1 trial scales, as make_qkx2_quants.

    Returns (scale (N,), the_min (N,) = -min >= 0, quants (n, N) in [0, nmax]).
    """
    with np.errstate(all="ignore"):
        lo = seq_extreme(x, largest=False)
        hi = seq_extreme(x, largest=True)
        sum_w = _sum0_from_first(weights)
        sum_x = _sum0_from_first(weights * x)
        lo = np.where(lo > 0, _f(0.0), lo)
        flat = hi == lo
        lo0 = lo
        rnd = _Rounder(x, 0, nmax, ~flat)
        tmp, tmp2 = np.empty_like(x), np.empty_like(x)

        def error(scale: F32, mn: F32, l: F32) -> F32:
            diff = np.multiply(scale, l, out=tmp)  # (scale * l + mn) - x, in the C order
            diff += mn
            diff -= x
            if use_mad:
                np.abs(diff, out=diff)
            else:
                diff *= diff
            diff *= weights
            return _sum0(diff)

        live = ~flat
        best_iscale = _f(nmax) / (hi - lo)
        best_lo = lo.copy()
        scale = _f(1.0) / best_iscale
        best_error = error(scale, lo, rnd(best_iscale, lo))
        lo = lo.copy()  # updated in place below; lo0 keeps the start
        for step in range(nstep + 1):
            # lo moves when a trial wins, and the next trial starts from the new range
            iscale = ((_f(rmin) + _f(rdelta) * _f(step)) + _f(nmax)) / (hi - lo)
            l = rnd(iscale, lo)
            wl = np.multiply(weights, l, out=tmp)
            sum_l = _sum0(wl)
            sum_l2 = _sum0(np.multiply(wl, l, out=tmp2))
            sum_xl = _sum0(np.multiply(wl, x, out=tmp2))
            det = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            clamp = this_min > 0
            this_min = np.where(clamp, _f(0.0), this_min)
            this_scale = np.where(clamp, sum_xl / sum_l2, this_scale)
            cur_error = error(this_scale, this_min, l)
            better = (det > 0) & (cur_error < best_error) & live
            np.copyto(best_iscale, iscale, where=better)
            np.copyto(best_lo, lo, where=better)
            np.copyto(best_error, cur_error, where=better)
            np.copyto(scale, this_scale, where=better)
            np.copyto(lo, this_min, where=better)
        best_l = rnd(best_iscale, best_lo)  # the winning trial's quants, recomputed as they were made
    quants = np.where(flat, 0, best_l.astype(np.int32))
    the_min = np.where(flat, -lo0, -lo).astype(np.float32)
    return np.where(flat, _f(0.0), scale).astype(np.float32), the_min, quants
