"""The non-matrix ops of a llama.cpp graph with ggml-cpu's exact bits (AVX-512 build, GCC, glibc).

`--numerics ggml` must reproduce llama.cpp's logits, and a model with massive activations turns a one-ulp
difference in any op into a different 8-bit activation a few layers later. So each op here follows the
ggml-cpu function named in its docstring operation by operation: the same float32 roundings, the same
summation order, the same fused multiply-adds (ggml's intrinsics, and those GCC's default
-ffp-contract=fast makes of `a*b + c` in ggml's C sources, checked against llama.cpp's tensors), the same
elementary functions (engine.ops.ggml_math). Every op takes and returns float32 arrays, works on the
last axis (rows are independent) and is plain NumPy; softmax and SiLU, the two loops that are slow in
NumPy, run their compiled twins (engine.ops.ggml_kernels, the same bits) when the compiled kernels are
in use.

The attention products are in engine.ops.attention_ggml.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import numpy.typing as npt

from engine.kernels import isa, precompile
from engine.kernels.activations import HAVE_NUMBA, KERNEL_LOCK
from engine.ops.ggml_math import cosf, fma32, sinf, v_expf
from engine.ops.ggml_math import expf as libm_expf

F32 = npt.NDArray[np.float32]
# ggml_vec_swiglu_f32 and ggml_vec_soft_max_f32 step through a row in chunks of one vector register: 16 floats in the
# AVX-512 build, 8 in the AVX2 one (engine.kernels.isa.lanes(), which every function here follows)

__all__ = ["add", "geglu", "gelu_table", "rms_norm", "rope", "rope_cache", "scale", "silu", "soft_max", "swiglu",
           "swiglu_oai"]


def _f32(x: npt.ArrayLike) -> F32:
    return np.asarray(x, dtype=np.float32)


def _compiled() -> bool:
    """Whether to run ggml_kernels' compiled loops (numba present and the kernels not switched off)."""
    if not HAVE_NUMBA:
        return False
    from engine.kernels.dispatch import compiled  # noqa: PLC0415 - loads the kernel modules once

    return compiled()


def _parallel(n: int) -> bool:
    """Whether an elementwise op of n elements runs its parallel chunk kernel: a large one, once a first start's late
    kernels are compiled (engine.kernels.precompile; until then the serial copy, the same bits, which the warm-up
    compiled: the parallel one is the late helper's to compile, not this process's, whose memory would keep it)."""
    from engine.ops import ggml_kernels as gk  # noqa: PLC0415 - with compiled kernels only

    return n >= gk.SERIAL_ELEMENTS and precompile.late_ready()


def _expf(x: npt.ArrayLike) -> F32:
    """libm's expf per element: compiled where the kernels are (the same bits), else engine.ops.ggml_math's twin."""
    x = _f32(x)
    if not _compiled():
        return libm_expf(x)
    from engine.ops.ggml_kernels import expf_flat  # noqa: PLC0415

    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.shape, np.float32)
    expf_flat(flat, out)
    return out.reshape(x.shape)


def _rows(a: F32) -> F32:
    return np.ascontiguousarray(a.reshape(-1, a.shape[-1]))


# ---- norms


def rms_norm(x: npt.ArrayLike, weight: npt.ArrayLike | None, eps: float) -> F32:
    """ggml_rms_norm (ggml_compute_forward_rms_norm_f32) then ggml_mul by `weight` (None: no multiply).

    Per row: the float32 squares summed one after another in double, mean = sum / n in double rounded
    to float, scale = 1.0f / sqrtf(mean + eps) in float; y = (x * scale) * weight, each product rounded
    (the fused RMS_NORM + MUL kernel computes `x * scale * w` in the same order).
    """
    x = _f32(x)
    n = x.shape[-1]
    if _compiled() and x.ndim >= 1 and x.size >= n and n:  # rows: the compiled twin, the same bits
        from engine.ops.ggml_kernels import rms_norm_rows_early as rms_norm_rows  # noqa: PLC0415

        rows = _rows(x)
        out = np.empty(rows.shape, np.float32)
        w = np.empty(0, np.float32) if weight is None else np.ascontiguousarray(np.broadcast_to(_f32(weight), (n,)))
        with KERNEL_LOCK:
            rms_norm_rows(rows, w, np.float32(eps), out)
        return out.reshape(x.shape)
    squares = (x * x).astype(np.float64)
    total = np.cumsum(squares, axis=-1)[..., -1:]  # a running sum: the sequential order, not pairwise
    mean = (total / n).astype(np.float32)
    s = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    y = x * s
    return y if weight is None else y * _f32(weight)


