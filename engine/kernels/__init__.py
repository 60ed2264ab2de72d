"""Compiled CPU products on ggml blocks (numba), by family: `legacy/` (Q4_0..Q8_0 and the float weights' table),
`kquant/` (Q2_K..Q6_K), `iquant/` (IQ1..IQ4), `floats/` (F32/F16/BF16 vec_dot and tinyBLAS). Beside them: `types` (the
one table of each weight type's vec_dot type and the activation block layouts), `activations` and `q8k` (activation
quantization as ggml-cpu does it: Q8_0, Q8_1, Q8_K), `simd` (LLVM vector helpers), `dispatch` (`BlockProduct`: the
kernel llama.cpp's CPU backend would run for a weight and batch, from the families' tables), `paths` (repacked and
tiled variants), `fallback` (the NumPy path), `precompile`, `compile_jobs` and `pages` (first-start compile and
its helper's program, memory), `warmed` (which types' kernels numba's cache holds: new ones compile in a helper).

Imports only `engine.quant` (the type table and the NumPy reference) and numpy/numba; the NumPy path never
needs this package.
"""
