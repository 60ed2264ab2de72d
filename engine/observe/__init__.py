"""Observation of a forward pass, opt-in and free when off.

`recorder` collects post-RoPE queries and hidden states while a model runs (passed down like the cache);
`attention_maps` recomputes attention rows and the layer x head grid on demand, `attention_steps` one cell
step by step, `positions` the sinusoidal and RoPE curves, `t5_maps` an encoder-decoder's three kinds of attention
and its learned position bias against distance, `recurrent` what a DeltaNet layer's output reads from each earlier
token (exact coefficients from the delta rule's decays, betas and keys), `recurrent_extend` those coefficients grown by
the new positions' rows as a recording grows. May import `engine.models` (its maths and the
attention spec), `engine.cache` and below; never `engine.model`, `engine.generate` or the CLI.
"""
