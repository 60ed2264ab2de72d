"""How each op of a layer is computed, each op once: `reference` (the textbook float32 maths) and ggml-cpu's exact
bits (`ggml`: norms, RoPE, softmax, the GLUs; `ggml_math` the libm and SIMD scalar maths they use, `ggml_kernels` their
compiled rows), and the attention products (`attention_ggml` as ggml-cpu multiplies K*q and V*w, `attention_prefill` a
prompt's attention in one compiled call, `attention_decode` one token's float32 attention in one call,
`attention_tiled` long prompts in tiles). Imports kernels and quant only, never a model or the runtime."""
