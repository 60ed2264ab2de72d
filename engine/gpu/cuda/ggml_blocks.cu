// ggml block decoding for the CUDA kernels: four consecutive weights of a row at a time.
//
// Included (textually, by engine/gpu/kernels.py and by #include for nvcc) into every kernel file.
// It compiles three ways: as device code under NVRTC (CuPy RawModule), under nvcc, and as plain
// host C++ (tests/engine/test_cuda_compile.py builds it with g++ and checks every type bit for bit
// against engine/quant's NumPy dequantizers). So: no headers, no templates that NVRTC would need
// name expressions for, and float operations written as the NumPy code orders them (__fmul_rn and
// __fadd_rn keep nvcc from contracting a*b+c into one fma, which would round differently).
//
// Block layouts (bytes, little-endian; d, m, dmin are fp16), as engine/quant/legacy.py and kquants.py:
//   Q4_0  | d:2 | qs:16 |                       w = (nibble - 8) * d
//   Q4_1  | d:2 | m:2 | qs:16 |                 w = nibble * d + m
//   Q5_0  | d:2 | qh:4 | qs:16 |                w = ((nibble | bit << 4) - 16) * d
//   Q5_1  | d:2 | m:2 | qh:4 | qs:16 |          w = (nibble | bit << 4) * d + m
//   Q8_0  | d:2 | qs:32 int8 |                  w = qs * d
//   qs[i] holds weight i in its low nibble and weight i + 16 in its high one; bit j of qh is weight j's fifth bit.
//   Q2_K  | scales:16 | qs:64 | d:2 | dmin:2 |                  w = d*(sc & 15) * q - dmin*(sc >> 4)
//   Q3_K  | hmask:32 | qs:64 | scales:12 | d:2 |               w = d*(scale6 - 32) * (q2 - (hbit ? 0 : 4))
//   Q4_K  | d:2 | dmin:2 | scales:12 | qs:128 |                w = d*sc * q - dmin*m   (get_scale_min_k4)
//   Q5_K  | d:2 | dmin:2 | scales:12 | qh:32 | qs:128 |        as Q4_K with qh bit s of byte l as the fifth bit
//   Q6_K  | ql:128 | qh:64 | scales:16 int8 | d:2 |           w = d*scale * (q6 - 32)
//   element e of a super-block: h = e / 128, j = (e % 128) / 32, l = e % 32, s = sub-block.
#ifndef GGML_BLOCKS_CU
#define GGML_BLOCKS_CU

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define GL_DEV __device__ __forceinline__
#else
#define GL_DEV static inline
#endif

typedef unsigned char gl_u8;
typedef signed char gl_i8;
typedef unsigned short gl_u16;
typedef unsigned int gl_u32;

// ggml type ids (ggml.h enum ggml_type)
#define GL_F32 0
#define GL_F16 1
#define GL_Q4_0 2
#define GL_Q4_1 3
#define GL_Q5_0 6
#define GL_Q5_1 7
#define GL_Q8_0 8
#define GL_Q2_K 10
#define GL_Q3_K 11
#define GL_Q4_K 12
#define GL_Q5_K 13
#define GL_Q6_K 14
#define GL_BF16 30

GL_DEV float gl_bits_to_float(gl_u32 bits) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(bits);
#else
    union { gl_u32 u; float f; } v;
    v.u = bits;
    return v.f;
#endif
}

GL_DEV gl_u32 gl_float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    union { gl_u32 u; float f; } v;
    v.f = f;
    return v.u;
#endif
}

// fp16 bits -> float32, exact (a widening never rounds)
GL_DEV float gl_half_to_float(gl_u16 h) {
#if defined(__CUDA_ARCH__)
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    gl_u32 sign = (gl_u32)(h & 0x8000u) << 16;
    gl_u32 exp = (h >> 10) & 0x1fu;
    gl_u32 man = h & 0x3ffu;
    if (exp == 0) {
        float f = (float)man * 5.9604644775390625e-08f;  // subnormal: man * 2^-24, exact
        return sign ? -f : f;
    }
    if (exp == 31) return gl_bits_to_float(sign | 0x7f800000u | (man << 13));
    return gl_bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
#endif
}

// float32 -> fp16 bits, round to nearest even (KV cache rows and f16 tiles), as NumPy's astype(float16)
GL_DEV gl_u16 gl_float_to_half(float f) {
#if defined(__CUDA_ARCH__)
    gl_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    gl_u32 x = gl_float_to_bits(f);
    gl_u32 sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) return (gl_u16)(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));  // NaN, inf
    if (a >= 0x477ff000u) return (gl_u16)(sign | 0x7c00u);  // 65520 and up round to inf
    if (a < 0x38800000u) {  // below 2^-14: a subnormal half, round(f * 2^24) to nearest even
        float scaled = gl_bits_to_float(a) * 16777216.0f;  // exact: a power-of-two scale
        gl_u32 i = (gl_u32)scaled;
        float frac = scaled - (float)i;
        if (frac > 0.5f || (frac == 0.5f && (i & 1u))) i++;
        return (gl_u16)(sign | i);
    }
    gl_u32 h = ((((a >> 23) - 112u) << 10) | ((a & 0x7fffffu) >> 13));
    gl_u32 rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;  // a carry into the exponent is still right
    return (gl_u16)(sign | h);
