"""Measuring and changing a model: `compare` (KLD statistics between two runs, per-layer divergence) and
`requantize` (llama-quantize's presets and rules, in memory or to a file).

May import `engine.generate`, `engine.model` and below; only the CLI and the app sit above it.
"""
