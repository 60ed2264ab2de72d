// Row-wise operations of the transformer on the device: RMSNorm, the gated activation, RoPE with the
// KV-cache write, and the greedy pick. Each mirrors a NumPy function in engine/models (named below).
//
// What changes from step to step is read from device memory, not passed as kernel arguments, so that a
// captured CUDA graph replays for every step and every KV cache without being rebuilt: a small int32
// state buffer (state[0]: the token of a decode step, state[1]: the position of the first row,
// state[2]: the cache capacity) and a table of the cache's row pointers (kv[2 * slot]: keys,
// kv[2 * slot + 1]: values of the slot-th device layer).
#include "ggml_blocks.cu"

__device__ __forceinline__ float ops_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// out[r] = (resid ? resid[r] : 0) + rms_norm(x[r]) * w, as base.rms_norm. grid: n_rows blocks, any
// multiple of 32 threads. out may alias resid (Gemma's x += post_norm(o)), never x.
extern "C" __global__ void rms_norm_rows(
    const float* __restrict__ x, const float* __restrict__ w, float* out, const float* resid, int n, float eps)
{
    __shared__ float red[32];
    const float* xr = x + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = ops_warp_sum(ss);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    float t = lane < (int)(blockDim.x >> 5) ? red[lane] : 0.0f;
    float total = ops_warp_sum(t);
    float inv = 1.0f / sqrtf(total / (float)n + eps);
    size_t base = (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = (xr[i] * inv) * w[i];
        out[base + i] = resid ? resid[base + i] + v : v;
    }
}

__device__ __forceinline__ float ops_act(int act, float x) {
    if (act == 1) return x / (1.0f + expf(-x));  // silu
    const float c = 0.7978845608028654f;          // gelu_tanh, as base.gelu_tanh
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

// out[t, i] = act(gu[t, i]) * gu[t, hidden + i]: the gated FFN input from the stacked gate/up product.
extern "C" __global__ void gated_act(const float* __restrict__ gu, float* __restrict__ out, int hidden, int n_rows, int act)
{
    long long total = (long long)n_rows * hidden;
    for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total; k += (long long)gridDim.x * blockDim.x) {
        long long t = k / hidden, i = k % hidden;
        const float* row = gu + t * 2 * hidden;
        out[k] = ops_act(act, row[i]) * row[hidden + i];
    }
}

// Split the fused q|k|v rows, apply the optional per-head RMSNorm (Gemma's q_norm / k_norm), rotate q
// and k (rope.apply_rope: 'norm' pairs (2i, 2i+1), 'neox' pairs (i, i + rope_dim/2); dims past
// rope_dim pass through), write q as (n_heads, T, d) and k, v into the cache (n_kv, cap, d) at
// positions state[1] + t. One warp per (row, head slot); slots are q heads, then k heads, then v heads.
extern "C" __global__ void rope_store(
    const float* __restrict__ qkv, int T, int n_heads, int n_kv, int d,
    const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
    const double* __restrict__ freqs, int rope_dim, int neox, const int* __restrict__ state,
    float* __restrict__ q_out, const unsigned long long* __restrict__ kv, int layer_slot, int cache_f16)
{
    int cap = state[2];
    void* k_cache = (void*)kv[2 * layer_slot];
    void* v_cache = (void*)kv[2 * layer_slot + 1];
    int lane = threadIdx.x & 31;
    int item = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int slots = n_heads + 2 * n_kv;
    if (item >= T * slots) return;
    int t = item / slots, slot = item % slots;
    int pos = state[1] + t;
    const float* src = qkv + (size_t)t * (n_heads + 2 * n_kv) * d + (size_t)slot * d;

    float* dst_f = 0;
    gl_u16* dst_h = 0;
    const float* nw = 0;
    bool rotate = true;
    if (slot < n_heads) {
        dst_f = q_out + ((size_t)slot * T + t) * d;
        nw = q_norm;
    } else {
        int h = slot < n_heads + n_kv ? slot - n_heads : slot - n_heads - n_kv;
        void* cache = slot < n_heads + n_kv ? k_cache : v_cache;
        size_t at = ((size_t)h * cap + pos) * d;
        if (cache_f16) dst_h = (gl_u16*)cache + at; else dst_f = (float*)cache + at;
        if (slot < n_heads + n_kv) nw = k_norm; else rotate = false;
    }

    float inv = 1.0f;
    if (nw) {
        float ss = 0.0f;
        for (int i = lane; i < d; i += 32) ss += src[i] * src[i];
        ss = ops_warp_sum(ss);
        inv = 1.0f / sqrtf(ss / (float)d + eps);
    }
    int half = rope_dim / 2;
    if (rotate) {
        for (int i = lane; i < half; i += 32) {
            int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            float x0 = src[a], x1 = src[b];
            if (nw) { x0 = (x0 * inv) * nw[a]; x1 = (x1 * inv) * nw[b]; }
            double ang = (double)pos * freqs[i];
            float c = (float)cos(ang), s = (float)sin(ang);
            float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
            if (dst_h) { dst_h[a] = gl_float_to_half(y0); dst_h[b] = gl_float_to_half(y1); }
            else { dst_f[a] = y0; dst_f[b] = y1; }
        }
    }
    for (int i = rotate ? rope_dim + lane : lane; i < d; i += 32) {
        float v = src[i];
        if (nw) v = (v * inv) * nw[i];
        if (dst_h) dst_h[i] = gl_float_to_half(v); else dst_f[i] = v;
    }
}

// out[0] = the index of the largest of n values (the first one on ties, a NaN before any number, as
// np.argmax): the greedy pick, so only 4 bytes come back to the host. One block of 1024 threads.
extern "C" __global__ void argmax(const float* __restrict__ x, int n, int* out)
{
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    float v = -__int_as_float(0x7f800000);
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float xi = x[i];
        if (xi > v || (xi != xi && v == v)) { v = xi; idx = i; }  // NaN wins, as np.argmax
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        bool take = (ov != ov && v == v) || ov > v || (ov == v && oi < idx) || (ov != ov && v != v && oi < idx);
        if (take) { v = ov; idx = oi; }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { best_v[warp] = v; best_i[warp] = idx; }
    __syncthreads();
    if (warp == 0) {
        int n_warps = blockDim.x >> 5;
        v = lane < n_warps ? best_v[lane] : -__int_as_float(0x7f800000);
        idx = lane < n_warps ? best_i[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, v, o);
            int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            bool take = (ov != ov && v == v) || ov > v || (ov == v && oi < idx) || (ov != ov && v != v && oi < idx);
            if (take) { v = ov; idx = oi; }
        }
        if (lane == 0) out[0] = idx == 0x7fffffff ? 0 : idx;
    }
}
