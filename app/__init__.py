"""GGUF Lens desktop app: a chat beside lenses that show what happens inside the model."""
