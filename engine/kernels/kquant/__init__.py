"""The k-quants (Q2_K..Q6_K): the per-type table (`family`), vec_dot (`dot`, on the integer `lanes`), the repacked
q4_K_8x8 path (`repack`, `repack_ref`), the tiled batches (`tiled`, `vnni`), dequantization (`dequant`) and the
NumPy reference (`ref`)."""
