"""Interventions on a loaded model's forward pass, the "what if" side of the lenses.

- `ablation`: switch attention heads off (their output zeroed before the attention output product, which is what a
  copy of the file with that head's `attn_output` columns set to zero computes);
- `control_vector`: llama.cpp's control vectors (read, checked, summed, added to block outputs, written);
  `cvector_mean` makes one from contrasting prompt pairs as llama-cvector-generator's mean method does;
- `lora`: LoRA adapters in llama.cpp's GGUF format, added to each adapted product as build_lora_mm does;
- `hooks`: TransformerLens-named hook points to read or replace any activation;
- `patching`: the activation patching map (layers x positions) between a clean and a corrupted prompt.

What is set stays on the model until cleared; each kind has a `describe` for a reply's signature. LoRA adapters and
control vectors run in the compiled decode step (engine.runtime.decode_lora, decode_plan); while an ablation or a hook
is set the compiled step steps aside and the graph runs op by op (the same numbers, a little slower).
"""
