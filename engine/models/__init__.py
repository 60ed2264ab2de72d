"""Architectures, one file each; `registry.model_class` imports them all on first use."""