def add(a: npt.ArrayLike, b: npt.ArrayLike) -> F32:
    """ggml_add of float32 tensors (residual connections): one rounding, order-free."""
    return _f32(a) + _f32(b)


def scale(x: npt.ArrayLike, s: float) -> F32:
    """ggml_scale by a float (Gemma's query scale, its embedding scale): x * float(s)."""
    return _f32(x) * np.float32(s)


# ---- gated activations


def silu(x: npt.ArrayLike, lanes: int | None = None) -> F32:
    """ggml_vec_silu_f32's lanes: x / (1 + v_expf(0 - x)) for every element of a 16-float (8-float) chunk."""
    x = _f32(x)
    with np.errstate(over="ignore"):
        return x / (np.float32(1.0) + v_expf(np.float32(0.0) - x, lanes or isa.lanes()))


def _silu_libm(x: F32) -> F32:
    """ggml_silu_f32, the scalar leftover: x / (1.0f + expf(-x)) with the C library's expf."""
    with np.errstate(over="ignore"):
        return x / (np.float32(1.0) + libm_expf(-x))


def silu_rows(x: npt.ArrayLike) -> F32:
    """ggml_silu on a tensor (ggml_vec_silu_f32 per row): ggml_v_silu over each row's 16-float chunks, libm's
    scalar ggml_silu_f32 for the n % 16 left at the end (a row of one element is all leftover); 8 and n % 8 in
    the AVX2 build."""
    x = _f32(x)
    n = x.shape[-1]
    lanes = isa.lanes()
    body = n - n % lanes
    out = np.empty(x.shape, np.float32)
    if _compiled() and body:  # the compiled lanes (SwiGLU's with up = 1, an exact multiply: the same bits)
        from engine.ops import ggml_kernels as gk  # noqa: PLC0415

        x2 = _rows(x)
        kernel = (gk.silu_chunks if _parallel(x2.size) else gk.silu_chunks_serial)[lanes == 8]
        with KERNEL_LOCK:
            kernel(x2, out.reshape(x2.shape), body)
    else:
        out[..., :body] = silu(x[..., :body], lanes)
    out[..., body:] = _silu_libm(x[..., body:])
    return out


def swiglu(gate: npt.ArrayLike, up: npt.ArrayLike) -> F32:
    """ggml_swiglu_split (ggml_vec_swiglu_f32, AVX-512): silu(gate) * up per row.

    The first n - n % 16 elements of a row go through ggml_v_silu (chunks of 16), the rest through the
    scalar ggml_silu_f32 with libm's expf: the two differ in the last bits, so where a row ends matters. The AVX2
    build: chunks of 8 and its own v_expf.
    """
    g, u = _f32(gate), _f32(up)
    n = g.shape[-1]
    lanes = isa.lanes()
    body = n - n % lanes
    shape = np.broadcast_shapes(g.shape, u.shape)
    out = np.empty(shape, np.float32)
    if _compiled() and body:
        from engine.ops import ggml_kernels as gk  # noqa: PLC0415

        g2, u2 = _rows(np.broadcast_to(g, shape)), _rows(np.broadcast_to(u, shape))
        kernel = (gk.swiglu_chunks if _parallel(g2.size) else gk.swiglu_chunks_serial)[lanes == 8]
        with KERNEL_LOCK:
            kernel(g2, u2, out.reshape(g2.shape), body)  # a view: `out` is new and contiguous
    else:
        out[..., :body] = silu(g[..., :body], lanes) * u[..., :body]
    if body < n:
        out[..., body:] = _silu_libm(g[..., body:]) * u[..., body:]
    return out


