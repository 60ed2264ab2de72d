"""Compiled CPU products on ggml blocks (numba): activation quantization as ggml-cpu does it (Q8_0, Q8_1, Q8_K),
integer block dot products per type, each in the order of the kernel llama.cpp's CPU backend picks for that weight
and batch (vec_dot, the repacked q4_K_8x8 gemv/gemm, the tiled k-quant path), and dequantization of row tiles.

Imports only `engine.quant` (the type table and the NumPy reference) and numpy/numba; the NumPy path never
needs this package.
"""
