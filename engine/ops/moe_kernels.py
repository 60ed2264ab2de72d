"""Compiled twins of a decode step's routing arithmetic in build_moe_ffn (one token), the same bits as
engine.models.experts' NumPy steps, which stay the reference (and run for a batch, a recorded step, no numba).

  route_one(logits, k, normalize, weighted, ids, weights)
      softmax gating: probabilities = ggml_soft_max of the n logits (ggml_vec_soft_max_f32: v_expf per 16-float
      chunk, 8 with the AVX2 build's W8, each chunk reduced in float and summed in double, a leftover tail with
      libm's expf), the k highest in descending order (ties to the lower index, NaN last: a stable argsort),
      their probabilities; weighted (gpt-oss's SOFTMAX_WEIGHT): the k highest logits, weighted by a soft_max over
      those k (all of it the scalar tail). normalize: divided by their sum (a double sum in order, rounded once,
      clamped below at WEIGHT_SUM_MIN), as ggml_sum_rows, ggml_clamp and ggml_div.
  combine(down, weights, out)
      out = down[0] * w[0] + down[1] * w[1] + ... in float32, each product rounded, the slots added in order
      (ggml_mul by the weights, then ggml_add of the slot views one after another)

ROUTE_ONE holds both builds' orders ([True]: the AVX2 build's); `route_one` is the AVX-512 one.
"""
from __future__ import annotations

import math

import numpy as np

from engine.kernels.activations import njit
from engine.kernels.variants import lane_variants
from engine.ops.ggml_kernels import reduce_lanes, v_expf_lane

W8 = False  # the AVX2 build's softmax chunks: True in ROUTE_ONE[True]
WEIGHT_SUM_MIN = np.float32(6.103515625e-5)  # build_moe_ffn's clamp of the weights' sum
_ZERO = np.float32(0.0)


@njit(cache=True, forceinline=True)
def _before(s, j, b):
    """Whether index j comes before index b in a stable descending sort of s (NaN after everything)."""
    if math.isnan(s[j]):
        return False
    return math.isnan(s[b]) or s[j] > s[b]


@njit(cache=True, forceinline=True)
def _top_k(s, k, ids):
    n = s.shape[0]
    taken = np.zeros(n, np.bool_)
    for slot in range(k):
        best = -1
        for j in range(n):
            if not taken[j] and (best < 0 or _before(s, j, best)):
                best = j
        taken[best] = True
        ids[slot] = best


@njit(cache=True, forceinline=True)
def _soft_max(x, out, w8):
    """ggml_soft_max of one row (scale 1, no mask), into out; w8: the AVX2 build's chunks (an argument: this
    helper is compiled once, not per copy of its caller)."""
    lanes = 8 if w8 else 16
    n = x.shape[0]
    body = n - n % lanes
    top = np.float32(-np.inf)
    for j in range(n):
        if x[j] > top or math.isnan(x[j]):  # np.max's maximum (the NumPy path's): a NaN wins
            top = x[j]
            if math.isnan(top):
                break
    total = 0.0
    for c in range(0, body, lanes):
        for i in range(lanes):
            out[c + i] = v_expf_lane(x[c + i] - top, w8)
        total += np.float64(reduce_lanes(out, c, w8))
    for j in range(body, n):  # the scalar tail: libm's expf (numba's float32 exp), added in double
        out[j] = np.exp(x[j] - top)
        total += np.float64(out[j])
    inv = np.float32(1.0 / total)
    for j in range(n):
        out[j] = out[j] * inv


def _route_one(logits, k, normalize, weighted, ids, weights):
    """See the module docstring; ids (k,) int64 and weights (k,) float32 are written."""
    if weighted:
        _top_k(logits, k, ids)
        chosen = np.empty(k, np.float32)
        for s in range(k):
            chosen[s] = logits[ids[s]]
        _soft_max(chosen, weights, W8)
    else:
        probs = np.empty(logits.shape[0], np.float32)
        _soft_max(logits, probs, W8)
        _top_k(probs, k, ids)
        for s in range(k):
            weights[s] = probs[ids[s]]
    if normalize:
        total = 0.0
        for s in range(k):
            total += np.float64(weights[s])
        t32 = np.float32(total)
        div = t32 if t32 > WEIGHT_SUM_MIN or math.isnan(t32) else WEIGHT_SUM_MIN
        for s in range(k):
            weights[s] = weights[s] / div


ROUTE_ONE = lane_variants(_route_one, cache=True)
route_one = ROUTE_ONE[False]


@njit(cache=True)
def combine(down, weights, out):
    """See the module docstring: down (k, n), weights (k,), out (n,)."""
    k, n = down.shape
    for i in range(n):
        out[i] = down[0, i] * weights[0]
    for s in range(1, k):
        w = weights[s]
        for i in range(n):
            out[i] = out[i] + down[s, i] * w
