// Causal grouped-query attention over the KV cache with an online softmax (FlashAttention's recurrence,
// as engine/models/attention_tiled.py), for decode and prefill alike.
//
// Query row (head h, row t) sits at position state[1] + t and sees keys j with j <= pos and, for a sliding
// window, pos - j < window (base.causal_mask). Query head h reads KV head h / (n_heads / n_kv).
// A block of ATT_WARPS warps takes one query row and one of n_split contiguous slices of its keys; the
// warps walk the slice ATT_KEYS keys at a time each, keeping a running max m, sum l and output acc (the
// lanes hold head dims lane, lane + 32, ...), then merge. With n_split == 1 the block writes
// the normalised output; otherwise it writes (m, l, acc) and attention_combine merges the slices.
#include "ggml_blocks.cu"

#define ATT_WARPS 4
#define ATT_MAX_PER_LANE 8  // head_dim <= 256
#define ATT_KEYS 4  // keys a warp takes per step

__device__ __forceinline__ float att_load(const void* cache, int f16, size_t at) {
    return f16 ? gl_half_to_float(((const gl_u16*)cache)[at]) : ((const float*)cache)[at];
}

// grid (n_heads * T, n_split), ATT_WARPS * 32 threads. q (n_heads, T, d); the layer's caches (n_kv, cap, d)
// from the pointer table kv and cap = state[2] (see ops.cu); out (T, n_heads, d) when n_split == 1,
// part (n_heads * T, n_split, d + 2) otherwise.
extern "C" __global__ void attention(
    const float* __restrict__ q, const unsigned long long* __restrict__ kv, int layer_slot, int cache_f16,
    const int* __restrict__ state, int T, int n_heads, int n_kv, int d,
    float scale, int window, int n_split, float* __restrict__ out, float* __restrict__ part)
{
    int cap = state[2];
    const void* k_cache = (const void*)kv[2 * layer_slot];
    const void* v_cache = (const void*)kv[2 * layer_slot + 1];
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][ATT_MAX_PER_LANE * 32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int row = blockIdx.x, split = blockIdx.y;
    int h = row / T, t = row % T;
    int kvh = h / (n_heads / n_kv);
    int pos = state[1] + t;
    int lo = window > 0 ? max(0, pos - window + 1) : 0;
    int hi = pos + 1;
    int span = hi - lo;
    int chunk = (span + n_split - 1) / n_split;
    int s_lo = lo + split * chunk, s_hi = min(hi, s_lo + chunk);

    float qv[ATT_MAX_PER_LANE], acc[ATT_MAX_PER_LANE];
    const float* qr = q + ((size_t)h * T + t) * d;
#pragma unroll
    for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
        int e = lane + 32 * i;
        qv[i] = e < d ? qr[e] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -__int_as_float(0x7f800000), l = 0.0f;
    size_t head_base = (size_t)kvh * cap;
    // ATT_KEYS consecutive keys per warp step: their loads and shuffle reductions are independent, so
    // their latencies overlap instead of adding up (a decode step is latency-bound, not bandwidth-bound)
    for (int j0 = s_lo + warp * ATT_KEYS; j0 < s_hi; j0 += ATT_WARPS * ATT_KEYS) {
        float s[ATT_KEYS];
#pragma unroll
        for (int u = 0; u < ATT_KEYS; u++) {
            s[u] = 0.0f;
            if (j0 + u < s_hi) {
                size_t kb = (head_base + j0 + u) * d;
#pragma unroll
                for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
                    int e = lane + 32 * i;
                    if (e < d) s[u] += qv[i] * att_load(k_cache, cache_f16, kb + e);
                }
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
            for (int u = 0; u < ATT_KEYS; u++) s[u] += __shfl_xor_sync(0xffffffffu, s[u], o);
        }
        float m_new = m;
#pragma unroll
        for (int u = 0; u < ATT_KEYS; u++) {
            s[u] *= scale;
            if (j0 + u < s_hi) m_new = fmaxf(m_new, s[u]);
        }
        float alpha = expf(m - m_new);  // exp(-inf) = 0 on the first keys
        l *= alpha;
#pragma unroll
        for (int i = 0; i < ATT_MAX_PER_LANE; i++) acc[i] *= alpha;
#pragma unroll
        for (int u = 0; u < ATT_KEYS; u++) {
            if (j0 + u < s_hi) {
                float p = expf(s[u] - m_new);
                l += p;
                size_t vb = (head_base + j0 + u) * d;
#pragma unroll
                for (int i = 0; i < ATT_MAX_PER_LANE; i++) {
                    int e = lane + 32 * i;
                    if (e < d) acc[i] += p * att_load(v_cache, cache_f16, vb + e);
                }
            }
        }
        m = m_new;
    }
    if (lane == 0) { sm_m[warp] = m; sm_l[warp] = l; }
#pragma unroll
    for (int i = 0; i < ATT_MAX_PER_LANE; i++) sm_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();

    // merge the warps: every thread takes head dims e = threadIdx.x, + blockDim.x, ...
    float mm = -__int_as_float(0x7f800000);
    for (int w = 0; w < ATT_WARPS; w++) mm = fmaxf(mm, sm_m[w]);
    float ll = 0.0f, wt[ATT_WARPS];
    for (int w = 0; w < ATT_WARPS; w++) {
        wt[w] = sm_l[w] > 0.0f ? expf(sm_m[w] - mm) : 0.0f;
        ll += sm_l[w] * wt[w];
    }
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) a += sm_acc[w][e] * wt[w];
        if (n_split == 1) {
            out[((size_t)t * n_heads + h) * d + e] = ll > 0.0f ? a / ll : 0.0f;
        } else {
            part[((size_t)row * n_split + split) * (d + 2) + 2 + e] = a;
        }
    }
    if (n_split > 1 && threadIdx.x == 0) {
        float* p = part + ((size_t)row * n_split + split) * (d + 2);
        p[0] = mm;
        p[1] = ll;
    }
}

// Merge the n_split slices of each query row. grid: n_heads * T blocks; any number of threads.
extern "C" __global__ void attention_combine(
    const float* __restrict__ part, int T, int n_heads, int d, int n_split, float* __restrict__ out)
{
    int row = blockIdx.x;
    int h = row / T, t = row % T;
    const float* p = part + (size_t)row * n_split * (d + 2);
    float mm = -__int_as_float(0x7f800000);
    for (int s = 0; s < n_split; s++)
        if (p[s * (d + 2) + 1] > 0.0f) mm = fmaxf(mm, p[s * (d + 2)]);
    float ll = 0.0f;
    for (int s = 0; s < n_split; s++) {
        float ls = p[s * (d + 2) + 1];
        if (ls > 0.0f) ll += ls * expf(p[s * (d + 2)] - mm);
    }
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < n_split; s++) {
            float ls = p[s * (d + 2) + 1];
            if (ls > 0.0f) a += p[s * (d + 2) + 2 + e] * expf(p[s * (d + 2)] - mm);
        }
        out[((size_t)t * n_heads + h) * d + e] = ll > 0.0f ? a / ll : 0.0f;
    }
}
