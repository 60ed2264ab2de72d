"""Products of F32, F16 and BF16 weights: ggml-cpu's vec_dot order (`vec_dot`) and llamafile's tinyBLAS batches
(`tinyblas`), also used by the prompt attention's products."""
