// Dequantize ggml blocks to float32 (or float16) tiles: the prefill path multiplies these with cuBLAS,
// and the tests compare them bit for bit with engine/quant's NumPy dequantizers.
#include "ggml_blocks.cu"

// Up to three matrices of n_cols columns stacked into one (rows0 + rows1 + rows2, n_cols) tile, as
// FusedLinear stacks q/k/v. One thread per 4 weights, grid-stride. out_f16 != 0 writes fp16 bits instead.
extern "C" __global__ void dequant_rows(
    const gl_u8* __restrict__ w0, int type0, int rows0, int rb0,
    const gl_u8* __restrict__ w1, int type1, int rows1, int rb1,
    const gl_u8* __restrict__ w2, int type2, int rows2, int rb2,
    int n_cols, float* out, gl_u16* out_f16)
{
    int groups = n_cols >> 2;
    long long total = (long long)(rows0 + rows1 + rows2) * groups;
    for (long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x; g < total;
         g += (long long)gridDim.x * blockDim.x) {
        int r = (int)(g / groups), c = (int)(g % groups) * 4;
        const gl_u8* w; int type, rb, local;
        if (r < rows0) { w = w0; type = type0; rb = rb0; local = r; }
        else if (r < rows0 + rows1) { w = w1; type = type1; rb = rb1; local = r - rows0; }
        else { w = w2; type = type2; rb = rb2; local = r - rows0 - rows1; }
        float v[4];
        if (!gl_dq4(type, w + (size_t)local * rb, c, v)) v[0] = v[1] = v[2] = v[3] = __int_as_float(0x7fc00000);
        size_t at = (size_t)r * n_cols + c;
        if (out_f16) {
            for (int k = 0; k < 4; k++) out_f16[at + k] = gl_float_to_half(v[k]);
        } else {
            float4 f;
            f.x = v[0]; f.y = v[1]; f.z = v[2]; f.w = v[3];
            *reinterpret_cast<float4*>(out + at) = f;
        }
    }
}

// Embedding look-up: out[t] = row ids[t] of the table, times scale (Gemma scales by sqrt(dim)).
// ids may be the decode state buffer, whose first int is the token. grid: T blocks.
extern "C" __global__ void embed_rows(
    const gl_u8* __restrict__ table, int type, int rb, int n_cols, const int* __restrict__ ids,
    int n_vocab, float scale, int use_scale, float* out)
{
    int t = blockIdx.x;
    int id = ids[t];
    float* o = out + (size_t)t * n_cols;
    if (id < 0 || id >= n_vocab) {  // the host checks ids; a bad one poisons the row instead of reading outside
        for (int c = threadIdx.x; c < n_cols; c += blockDim.x) o[c] = __int_as_float(0x7fc00000);
        return;
    }
    const gl_u8* row = table + (size_t)id * rb;
    for (int c = threadIdx.x * 4; c < n_cols; c += blockDim.x * 4) {
        float v[4];
        gl_dq4(type, row, c, v);
        for (int k = 0; k < 4; k++) o[c + k] = use_scale ? v[k] * scale : v[k];
    }
}
