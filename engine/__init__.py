"""GGUF Lens engine: GGUF reading, quantization, tokenizers and model forwards on NumPy (CuPy optional)."""
