// Fused dequantize-and-multiply for single-token decode: y = W x with W in its ggml blocks.
//
// One warp per output row: each lane decodes 4 consecutive weights of the row per step (a warp covers
// 128 weights a step, coalesced across the lanes) and multiplies them with the input held in shared
// memory; a shuffle reduction gives the row's dot product. One launch covers up to three matrices that
// read the same input (q/k/v, gate/up), each with its own type and output.
//
// The input can be prepared in the block's prologue, which saves a launch per use in the decode step:
//   norm_w != 0:  x <- rms_norm(x) * norm_w         (as engine/models/base.py rms_norm)
//   act != 0:     x <- act(x) * x2                  (1: silu, 2: gelu_tanh; the gated FFN input)
// and the output can be added to a residual: y <- resid + W x, resid laid out as the outputs stacked
// (row r of segment 1 is resid[rows0 + r]); it may alias them.
#include "ggml_blocks.cu"

#define GEMV_WARPS 8

__device__ __forceinline__ float gl_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total
__device__ __forceinline__ float gl_block_sum(float v, float* red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = gl_warp_sum(v);
    __syncthreads();  // red may still be read by a previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < n_warps ? red[lane] : 0.0f;
    return gl_warp_sum(t);
}

__device__ __forceinline__ float gl_silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float gl_gelu_tanh(float x) {
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

__device__ __forceinline__ float gl_act(int act, float x) {
    return act == 1 ? gl_silu(x) : act == 2 ? gl_gelu_tanh(x) : x;
}

// the dot product of one row with xs, for one weight type (the switch stays outside the loop)
#define GL_ROW_DOT(FN)                                              \
    _Pragma("unroll 4")                                             \
    for (int c = lane * 4; c < n_in; c += 128) {                    \
        float w[4];                                                 \
        FN(row, c, w);                                              \
        float4 xv = *reinterpret_cast<const float4*>(xs + c);       \
        acc += w[0] * xv.x + w[1] * xv.y + w[2] * xv.z + w[3] * xv.w; \
    }

__device__ __forceinline__ float gl_row_dot(int type, const gl_u8* row, const float* xs, int n_in, int lane) {
    float acc = 0.0f;
    switch (type) {
        case GL_F32: GL_ROW_DOT(gl_dq4_f32) break;
        case GL_F16: GL_ROW_DOT(gl_dq4_f16) break;
        case GL_BF16: GL_ROW_DOT(gl_dq4_bf16) break;
        case GL_Q4_0: GL_ROW_DOT(gl_dq4_q4_0) break;
        case GL_Q4_1: GL_ROW_DOT(gl_dq4_q4_1) break;
        case GL_Q5_0: GL_ROW_DOT(gl_dq4_q5_0) break;
        case GL_Q5_1: GL_ROW_DOT(gl_dq4_q5_1) break;
        case GL_Q8_0: GL_ROW_DOT(gl_dq4_q8_0) break;
        case GL_Q2_K: GL_ROW_DOT(gl_dq4_q2_k) break;
        case GL_Q3_K: GL_ROW_DOT(gl_dq4_q3_k) break;
        case GL_Q4_K: GL_ROW_DOT(gl_dq4_q4_k) break;
        case GL_Q5_K: GL_ROW_DOT(gl_dq4_q5_k) break;
        case GL_Q6_K: GL_ROW_DOT(gl_dq4_q6_k) break;
        default: acc = __int_as_float(0x7fc00000);  // an unknown type poisons the output (NaN)
    }
    return gl_warp_sum(acc);
}

// grid: ceil((rows0 + rows1 + rows2) / rows_per_block) blocks of GEMV_WARPS * 32 threads;
// dynamic shared memory: n_in floats. n_in % 4 == 0.
extern "C" __global__ void gemv(
    const float* __restrict__ x, const float* __restrict__ x2, const float* __restrict__ norm_w,
    float eps, int act, int n_in,
    const gl_u8* __restrict__ w0, int type0, int rows0, int rb0, float* y0,
    const gl_u8* __restrict__ w1, int type1, int rows1, int rb1, float* y1,
    const gl_u8* __restrict__ w2, int type2, int rows2, int rb2, float* y2,
    const float* resid, int rows_per_block)
{
    extern __shared__ __align__(16) float xs[];  // read as float4
    __shared__ float red[32];
    int tid = threadIdx.x, nt = blockDim.x;
    float ss = 0.0f;
    for (int i = tid; i < n_in; i += nt) {
        float v = x[i];
        if (act) v = gl_act(act, v) * x2[i];
        xs[i] = v;
        ss += v * v;
    }
    if (norm_w) {
        float total = gl_block_sum(ss, red);
        float inv = 1.0f / sqrtf(total / (float)n_in + eps);
        for (int i = tid; i < n_in; i += nt) xs[i] = (xs[i] * inv) * norm_w[i];
    }
    __syncthreads();

    int lane = tid & 31, warp = tid >> 5;
    int n_rows = rows0 + rows1 + rows2;
    int r_end = min(n_rows, (blockIdx.x + 1) * rows_per_block);
    for (int r = blockIdx.x * rows_per_block + warp; r < r_end; r += GEMV_WARPS) {
        const gl_u8* w; int type, rb, local; float* y;
        if (r < rows0) { w = w0; type = type0; rb = rb0; local = r; y = y0; }
        else if (r < rows0 + rows1) { w = w1; type = type1; rb = rb1; local = r - rows0; y = y1; }
        else { w = w2; type = type2; rb = rb2; local = r - rows0 - rows1; y = y2; }
        float dot = gl_row_dot(type, w + (size_t)local * rb, xs, n_in, lane);
        if (lane == 0) y[local] = resid ? resid[r] + dot : dot;
    }
}
