"""Architectures, and only them: one short file per architecture (`llama`, `qwen2`, `qwen3`, `phi3`, `gemma2`,
`gemma3`), each the switches and metadata of the one block graph in `transformer` (its seams: `attention`, the FFN of
`ffn`, the norms, and the mixer: attention, or a recurrent layer of `deltanet` in the hybrids `qwen35` and
`qwen35moe`), and the shared definitions they stand on: `args` (hyper-parameters, typed metadata), `weights`
(shape-checked tensors), `decoder` (the forward contract and the numerics protocol a model is handed), `rope` (pair
layouts and scaling) and `registry` (`general.architecture` -> class; it imports every other module here on first
use). `t5` is the one encoder-decoder, on the shared parts of `encoder_decoder` (relative position buckets, the
encoding kept on the cache). How ops are computed lives in engine.ops, how a model is executed in engine.runtime.
"""
