"""The i-quants (IQ1..IQ4): vec_dot on Q8_K (Q8_0 for IQ4_NL) (`dot`), row decoding (`rows`, `simd`), the tiled
batches (`tiled`, `tiles`)."""
