"""Architectures. Importing this package registers each of them."""
from engine.models import llama  # noqa: F401
from engine.models.registry import ARCHITECTURES, model_class, register

__all__ = ["ARCHITECTURES", "model_class", "register"]
