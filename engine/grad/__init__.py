"""Gradients through the model as it runs: reverse mode on a tape of the float32 reference pass.

The model code is not changed and not copied. `engine.grad.tape.Var` is an array that NumPy hands back to it through
`__array_ufunc__` / `__array_function__`: every op the unchanged block graph applies (the products with the dequantized
weights, RMSNorm's mean and square root, RoPE's slices and writes, the softmax, the GLU, the residual adds, reshapes,
transposes) is computed on the plain values and recorded with its inputs on a `Tape`. `engine.grad.vjps` holds one
vector-Jacobian product per NumPy op, and `Tape.backward` walks the tape in reverse composing them, so a gradient is
never written per model or per layer. `engine.grad.backward` runs a model's own graph on such values: the numerics
object is the float32 reference with a KV cache that keeps the traced K/V (`TapeNumerics`, `TapeCache`), the weights
are used as they are dequantized and get no gradient, and the caller asks for the gradient of a scalar (a logit
difference) with respect to the input embeddings and any hook point (TransformerLens names).

    from engine.grad.backward import gradient
    g = gradient(model, ids, target, contrast, points=["blocks.3.attn.hook_z"])
    g.value, g.embeddings (T, dim), g.points["blocks.3.attn.hook_z"] (T, n_heads, head_dim)

Float64 (`dtype=np.float64`) runs the same graph in double precision: what the finite-difference checks use.
A Mixture-of-Experts FFN runs as `engine.grad.experts.TracedMoE` during the pass (its kernels write into preallocated
arrays): the same maths on traced values, the routing frozen as the pass chose it; Gemma 4's experts branch as
`TracedGemma4Experts`. A DeltaNet layer (Qwen3.5, Qwen3-Next) gets `engine.grad.recurrent`'s ops: its gates,
convolution, norms and delta rule spelled in NumPy, a token at a time, so the recurrence's gradient is composed like
the rest. An encoder-decoder (T5) runs its own encoder and decoder on traced values (`engine.grad.seq2seq`), the
gradient taken with respect to the encoder's and the decoder's input embeddings. An op with no VJP (a compiled kernel
reached on a traced value) raises a LensError naming it, and the model is left as it was.
"""
