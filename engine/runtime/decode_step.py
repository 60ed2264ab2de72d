"""One token through a decoder block in a few compiled calls, with ggml-cpu's exact bits (ggml numerics, F16 cache).

A decode step in NumPy spends most of its time in small array operations around the matrix products. The three
functions here do a block's non-matrix work, each in one call, operation by operation as the NumPy reference
does it (engine.ops.ggml for RMSNorm, RoPE, softmax, SwiGLU, GeGLU; engine.ops.attention_ggml for
the attention products; engine.kernels.activations / q8k for the activation bytes), so the result is the same
bit for bit (tests hold them to each other and to llama.cpp's tensors):

  residual_norm_quant   x += delta (or += RMSNorm(delta) * post), h = RMSNorm(x) * w, h quantized for the next
                        product(s): the join of two blocks, and the final norm before the output head
  attend                per-head q/k norms (Gemma), RoPE, the K/V write into the fp16 cache, K*q as
                        ggml_vec_dot_f16, Gemma 2's soft-cap, soft_max_ext with ggml_v_expf, V*w as ggml_vec_dot_f16, and the
                        output quantized for the attention output product
  glu_quant             SwiGLU or GeGLU of the gate and up rows, quantized for the down product

Activation types are ggml type ids (engine.quant.types.GGMLType): F32, F16, BF16, Q8_0, Q8_1, Q8_K; -1 for none.
The caller (engine.runtime.decode_plan) checks the shapes these assume (a multiple of 16 for the GLU rows, the
softmax row without a scalar tail) and runs the NumPy path otherwise. ATTEND and GLU_QUANT hold both builds'
orders (engine.kernels.isa; [True]: the AVX2 build's 8-float softmax and SiLU chunks with its v_expf, vec_dot_f16's
4 x 8 accumulators), `attend` and `glu_quant` are the AVX-512 ones.
"""
from __future__ import annotations

import numpy as np

from engine.kernels.activations import HAVE_NUMBA
from engine.quant.types import GGMLType

F32_T, F16_T, BF16_T = int(GGMLType.F32), int(GGMLType.F16), int(GGMLType.BF16)
W8 = False  # the order of the AVX2 build: True in the variants lane_variants makes of attend and glu_quant
Q8_0_T, Q8_1_T, Q8_K_T = int(GGMLType.Q8_0), int(GGMLType.Q8_1), int(GGMLType.Q8_K)
SWIGLU, GEGLU = 0, 1