#endif
}

GL_DEV float gl_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

GL_DEV float gl_add(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

GL_DEV float gl_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

GL_DEV float gl_f16_at(const gl_u8* p) { return gl_half_to_float((gl_u16)(p[0] | (p[1] << 8))); }

GL_DEV gl_u32 gl_u32_at(const gl_u8* p) {
    return (gl_u32)p[0] | ((gl_u32)p[1] << 8) | ((gl_u32)p[2] << 16) | ((gl_u32)p[3] << 24);
}

// ---- one function per type: weights j..j+3 of a row (j % 4 == 0) into w[0..3]

GL_DEV void gl_dq4_f32(const gl_u8* row, int j, float* w) {
    for (int k = 0; k < 4; k++) w[k] = gl_bits_to_float(gl_u32_at(row + 4 * (j + k)));
}

GL_DEV void gl_dq4_f16(const gl_u8* row, int j, float* w) {
    for (int k = 0; k < 4; k++) w[k] = gl_f16_at(row + 2 * (j + k));
}

GL_DEV void gl_dq4_bf16(const gl_u8* row, int j, float* w) {
    for (int k = 0; k < 4; k++) {
        const gl_u8* p = row + 2 * (j + k);
        w[k] = gl_bits_to_float(((gl_u32)p[0] | ((gl_u32)p[1] << 8)) << 16);
    }
}

// the 4-bit quant of weight o (0..31) of a legacy block whose qs starts at q
GL_DEV int gl_nibble(const gl_u8* q, int o) { return o < 16 ? (q[o] & 15) : (q[o - 16] >> 4); }

GL_DEV void gl_dq4_q4_0(const gl_u8* row, int j, float* w) {
    const gl_u8* b = row + 18 * (j >> 5);
    int o = j & 31;
    float d = gl_f16_at(b);
    for (int k = 0; k < 4; k++) w[k] = gl_mul(d, (float)(gl_nibble(b + 2, o + k) - 8));
}

GL_DEV void gl_dq4_q4_1(const gl_u8* row, int j, float* w) {
    const gl_u8* b = row + 20 * (j >> 5);
    int o = j & 31;
    float d = gl_f16_at(b), m = gl_f16_at(b + 2);
    for (int k = 0; k < 4; k++) w[k] = gl_add(gl_mul((float)gl_nibble(b + 4, o + k), d), m);
}

GL_DEV void gl_dq4_q5_0(const gl_u8* row, int j, float* w) {
    const gl_u8* b = row + 22 * (j >> 5);
    int o = j & 31;
    float d = gl_f16_at(b);
    gl_u32 qh = gl_u32_at(b + 2);
    for (int k = 0; k < 4; k++) {
        int q = gl_nibble(b + 6, o + k) | (int)(((qh >> (o + k)) & 1u) << 4);
        w[k] = gl_mul(d, (float)(q - 16));
    }
}

GL_DEV void gl_dq4_q5_1(const gl_u8* row, int j, float* w) {
    const gl_u8* b = row + 24 * (j >> 5);
    int o = j & 31;
    float d = gl_f16_at(b), m = gl_f16_at(b + 2);
    gl_u32 qh = gl_u32_at(b + 4);
    for (int k = 0; k < 4; k++) {
        int q = gl_nibble(b + 8, o + k) | (int)(((qh >> (o + k)) & 1u) << 4);
        w[k] = gl_add(gl_mul((float)q, d), m);
    }
}

GL_DEV void gl_dq4_q8_0(const gl_u8* row, int j, float* w) {
    const gl_u8* b = row + 34 * (j >> 5);
    int o = j & 31;
    float d = gl_f16_at(b);
    for (int k = 0; k < 4; k++) w[k] = gl_mul((float)(gl_i8)b[2 + o + k], d);
}

GL_DEV void gl_dq4_q2_k(const gl_u8* row, int j, float* w) {
    const gl_u8* b = row + 84 * (j >> 8);
    int e = j & 255, h = e >> 7, jj = (e & 127) >> 5, l = e & 31;
    int sc = b[e >> 4];  // the 4 weights share one 16-weight sub-block
    float dl = gl_mul(gl_f16_at(b + 80), (float)(sc & 15));
    float ml = gl_mul(gl_f16_at(b + 82), (float)(sc >> 4));
    for (int k = 0; k < 4; k++) {
        int q = (b[16 + 32 * h + l + k] >> (2 * jj)) & 3;
        w[k] = gl_sub(gl_mul(dl, (float)q), ml);
    }
}

GL_DEV void gl_dq4_q3_k(const gl_u8* row, int j, float* w) {
    const gl_u8* b = row + 110 * (j >> 8);
    int e = j & 255, h = e >> 7, jj = (e & 127) >> 5, l = e & 31, s = e >> 4;
    const gl_u8* packed = b + 96;
    int low = s < 8 ? (packed[s] & 15) : (packed[s - 8] >> 4);
    int high = (packed[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
    int scale = (int)(gl_i8)(gl_u8)(low | (high << 4)) - 32;
    float dl = gl_mul(gl_f16_at(b + 108), (float)scale);
    for (int k = 0; k < 4; k++) {
        int q2 = (b[32 + 32 * h + l + k] >> (2 * jj)) & 3;
        int hbit = (b[l + k] >> (e >> 5)) & 1;
        w[k] = gl_mul(dl, (float)((q2 | (hbit << 2)) - 4));
    }
}

// get_scale_min_k4 in ggml-quants.c: the 6-bit scale and min of sub-block s (0..7)
GL_DEV void gl_scale_min_k4(const gl_u8* q, int s, int* sc, int* m) {
    if (s < 4) {
        *sc = q[s] & 63;
        *m = q[s + 4] & 63;
    } else {
        *sc = (q[s + 4] & 15) | ((q[s - 4] >> 6) << 4);
        *m = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
    }
}

GL_DEV void gl_dq4_q4_k(const gl_u8* row, int j, float* w) {
    const gl_u8* b = row + 144 * (j >> 8);
    int e = j & 255, s = e >> 5, l = e & 31;
    int sc, m;
    gl_scale_min_k4(b + 4, s, &sc, &m);
    float dl = gl_mul(gl_f16_at(b), (float)sc);
    float ml = gl_mul(gl_f16_at(b + 2), (float)m);
    const gl_u8* qs = b + 16 + 32 * (s >> 1);
    int shift = 4 * (s & 1);
    for (int k = 0; k < 4; k++) w[k] = gl_sub(gl_mul(dl, (float)((qs[l + k] >> shift) & 15)), ml);
}

GL_DEV void gl_dq4_q5_k(const gl_u8* row, int j, float* w) {
    const gl_u8* b = row + 176 * (j >> 8);
    int e = j & 255, s = e >> 5, l = e & 31;
    int sc, m;
    gl_scale_min_k4(b + 4, s, &sc, &m);
    float dl = gl_mul(gl_f16_at(b), (float)sc);
    float ml = gl_mul(gl_f16_at(b + 2), (float)m);
    const gl_u8* qs = b + 48 + 32 * (s >> 1);
    int shift = 4 * (s & 1);
    for (int k = 0; k < 4; k++) {
        int q = ((qs[l + k] >> shift) & 15) | (((b[16 + l + k] >> s) & 1) << 4);
        w[k] = gl_sub(gl_mul(dl, (float)q), ml);
    }
}

GL_DEV void gl_dq4_q6_k(const gl_u8* row, int j, float* w) {
    const gl_u8* b = row + 210 * (j >> 8);
    int e = j & 255, h = e >> 7, r = e & 127, kk = r >> 5, l = e & 31;
    float dl = gl_mul(gl_f16_at(b + 208), (float)(gl_i8)b[192 + (e >> 4)]);
    const gl_u8* ql = b + 64 * h + (r & 63);
    const gl_u8* qh = b + 128 + 32 * h + l;
    int shift = 4 * (r >> 6);
    for (int k = 0; k < 4; k++) {
        int q = ((ql[k] >> shift) & 15) | (((qh[k] >> (2 * kk)) & 3) << 4);
        w[k] = gl_mul(dl, (float)(q - 32));
    }
}

// any supported type; returns 0 for a type it does not know
GL_DEV int gl_dq4(int type, const gl_u8* row, int j, float* w) {
    switch (type) {
        case GL_F32: gl_dq4_f32(row, j, w); return 1;
        case GL_F16: gl_dq4_f16(row, j, w); return 1;
        case GL_BF16: gl_dq4_bf16(row, j, w); return 1;
        case GL_Q4_0: gl_dq4_q4_0(row, j, w); return 1;
        case GL_Q4_1: gl_dq4_q4_1(row, j, w); return 1;
        case GL_Q5_0: gl_dq4_q5_0(row, j, w); return 1;
        case GL_Q5_1: gl_dq4_q5_1(row, j, w); return 1;
        case GL_Q8_0: gl_dq4_q8_0(row, j, w); return 1;
        case GL_Q2_K: gl_dq4_q2_k(row, j, w); return 1;
        case GL_Q3_K: gl_dq4_q3_k(row, j, w); return 1;
        case GL_Q4_K: gl_dq4_q4_k(row, j, w); return 1;
        case GL_Q5_K: gl_dq4_q5_k(row, j, w); return 1;
        case GL_Q6_K: gl_dq4_q6_k(row, j, w); return 1;
        default: return 0;
    }
}

#endif  // GGML_BLOCKS_CU
