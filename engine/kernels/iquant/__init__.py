"""The i-quants (IQ1..IQ4) and MXFP4: vec_dot on Q8_K (Q8_0 for IQ4_NL and MXFP4) (`dot`), row decoding (`rows`,
`simd`), the 8x8 repack paths of IQ4_NL and MXFP4 (`eights`), the tiled batches (`tiled`, `tiles`)."""