if HAVE_NUMBA:
    from numba import prange

    from engine.kernels.activations import (
        _nb_quantize_bf16,
        _nb_quantize_f16,
        _nb_quantize_q8,
        f16_to_f32,
        f32_to_f16,
        fma32,
        njit,
    )
    from engine.kernels.floats.vec_dot import _dot_f16_row
    from engine.kernels.variants import lane_variants, specialise
    from engine.kernels.q8k import quantize_q8_k_into
    from engine.kernels.floats.tinyblas import axpy8, axpy16, steps8, steps16
    from engine.ops.ggml_kernels import reduce16_columns, reduce_lanes, v_expf_lane

    _ONE = np.float32(1.0)
    _ZERO = np.float32(0.0)
    # numpy scalars, not Python constants: a Python int or bool passed to a jitted helper is typed as a literal
    # and compiles one more specialisation per value (seconds at first start, no faster code)
    _O = np.int64(0)
    _NO, _YES = np.bool_(False), np.bool_(True)

    @njit(cache=True)
    def quantize_into(vdt, x, out):
        """x (1, n) float32 as the bytes of activation type vdt in out (1, nbytes), as ggml-cpu's from_float;
        nothing for a type of -1."""
        if vdt == Q8_0_T:
            _nb_quantize_q8(x, out, _NO)
        elif vdt == Q8_1_T:
            _nb_quantize_q8(x, out, _YES)
        elif vdt == Q8_K_T:
            quantize_q8_k_into(x, out)
        elif vdt == F16_T:
            _nb_quantize_f16(x, out.view(np.uint16))
        elif vdt == BF16_T:
            _nb_quantize_bf16(x, out.view(np.uint16))
        elif vdt == F32_T:
            y = out.view(np.float32)
            for i in range(x.shape[1]):
                y[0, i] = x[0, i]

    @njit(cache=True, forceinline=True)
    def _rms_scale(x, o, n, eps):
        """ggml_compute_forward_rms_norm_f32's scale of x[o:o+n]: squares summed in double, 1.0f / sqrtf(mean + eps)."""
        total = 0.0
        for i in range(n):
            v = x[o + i] * x[o + i]
            total += np.float64(v)
        mean = np.float32(total / n)
        return _ONE / np.sqrt(mean + eps)

    @njit(cache=True, forceinline=True)
    def _norm(x, o, n, w, eps, out, oo):
        """out[oo:oo+n] = (x[o:o+n] * scale) * w: ggml_rms_norm, then ggml_mul by the weight."""
        s = _rms_scale(x, o, n, eps)
        for i in range(n):
            out[oo + i] = (x[o + i] * s) * w[i]

    @njit(cache=True)
    def residual_norm_quant(x, delta, post, w, eps, h, vdt_a, xq_a, vdt_b, xq_b):
        """x (n,) += delta, or += RMSNorm(delta) * post when post is not empty (Gemma's post-norms); nothing when
        delta is empty. Then h (1, n) = RMSNorm(x) * w, quantized as vdt_a into xq_a (and vdt_b into xq_b)."""
        n = x.shape[0]
        if delta.shape[0]:
            if post.shape[0]:
                tmp = np.empty(n, np.float32)
                _norm(delta, _O, n, post, eps, tmp, _O)
                for i in range(n):
                    x[i] = x[i] + tmp[i]
            else:
                for i in range(n):
                    x[i] = x[i] + delta[i]
        _norm(x, _O, n, w, eps, h[0], _O)
        quantize_into(vdt_a, h, xq_a)
        if vdt_b >= 0:
            quantize_into(vdt_b, h, xq_b)

    @njit(cache=True, forceinline=True)
    def _rope(src, o, d, cos, sin, neox, dst, do):
        """dst[do:do+d] = ggml's rotate_pairs of src[o:o+d] (pairs past 2 * len(cos) pass through)."""
        n = cos.shape[0]
        for i in range(d):
            dst[do + i] = src[o + i]
        for i in range(n):
            a, b = (i, i + n) if neox else (2 * i, 2 * i + 1)
            x0, x1 = src[o + a], src[o + b]
            c, s = cos[i], sin[i]
            dst[do + a] = fma32(x0, c, -(x1 * s))
            dst[do + b] = fma32(x0, s, x1 * c)

    @njit(cache=True)
    def write_kv(k, v, k_norm, v_norm, eps, kc, vc, pos, cos, sin, neox):
        """The token's keys (normed when k_norm is not empty, rotated) and values (normed when v_norm is not
        empty) into the fp16 cache rows at `pos`; nothing when k is empty (a layer reading another's rows)."""
        hkv, _, d = kc.shape
        tmp = np.empty(d, np.float32)
        kr = np.empty(d, np.float32)
        for h in range(hkv if k.shape[0] else 0):
            if k_norm.shape[0]:
                _norm(k, h * d, d, k_norm, eps, tmp, _O)
                _rope(tmp, _O, d, cos, sin, neox, kr, _O)
            else:
                _rope(k, h * d, d, cos, sin, neox, kr, _O)
            for t in range(d):
                kc[h, pos, t] = f32_to_f16(kr[t])
            if v_norm.shape[0]:
                _norm(v, h * d, d, v_norm, eps, tmp, _O)
                for t in range(d):
                    vc[h, pos, t] = f32_to_f16(tmp[t])
            else:
                for t in range(d):
                    vc[h, pos, t] = f32_to_f16(v[h * d + t])

    def _attend(q, k, v, q_norm, k_norm, v_norm, eps, kc, vc, pos, n_kv, window, cos, sin, neox, q_scale, kq_scale,
                softcap, sinks, q_rot, o, vdt, xq, parts):
        """Attention of the token at `pos` for one layer.

        q (Hq*d,), k and v (Hkv*d,) are the projections (k and v empty: a layer reading another's rows, Gemma 4's KV
        sharing: nothing is written); q_norm / k_norm / v_norm (d,) per-head RMSNorm weights or empty (Gemma 4's V norm
        is unweighted: ones, an exact multiply);
        kc / vc the layer's cache rows (Hkv, capacity, d) as fp16 bits, written at `pos`; n_kv llama.cpp's padded
        key count; window 0 or the sliding window; cos / sin (n_rot / 2,) of this position. q is scaled by q_scale
        after RoPE (Gemma), the scores by kq_scale in softmax; softcap > 0 caps each raw score first as
        cap * tanhf(score * (1/cap)) (Gemma 2: build_attn_mha's ggml_scale, ggml_tanh, ggml_scale); sinks (Hq,) or
        empty: gpt-oss's one logit per head in each softmax row's maximum and sum (no value). q_rot (Hq, d)
        gets the rotated, unscaled queries, o (1, Hq*d) the output, xq its bytes as vdt. W8: the AVX2 build's order
        (ATTEND[True]; engine.kernels.variants.lane_variants). The heads go in `parts` interleaved shares, each with
        scratch of its own: one share per thread (a head's bits do not depend on the share it is in).
        """
        lanes = 8 if W8 else 16  # one register: a softmax chunk; vec_dot_f16 keeps four of them
        step = 4 * lanes
        d = kc.shape[2]
        n_used = pos + 1
        lo = 0 if window <= 0 else max(0, pos - window + 1)
        write_kv(k, v, k_norm, v_norm, eps, kc, vc, pos, cos, sin, neox)  # the new key and value, as fp16
        scores_t = np.zeros((parts, n_kv), np.float32)  # each share's scratch (scores and w16 left zero by a head)
        w16_t = np.zeros((parts, n_kv), np.float32)
        q16_t = np.empty((parts, d), np.float32)
        acc_t = np.empty((parts, step), np.float32)
        part_t = np.empty((parts, step, d), np.float32)
        red_t = np.empty((parts, lanes, d), np.float32)
        qn_t = np.empty((parts, d), np.float32)
        out = o[0]
        # (numba's get_num_threads in a kernel keeps it out of the on-disk cache; the index is unsigned in the parallel
        # loop: as int64 it takes the specialisation the typing compiled, not a second one)
        for share in prange(parts):
            _heads(np.int64(share), parts, q, q_norm, eps, kc, vc, lo, n_used, n_kv, cos, sin, neox, q_scale, kq_scale,
                   softcap, sinks, q_rot, out, scores_t[share], w16_t[share], q16_t[share], acc_t[share], part_t[share],
                   red_t[share], qn_t[share])
        quantize_into(vdt, o, xq)

    def _heads(share, parts, q, q_norm, eps, kc, vc, lo, n_used, n_kv, cos, sin, neox, q_scale, kq_scale, softcap,
               sinks, q_rot, out, scores, w16, q16, acc, part, red, qn):
        """_attend's heads share, share + parts, ... (one thread's), with that share's scratch: a function of its own,
        called from _attend's parallel loop, so that numba compiles this body once as a plain function (inside the
        parallel loop it was outlined and compiled again: 43 s for _attend_avx2 on an AMD EPYC, 17 s serial)."""
        lanes = 8 if W8 else 16
        step = 4 * lanes
        inv_cap = _ONE / softcap if softcap > _ZERO else _ZERO
        hkv, _, d = kc.shape
        hq = q.shape[0] // d
        group = hq // hkv
        body = n_kv - n_kv % lanes
        direct = d % step == 0 and kc.strides[2] == 2  # each score's steps straight off the cache row (no view or call)
        for h in range(share, hq, parts):
            kv = h // group
            if q_norm.shape[0]:
                _norm(q, h * d, d, q_norm, eps, qn, _O)
                _rope(qn, _O, d, cos, sin, neox, q_rot[h], _O)
            else:
                _rope(q, h * d, d, cos, sin, neox, q_rot[h], _O)
            for t in range(d):  # ggml_scale (when asked), then the F16 work buffer of K*q
                qs = q_rot[h, t] * q_scale if q_scale != _ONE else q_rot[h, t]
                q16[t] = f16_to_f32(f32_to_f16(qs))
            top = -np.inf
            for j in range(lo, n_used):  # each score its own ggml_vec_dot_f16
                if direct:
                    at = kv * kc.strides[0] + j * kc.strides[1]
                    s = steps8(kc, at, q16, _O, d // step) if W8 else steps16(kc, at, q16, _O, d // step)
                else:
                    s = _dot_f16_row(kc[kv, j], q16, acc)
                if softcap > _ZERO:
                    s = np.float32(np.tanh(s * inv_cap)) * softcap
                s = s * kq_scale
                scores[j] = s
                if s > top:  # noqa: PLR1730 - maxps: a NaN score never becomes the maximum
                    top = s
            if sinks.shape[0] and not top > sinks[h]:  # ggml_soft_max_add_sinks: MAX(max, sink)
                top = sinks[h]
            total = 0.0  # ggml_vec_soft_max_f32: v_expf per 16-float chunk, each chunk reduced, summed in double
            for c in range(lo - lo % lanes, min(body, n_used + lanes - 1 - (n_used + lanes - 1) % lanes), lanes):
                for i in range(lanes):
                    j = c + i
                    scores[j] = v_expf_lane(scores[j] - top, W8) if lo <= j < n_used else _ZERO
                total += np.float64(reduce_lanes(scores, c, W8))
            if sinks.shape[0]:  # the sink's term with libm's expf (numba's float32 exp is that call)
                total += np.float64(np.exp(sinks[h] - top))
            inv = np.float32(1.0 / total)
            for j in range(lo, n_used):  # the weights in the F16 work buffer of V*w
                w16[j] = f16_to_f32(f32_to_f16(scores[j] * inv))
            n_eff = min(n_kv, n_used + 63 - (n_used + 63) % 64)
            body_steps = n_eff - n_eff % step
            part[:] = 0.0
            for j in range(lo, min(n_used, body_steps)):  # V^T rows dotted with the weights: lane j % step, one fma
                lane = j % step
                wj = w16[j]
                at = kv * vc.strides[0] + j * vc.strides[1]
                if d % 16 == 0:  # the same fmas as vector code (numba leaves this loop scalar)
                    axpy16(vc, at, wj, part, lane * part.strides[0], d)
                elif d % 8 == 0:
                    axpy8(vc, at, wj, part, lane * part.strides[0], d)
                else:
                    for t in range(d):
                        part[lane, t] = fma32(f16_to_f32(vc[kv, j, t]), wj, part[lane, t])
            q1, q2, q3 = lanes, 2 * lanes, 3 * lanes
            for i in range(lanes):  # GGML_F32x16_REDUCE / _F32x8_REDUCE: the four accumulators, all outputs at once
                for t in range(d):
                    red[i, t] = (part[i, t] + part[q2 + i, t]) + (part[q1 + i, t] + part[q3 + i, t])
            head = out[h * d : (h + 1) * d]
            if W8:  # then two hadds: ((r0 + r4) + (r1 + r5)) + ((r2 + r6) + (r3 + r7))
                for t in range(d):
                    head[t] = ((red[0, t] + red[4, t]) + (red[1, t] + red[5, t])) + \
                        ((red[2, t] + red[6, t]) + (red[3, t] + red[7, t]))
            else:
                reduce16_columns(red, head)  # _mm512_reduce_add_ps of every output's 16 lanes
            if max(lo, body_steps) < min(n_used, n_eff):  # a scalar tail past the last step: added in double
                for t in range(d):
                    s64 = np.float64(head[t])
                    for j in range(max(lo, body_steps), min(n_used, n_eff)):
                        s64 += np.float64(f16_to_f32(vc[kv, j, t]) * w16[j])
                    head[t] = np.float32(s64)
            for j in range(lo, n_used):
                scores[j] = _ZERO
                w16[j] = _ZERO

    def _glu_quant(gate, up, kind, table, act, vdt, xq):
        """act (1, n) = SwiGLU (ggml_v_silu lanes, the AVX2 build's with W8) or GeGLU (the fp16 GELU table) of gate
        and up (n,), n % 16 == 0 (n % 8 with W8); then quantized as vdt into xq."""
        y = act[0]
        for i in range(gate.shape[0]):
            x = gate[i]
            if kind == SWIGLU:
                y[i] = (x / (_ONE + v_expf_lane(_ZERO - x, W8))) * up[i]
            elif x <= np.float32(-10.0):
                y[i] = _ZERO
            elif x >= np.float32(10.0):
                y[i] = x * up[i]
            else:
                y[i] = table[f32_to_f16(x)] * up[i]
        quantize_into(vdt, act, xq)

    _HEADS = lane_variants(_heads, cache=True)
    # a late kernel, as the whole compiled step; each build's copy calls that build's _heads
    ATTEND = {w8: specialise(_attend, suffix, {"W8": w8, "_heads": _HEADS[w8]}, cache=True, parallel=True)
              for w8, suffix in ((False, "avx512"), (True, "avx2"))}
    GLU_QUANT = lane_variants(_glu_quant, cache=True)
    attend, glu_quant = ATTEND[False], GLU_QUANT[False]