_GELU_COEF_A = np.float32(0.044715)
_SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)


@functools.lru_cache(maxsize=1)
def gelu_table() -> npt.NDArray[np.float32]:
    """ggml_table_gelu_f16 widened to float32: GELU (tanh form) of every fp16 value, rounded to fp16.

    ggml-cpu fills it at start-up from ggml_gelu_f32, 0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f +
    GELU_COEF_A*x*x))), where GCC fuses `1.0f + (GELU_COEF_A*x)*x` into one fma (it changes one entry).
    glibc's tanhf is not correctly rounded, but after the fp16 rounding the correctly rounded tanh gives
    the same table, entry for entry.
    """
    f = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        inner = fma32(_GELU_COEF_A * f, f, np.float32(1.0))
        arg = (_SQRT_2_OVER_PI * f) * inner
        t = np.tanh(arg.astype(np.float64)).astype(np.float32)
        y = (np.float32(0.5) * f) * (np.float32(1.0) + t)
        table = y.astype(np.float16).astype(np.float32)
    table.flags.writeable = False
    return table


OAI_ALPHA = np.float32(1.702)  # build_moe_ffn's LLM_FFN_SWIGLU_OAI_MOE constants (gpt-oss)
OAI_LIMIT = np.float32(7.0)


def swiglu_oai(gate: npt.ArrayLike, up: npt.ArrayLike, alpha: float = OAI_ALPHA, limit: float = OAI_LIMIT) -> F32:
    """ggml_swiglu_oai (ggml_compute_forward_swiglu_oai_f32, a scalar loop): x = min(gate, limit),
    y = clamp(up, -limit, limit), x / (1 + expf(alpha * -x)) * (y + 1), with libm's expf."""
    a, lim = np.float32(alpha), np.float32(limit)
    g, u = _f32(gate), _f32(up)
    if _compiled() and g.shape == u.shape and np.isfinite(lim):  # the same loop compiled, the same bits
        from engine.ops.ggml_kernels import swiglu_oai_flat  # noqa: PLC0415

        out = np.empty(g.shape, np.float32)
        swiglu_oai_flat(np.ascontiguousarray(g).reshape(-1), np.ascontiguousarray(u).reshape(-1), a, lim, out.reshape(-1))
        return out
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.minimum(_f32(gate), lim)
        y = np.clip(_f32(up), -lim, lim)
        glu = x / (np.float32(1.0) + libm_expf(a * -x))
        return (glu * (y + np.float32(1.0))).astype(np.float32, copy=False)


def geglu(gate: npt.ArrayLike, up: npt.ArrayLike) -> F32:
    """ggml_geglu_split (ggml_vec_geglu_f32 with GGML_GELU_FP16, which ggml-cpu always defines).

    gate <= -10: 0; gate >= 10: gate * up; otherwise the fp16 GELU table at fp16(gate), times up.
    """
    g, u = _f32(gate), _f32(up)
    if _compiled() and g.shape == u.shape and g.ndim >= 1 and g.size >= 4096:
        from engine.ops.ggml_kernels import geglu_rows_early as geglu_rows  # noqa: PLC0415

        g2, u2 = _rows(g), _rows(u)
        out = np.empty(g2.shape, np.float32)
        with KERNEL_LOCK:
            geglu_rows(g2, u2, gelu_table(), out)
        return out.reshape(g.shape)
    idx = g.astype(np.float16).view(np.uint16)  # F16C conversion: round to nearest even
    looked_up = gelu_table()[idx] * u
    with np.errstate(invalid="ignore"):
        return np.where(g <= -10.0, np.float32(0.0), np.where(g >= 10.0, g * u, looked_up)).astype(np.float32)


# ---- softmax


