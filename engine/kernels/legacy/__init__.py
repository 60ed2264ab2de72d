"""The legacy quants (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and the float weights' gemv/gemm table (`family`): byte-plane
products (`dot`, `products`, `repack`), integer prompt tiles (`gemm`, `gemm_vnni`), Q8_0 rows in sixteens
(`q8_0_x16`), dequantization (`dequant`) and the NumPy reference (`ref`)."""
