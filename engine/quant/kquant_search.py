"""The scale searches behind the k-quant reference quantizers, vectorised over sub-blocks.

Each function takes sub-blocks element-major, x of shape (n, N): n weights (16 or 32) of N
independent sub-blocks, so every step of the C loop over a sub-block's weights becomes one
NumPy operation over all N sub-blocks. Sums run in the C order (seq_sum) and every product is
grouped as the C expression groups it, so scales and quants come out bit-identical to
make_qx_quants / make_q3_quants / make_qkx2_quants in ggml-quants.c.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .ggml_math import GROUP_MAX_EPS, first_absmax, nearest_int, seq_extreme, seq_sum, seq_sum_from_first

F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]
_f = np.float32


def _clamped(v: F32, lo: int, hi: int) -> F32:
    """nearest_int(v) clamped to [lo, hi], as float32 (the C code multiplies the ints as floats)."""
    return np.clip(nearest_int(v), lo, hi).astype(np.float32)


def make_qx_quants(x: F32, nmax: int) -> tuple[F32, I32]:
    """Symmetric scale search with weights x*x (rmse_type 1, no imatrix), as make_qx_quants.

    Returns (scale (N,), quants (n, N) in [0, 2 nmax)); a sub-block below GROUP_MAX_EPS gives 0s.
    """
    with np.errstate(all="ignore"):
        amax, mx = first_absmax(x, axis=0)
        zero = amax < GROUP_MAX_EPS
        w = x * x
        wx = w * x

        def sums(iscale: F32) -> tuple[F32, F32, F32]:
            l = _clamped(iscale * x, -nmax, nmax - 1)
            return l, seq_sum(wx * l), seq_sum((w * l) * l)

        best_l, sumlx, suml2 = sums(_f(-nmax) / mx)
        scale = np.where(suml2 != 0, sumlx / suml2, _f(0.0)).astype(np.float32)
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            l, sumlx, suml2 = sums(-(_f(nmax) + _f(0.1) * _f(step)) / mx)
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            best_l = np.where(better, l, best_l)
            scale = np.where(better, sumlx / suml2, scale)
            best = np.where(better, scale * sumlx, best)
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
        sumlx = seq_sum(wx * l)
        suml2 = seq_sum((w * l) * l)
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


def make_qkx2_quants(
    x: F32, weights: F32, nmax: int, rmin: float, rdelta: float, nstep: int, use_mad: bool
) -> tuple[F32, F32, I32]:
    """Asymmetric (scale, min) search over nstep + 1 trial scales, as make_qkx2_quants.

    Returns (scale (N,), the_min (N,) = -min >= 0, quants (n, N) in [0, nmax]).
    """
    with np.errstate(all="ignore"):
        lo = seq_extreme(x, largest=False)
        hi = seq_extreme(x, largest=True)
        sum_w = seq_sum_from_first(weights)
        sum_x = seq_sum_from_first(weights * x)
        lo = np.where(lo > 0, _f(0.0), lo)
        flat = hi == lo
        lo0 = lo

        def error(scale: F32, mn: F32, l: F32) -> F32:
            diff = (scale * l + mn) - x
            return seq_sum(weights * (np.abs(diff) if use_mad else diff * diff))

        iscale = _f(nmax) / (hi - lo)
        scale = _f(1.0) / iscale
        best_l = _clamped(iscale * (x - lo), 0, nmax)
        best_error = error(scale, lo, best_l)
        for step in range(nstep + 1):
            # lo moves when a trial wins, and the next trial starts from the new range
            iscale = ((_f(rmin) + _f(rdelta) * _f(step)) + _f(nmax)) / (hi - lo)
            l = _clamped(iscale * (x - lo), 0, nmax)
            wl = weights * l
            sum_l = seq_sum(wl)
            sum_l2 = seq_sum(wl * l)
            sum_xl = seq_sum(wl * x)
            det = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            clamp = this_min > 0
            this_min = np.where(clamp, _f(0.0), this_min)
            this_scale = np.where(clamp, sum_xl / sum_l2, this_scale)
            cur_error = error(this_scale, this_min, l)
            better = (det > 0) & (cur_error < best_error) & ~flat
            best_l = np.where(better, l, best_l)
            best_error = np.where(better, cur_error, best_error)
            scale = np.where(better, this_scale, scale)
            lo = np.where(better, this_min, lo)
    quants = np.where(flat, 0, best_l.astype(np.int32))
    the_min = np.where(flat, -lo0, -lo).astype(np.float32)
    return np.where(flat, _f(0.0), scale).astype(np.float32), the_min, quants
