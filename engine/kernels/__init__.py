"""Compiled CPU products on ggml blocks (numba): activation quantization as ggml-cpu does it (Q8_0, Q8_1, Q8_K),
integer block dot products per type, fast dequantization of row tiles for batched prefill.

Imports only `engine.quant` (the type table and the NumPy reference) and numpy/numba; the NumPy path never
needs this package.
"""
