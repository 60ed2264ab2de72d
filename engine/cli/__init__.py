"""The `gguf-lens` command: `main` (parser, model commands), `quant` (quantize, compare), `bench`.

The top of the engine: may import anything in `engine`, and prints (the only engine package that does).
"""