def _reduce16(v: F32) -> F32:
    """_mm512_reduce_add_ps over the last axis (16) in GCC's order: halves added down to one lane; over 8, the
    AVX2 build's horizontal sum (128-bit halves added, then movehl and movehdup): the same last two steps."""
    if v.shape[-1] == 16:
        v = v[..., :8] + v[..., 8:]
    q = v[..., :4] + v[..., 4:]
    return (q[..., 0] + q[..., 2]) + (q[..., 1] + q[..., 3])


def soft_max(scores: npt.ArrayLike, scale: float = 1.0, mask: npt.ArrayLike | None = None,
             sinks: npt.ArrayLike | None = None) -> F32:
    """ggml_soft_max_ext (ggml_compute_forward_soft_max_f32, no ALiBi) over the last axis, with
    ggml_soft_max_add_sinks' correction when `sinks` (one logit per head, shaped to broadcast against the row
    maxima: (H, 1, 1) for (H, T, n) scores) is given: the row maximum takes the sink, and expf(sink - max) (libm)
    joins the double sum after the row's own terms; the sink carries no value, so the weights sum to less than 1.

    w = scores * scale (+ mask, additive 0 / -inf, or a bool array where True means visible); then
    ggml_vec_soft_max_f32: e = v_expf(w - max) per 16-float chunk (8 and the AVX2 v_expf in that build,
    engine.kernels.isa.lanes()), each chunk reduced in float and
    added to a double sum (a leftover tail: libm expf, added one by one); finally e * float(1.0 / sum).
    The row length is the KV cache's n_kv (llama.cpp pads it, masking the padding): pass the padded
    scores to get llama.cpp's chunks.
    """
    w = _f32(scores) * np.float32(scale)
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype == np.bool_:
            m = np.where(m, np.float32(0.0), np.float32(-np.inf))
        w = w + _f32(m)
    n = w.shape[-1]
    lanes = isa.lanes()
    body = n - n % lanes
    with np.errstate(invalid="ignore", over="ignore"):
        mx = np.max(w, axis=-1, keepdims=True)
        if sinks is not None:
            sk = np.broadcast_to(_f32(sinks), mx.shape)
            mx = np.where(mx > sk, mx, sk)  # MAX(max, sk[h])
        d = w - mx
        e = np.empty(w.shape, np.float32)
        if not body:  # a row shorter than one chunk (a router's top k): all of it is the scalar tail
            total = np.zeros(w.shape[:-1])
        elif _compiled():
            from engine.ops import ggml_kernels as gk  # noqa: PLC0415

            d2 = _rows(d)
            e2 = np.empty(d2.shape, np.float32)
            sums = np.empty(d2.shape[0], np.float64)
            kernel = (gk.soft_max_chunks if _parallel(d2.size) else gk.soft_max_chunks_serial)[lanes == 8]
            with KERNEL_LOCK:
                kernel(d2, e2, sums, body)
            e = e2.reshape(w.shape)
            total = sums.reshape(w.shape[:-1])
        else:
            e[..., :body] = v_expf(d[..., :body], lanes)
            chunks = _reduce16(e[..., :body].reshape(*w.shape[:-1], body // lanes, lanes)).astype(np.float64)
            total = np.cumsum(chunks, axis=-1)[..., -1] if body else np.zeros(w.shape[:-1])
        if body < n:
            e[..., body:] = _expf(d[..., body:])
            tail = np.concatenate([total[..., None], e[..., body:].astype(np.float64)], axis=-1)
            total = np.cumsum(tail, axis=-1)[..., -1]
        if sinks is not None:
            total = total + _expf((sk - mx)[..., 0]).astype(np.float64)
        inv = (1.0 / total).astype(np.float32)
        return e * inv[..., None]


# ---- RoPE


def rope_theta_scale(base: float, n_dims: int) -> np.float32:
    """powf(freq_base, -2.0f/n_dims): the ratio of consecutive pair frequencies.

    Computed in double and rounded once; glibc's powf agrees for the bases and dimensions of common
    models (10^4, 10^5, 5*10^5, 10^6 with 64, 128, 256 dims), checked against the library.
    """
    e = np.float32(-2.0) / np.float32(n_dims)
    return np.float32(math.pow(float(np.float32(base)), float(e)))


def rope_cache(
    positions: npt.ArrayLike, n_dims: int, base: float, freq_scale: float = 1.0,
    freq_factors: npt.ArrayLike | None = None, attn_factor: float = 1.0, ramp: npt.ArrayLike | None = None,
) -> tuple[F32, F32]:
    """ggml_rope_cache_init and rope_yarn (ggml-cpu ops.cpp): (cos, sin), each (T, n_dims/2) float32.

    theta starts at float(pos) and is multiplied by theta_scale pair after pair in float (not
    pos * theta_scale^i); each pair takes theta / freq_factor, theta_interp = freq_scale * that, with YaRN
    (ramp: rope_yarn_ramp * ext_factor per pair, None without) theta_interp * (1 - ramp) + theta * ramp
    (one fused multiply-add, as GCC contracts it), then cosf/sinf(theta) * attn_factor with glibc's cosf/sinf.
    attn_factor is the whole mscale (rope_yarn's 1 + 0.1 ln(1/freq_scale) already in it, RopeScaling.mscale).
    """
    pos = np.asarray(positions).astype(np.float32).reshape(-1)
    ts = rope_theta_scale(base, n_dims)
    half = n_dims // 2
    theta = np.empty((pos.size, half), np.float32)
    t = pos.copy()
    for i in range(half):
        theta[:, i] = t
        t = t * ts
    if freq_factors is not None:
        theta = theta / _f32(freq_factors)[:half]
    if ramp is not None:
        mix = _f32(ramp)[:half]
        theta = fma32(np.float32(freq_scale) * theta, np.float32(1.0) - mix, theta * mix)
    else:
        theta = np.float32(freq_scale) * theta
    c, s = cosf(theta), sinf(theta)
    if attn_factor != 1.0:
        c, s = c * np.float32(attn_factor), s * np.float32(attn_factor)
    return c, s


def rope(x: npt.ArrayLike, cos: F32, sin: F32, mode: str) -> F32:
    """ggml_rope_ext's rotate_pairs on x (..., T, head_dim) with the cache (T, n_dims/2) of rope_cache.

    'norm' rotates pairs (2i, 2i+1) (llama), 'neox' pairs (i, i + n_dims/2) (gemma3, qwen); dims past
    n_dims pass through. Per pair, as GCC compiles `x0*cos - x1*sin` and `x0*sin + x1*cos`: the second
    product rounded, the first fused with it.
    """
    x = _f32(x)
    n = cos.shape[-1]
    if mode not in ("norm", "neox"):
        raise ValueError(f"unknown rope mode {mode!r}")
    if _compiled() and x.ndim >= 2 and cos.ndim == 2 and cos.shape[0] == x.shape[-2]:
        from engine.ops.ggml_kernels import rope_rows  # noqa: PLC0415

        flat = np.ascontiguousarray(x.reshape(-1, x.shape[-2], x.shape[-1]))
        res = flat.copy() if 2 * n < x.shape[-1] else np.empty_like(flat)  # dims past n_dims pass through
        rope_rows(flat, np.ascontiguousarray(cos, np.float32), np.ascontiguousarray(sin, np.float32), mode == "neox", res)
        return res.reshape(x.shape)
    out = x.copy()
    if mode == "norm":
        i0, i1 = slice(0, 2 * n, 2), slice(1, 2 * n, 2)
    elif mode == "neox":
        i0, i1 = slice(0, n), slice(n, 2 * n)
    else:
        raise ValueError(f"unknown rope mode {mode!r}")
    x0, x1 = x[..., i0], x[..., i1]
    out[..., i0] = fma32(x0, cos, -(x1 * sin))
    out[..., i1] = fma32(x0, sin, x1 * cos)
    return out
