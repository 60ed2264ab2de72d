"""What executes a model: the numerics object chosen at load (`numerics`: float32 reference or ggml-exact), the
compiled decode step built from the model's one block graph (`decode_plan` lays out the blocks, `decode_bind` binds
their products, `decode_step` the compiled non-matrix work of a block, `decode_mixer` a hybrid's recurrent mixer and
gated attention's output gate), the warm-up before the first token (`warmup`) and the background compile of a first
start's late kernels (`late`, a helper process's program). Models never import it: they are handed a numerics object
and call it."""
