"""Flash attention as ggml-cpu computes it (ggml_flash_attn_ext, F16 K/V cache), bit for bit (ggml numerics).

With flash attention on (llama.cpp's `-fa on`, and what `-fa auto` resolves to on the CPU), build_attn_mha hands
q (float32), the cache's F16 K and V views over n_kv cells and the F16 causal mask to one op, whose CPU kernel
takes one of three paths (ggml_compute_forward_flash_attn_ext_f16 in ggml-cpu/ops.cpp):

- the tiled path, for a batch of GGML_FA_TILE_Q (64) queries or more: Q stays float32; per 64-key tile each
  score is one fused multiply-add chain over the head dimension (simd_gemm: each output is its own chain, so the
  vector width does not show), times the scale (then tanhf and the cap, soft-capping); the row's running maximum
  takes the tile's, rescaling the float32 accumulator and sum by expf(old - new) when it grows; the tile's
  weights are ggml_vec_soft_max_f32's (ggml_v_expf per register, each register reduced, summed in double and
  added to the float sum), and V (fp16 widened) is added in one fused chain per output over the tile's keys;
- the one-row path, for fewer queries and for one token: Q rounded to fp16, each score ggml_vec_dot_f16, an
  online softmax key by key with libm's expf, and the V accumulator kept in fp16: ggml_vec_scale_f16 and
  ggml_vec_mad_f16 round it to fp16 after every key;
- for one token over 512 cells or more, the split-KV path: the cells cut into one chunk per thread, a one-row
  partial (maximum, sum, accumulator) per chunk, and the partials merged in chunk order. Its bits depend on
  llama.cpp's thread count, which the caller passes.

Every path ends with sinks (gpt-oss) joining the maximum and sum, and the accumulator times 1/sum. Masked keys
and the padding past the cached cells never add anything (skipped, or a weight of exactly zero), so the kernels
run over the cached keys only. ggml-cpu is built with GCC's default -ffp-contract=fast, so the scalar
`S = S*ms + vs` is one fused multiply-add (the fixtures tell the two apart), and so is ggml_vec_mad_f16's scalar
tail. W8: the AVX2 build's order (vec_dot_f16's 4 x 8 lanes, v_expf and the softmax chunks 8 wide); both builds'
copies are compiled (lane_variants).
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine.kernels import isa
from engine.kernels.activations import HAVE_NUMBA

F32 = npt.NDArray[np.float32]
TILE_Q = 64  # GGML_FA_TILE_Q: a batch of this many queries or more takes the tiled kernel
TILE_KV = 64  # GGML_FA_TILE_KV: keys per tile
SPLIT_MIN_KV = 512  # one token over this many cells (n_kv) or more takes the split-KV path
W8 = False  # the AVX2 build's order: True in the copies lane_variants makes
_NO_SINKS = np.zeros(0, np.float32)

__all__ = ["TILE_Q", "available", "flash_attention", "kv_chunk"]


def available() -> bool:
    """Whether the flash kernels can run here (they are compiled numba kernels)."""
    return HAVE_NUMBA


def kv_chunk(n_queries: int, n_kv: int, threads: int) -> int:
    """Cells per partial in ggml's split-KV path: ceil(n_kv / threads) for one query over 512 cells or more, else
    n_kv (one partial: the plain one-row path)."""
    if n_queries == 1 and n_kv >= SPLIT_MIN_KV and threads > 1:
        return -(-n_kv // threads)
    return n_kv


if HAVE_NUMBA:
    from engine.kernels.activations import f16_to_f32, f32_to_f16, fma32, njit, prange
    from engine.kernels.floats.vec_dot import _dot_f16_row
    from engine.kernels.variants import lane_variants
    from engine.ops.ggml_kernels import reduce_lanes, v_expf_lane

    _ONE = np.float32(1.0)
    _ZERO = np.float32(0.0)

    @njit(cache=True, forceinline=True)
    def join_sink(acc, m, total, sink):
        """A sink logit joining a row's maximum m and sum `total` after its keys (the accumulator row `acc` times
        expf(m - sink) when the sink is the new maximum, a multiply per element); the new sum, S*ms + vs fused."""
        ms, vs = _ONE, _ONE
        if sink > m:
            ms = np.float32(np.exp(m - sink))
            for c in range(acc.shape[0]):
                acc[c] = acc[c] * ms
        else:
            vs = np.float32(np.exp(sink - m))
        return fma32(total, ms, vs)

    @njit(cache=True, forceinline=True)
    def one_row(q16, kch, vch, lo, n_keys, masked, mask_row, eff, softcap, has_sink, sink, chunk, acc, vkq, total_v,
                out_row):
        """One query row of the one-row (and split-KV) path: q16 the query in fp16, kch / vch its KV head's fp16
        cache rows (>= n_keys, d), keys lo..n_keys (with `masked`, those whose mask_row entry is False skipped),
        `chunk` cells per partial, the partials merged in chunk order, the sink joining the first; out_row (d,) =
        the accumulator times 1/sum. acc (vec_dot_f16's step: its order), vkq: scratch; total_v (d,) zeroed."""
        d = q16.shape[0]
        n_chunks = max(1, -(-n_keys // chunk))
        total_m, total_s = np.float32(-np.inf), _ZERO
        for part in range(n_chunks):
            vkq[:] = _ZERO
            m, s_sum = np.float32(-np.inf), _ZERO
            for j in range(max(lo, part * chunk), min(n_keys, (part + 1) * chunk)):
                if masked and not mask_row[j]:
                    continue  # a -inf mask entry: the key is skipped before its product
                s = _dot_f16_row(kch[j], q16, acc) * eff
                if softcap > _ZERO:
                    s = softcap * np.float32(np.tanh(s))
                ms, vs = _ONE, _ONE
                if s > m:  # a new maximum: the fp16 accumulator times expf(old - new), this key's weight 1
                    ms = np.float32(np.exp(m - s))
                    m = s
                    for c in range(d):  # ggml_vec_scale_f16
                        vkq[c] = f16_to_f32(f32_to_f16(vkq[c] * ms))
                else:
                    vs = np.float32(np.exp(s - m))
                for c in range(d):  # ggml_vec_mad_f16: fp16 in, one fma, fp16 out (its scalar tail contracted too)
                    vkq[c] = f16_to_f32(f32_to_f16(fma32(f16_to_f32(vch[j, c]), vs, vkq[c])))
                s_sum = fma32(s_sum, ms, vs)  # GCC contracts S*ms + vs into one fma (-ffp-contract=fast)
            if has_sink and part == 0:  # the sink joins the first chunk's maximum and sum
                ms, vs = _ONE, _ONE
                if sink > m:
                    ms = np.float32(np.exp(m - sink))
                    m = sink
                    for c in range(d):
                        vkq[c] = vkq[c] * ms
                else:
                    vs = np.float32(np.exp(sink - m))
                s_sum = fma32(s_sum, ms, vs)
            if n_chunks == 1:
                total_m, total_s = m, s_sum
                total_v[:] = vkq
            elif s_sum != _ZERO:  # ggml_flash_attn_ext_reduce_partials, chunk by chunk
                new_m = max(total_m, m)
                old_scale = np.float32(np.exp(total_m - new_m))
                new_scale = np.float32(np.exp(m - new_m))
                for c in range(d):  # a*b + c*d contracted as fma(a, b, c*d)
                    total_v[c] = fma32(total_v[c], old_scale, vkq[c] * new_scale)
                total_s = fma32(total_s, old_scale, s_sum * new_scale)
                total_m = new_m
        inv = _ZERO if total_s == _ZERO else _ONE / total_s
        for c in range(d):
            out_row[c] = total_v[c] * inv

    def _flash_rows(q, kc, vc, n_keys, mask, scale, softcap, sinks, chunk, out):
        """The one-row path (and the split-KV path with chunk < the keys): out (Hq, T, d) for q (Hq, T, d), the
        cache's fp16 bits kc / vc (Hkv, >= n_keys, d), mask (T, >= n_keys) True where visible."""
        step = 32 if W8 else 64  # vec_dot_f16's four registers
        hq, t, d = q.shape
        group = hq // kc.shape[0]
        eff = scale / softcap if softcap > _ZERO else scale  # the op divides its scale by the cap
        for task in prange(hq * t):
            h, i = task // t, task % t
            kv = h // group
            q16 = np.empty(d, np.float32)
            acc = np.empty(step, np.float32)
            vkq = np.empty(d, np.float32)
            total_v = np.zeros(d, np.float32)
            for c in range(d):  # from_float of K's vec_dot_type: Q in fp16
                q16[c] = f16_to_f32(f32_to_f16(q[h, i, c]))
            one_row(q16, kc[kv], vc[kv], 0, n_keys, True, mask[i], eff, softcap, sinks.shape[0] > 0,
                    sinks[h] if sinks.shape[0] else _ZERO, chunk, acc, vkq, total_v, out[h, i])

    def _flash_tiled(q, kc, vc, n_keys, mask, scale, softcap, sinks, out):
        """The tiled path: out (Hq, T, d) as _flash_rows, Q in float32, 64 keys per tile."""
        lanes = 8 if W8 else 16
        hq, t, d = q.shape
        group = hq // kc.shape[0]
        eff = scale / softcap if softcap > _ZERO else scale
        n_tiles = -(-t // TILE_Q)
        for task in prange(hq * n_tiles):  # a head's tile of up to 64 queries (each row's bits are its own)
            h, r0 = task // n_tiles, (task % n_tiles) * TILE_Q
            rows = min(TILE_Q, t - r0)
            kv = h // group
            kt = np.zeros((d, TILE_KV), np.float32)  # the K tile transposed, widened
            vt = np.zeros((TILE_KV, d), np.float32)
            kq = np.empty(TILE_KV, np.float32)
            acc = np.zeros((rows, d), np.float32)
            top = np.full(rows, -np.inf, np.float32)
            s_sum = np.zeros(rows, np.float32)
            for k0 in range(0, n_keys, TILE_KV):
                nk = min(TILE_KV, n_keys - k0)
                seen = False
                for r in range(rows):
                    for jj in range(nk):
                        if mask[r0 + r, k0 + jj]:
                            seen = True
                            break
                    if seen:
                        break
                if not seen:
                    continue  # every row masked over the whole tile: skipped
                for jj in range(nk):
                    for c in range(d):
                        kt[c, jj] = f16_to_f32(kc[kv, k0 + jj, c])
                        vt[jj, c] = f16_to_f32(vc[kv, k0 + jj, c])
                for r in range(rows):
                    i = r0 + r
                    kq[:] = _ZERO
                    for c in range(d):  # simd_gemm: one fma chain per score over the head dimension
                        qc = q[h, i, c]
                        for jj in range(TILE_KV):
                            kq[jj] = fma32(qc, kt[c, jj], kq[jj])
                    tile_max = np.float32(-np.inf)
                    for jj in range(TILE_KV):
                        if jj >= nk or not mask[i, k0 + jj]:
                            kq[jj] = -np.inf
                            continue
                        s = kq[jj] * eff
                        if softcap > _ZERO:
                            s = np.float32(np.tanh(s)) * softcap
                        kq[jj] = s
                        if s > tile_max:  # noqa: PLR1730 - ggml_vec_max_f32's MAX: a NaN never the maximum
                            tile_max = s
                    if tile_max == -np.inf:
                        continue  # this row sees none of the tile's keys
                    old = top[r]
                    new = max(old, tile_max)
                    if new > old:  # the accumulator and the sum times expf(old - new)
                        ms = np.float32(np.exp(old - new))
                        for c in range(d):
                            acc[r, c] = acc[r, c] * ms
                        s_sum[r] = s_sum[r] * ms
                    top[r] = new
                    total = 0.0  # ggml_vec_soft_max_f32: v_expf per register, each reduced, summed in double
                    for c0 in range(0, TILE_KV, lanes):
                        for lane in range(lanes):
                            kq[c0 + lane] = v_expf_lane(kq[c0 + lane] - new, W8)
                        total += np.float64(reduce_lanes(kq, c0, W8))
                    s_sum[r] = np.float32(np.float64(s_sum[r]) + total)
                    for jj in range(nk):  # simd_gemm: V added in one fma chain per output over the tile's keys
                        w = kq[jj]
                        if w != _ZERO:  # a zero weight's fma adds nothing
                            for c in range(d):
                                acc[r, c] = fma32(w, vt[jj, c], acc[r, c])
            for r in range(rows):
                m, total_s = top[r], s_sum[r]
                if sinks.shape[0]:
                    total_s = join_sink(acc[r], m, total_s, sinks[h])
                inv = _ZERO if total_s == _ZERO else _ONE / total_s
                for c in range(d):
                    out[h, r0 + r, c] = acc[r, c] * inv

    ROWS = lane_variants(_flash_rows, cache=True, parallel=True)
    TILED = lane_variants(_flash_tiled, cache=True, parallel=True)


def flash_attention(q: F32, k_bits: np.ndarray, v_bits: np.ndarray, n_keys: int, mask: npt.NDArray[np.bool_],
                    scale: float, n_kv: int, threads: int = 1, softcap: float | None = None,
                    sinks: F32 | None = None) -> F32:
    """ggml_flash_attn_ext's output (Hq, T, d) for queries q (Hq, T, d) over the first n_keys cached keys and values
    as fp16 bits (Hkv, >= n_keys, d) uint16; mask (T, >= n_keys) True where visible; n_kv llama.cpp's padded cell
    count and `threads` its thread count (the split-KV path's chunks); softcap the logit cap (Gemma 2), sinks (Hq,)
    gpt-oss's. The caller holds KERNEL_LOCK."""
    out = np.empty(q.shape, np.float32)
    q = np.ascontiguousarray(q, np.float32)
    mask = np.ascontiguousarray(mask)
    if k_bits.strides[2] != 2 or v_bits.strides[2] != 2:
        k_bits, v_bits = np.ascontiguousarray(k_bits), np.ascontiguousarray(v_bits)
    extra = _NO_SINKS if sinks is None else np.ascontiguousarray(sinks, np.float32)
    w8 = bool(isa.w8())
    cap = np.float32(softcap or 0.0)
    if q.shape[1] >= TILE_Q:
        TILED[w8](q, k_bits, v_bits, n_keys, mask, np.float32(scale), cap, extra, out)
    else:
        chunk = kv_chunk(q.shape[1], n_kv, threads)
        ROWS[w8](q, k_bits, v_bits, n_keys, mask, np.float32(scale), cap, extra, chunk, out)
    return out
