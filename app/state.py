"""AppState: the one QObject of app state; each attribute has its own `<name>_changed` signal."""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Signal


def _attr(name: str, doc: str) -> property:
    """A property that stores into self._values and emits `<name>_changed` when the value really changes."""

    def get(self: AppState) -> Any:
        return self._values[name]

    def put(self: AppState, value: Any) -> None:
        old = self._values[name]
        if old is value or (type(old) is type(value) and _same(old, value)):
            return
        self._values[name] = value
        getattr(self, f"{name}_changed").emit(value)

    return property(get, put, doc=doc)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except (ValueError, TypeError):  # numpy arrays and other odd equality
        return False


class AppState(QObject):
    """What the views show; workers never touch it, the main window copies their signals into it."""

    model_changed = Signal(object)
    loading_changed = Signal(object)
    backend_changed = Signal(object)
    generating_changed = Signal(object)
    tok_s_changed = Signal(object)
    ctx_used_changed = Signal(object)
    ctx_size_changed = Signal(object)
    kv_bytes_changed = Signal(object)
    memory_bytes_changed = Signal(object)
    settings_changed = Signal(object)
    model_record_changed = Signal(object)
    attention_record_changed = Signal(object)
    kv_type_changed = Signal(object)
    kv_full_bytes_changed = Signal(object)
    attention_path_changed = Signal(object)

    model = _attr("model", "ModelInfo of the loaded model, or None")
    loading = _attr("loading", "(what, fraction) while a model loads or downloads, else None")
    backend = _attr("backend", "the compute backend's name")
    generating = _attr("generating", "True while a reply streams")
    tok_s = _attr("tok_s", "generation speed of the last reply, tokens per second")
    ctx_used = _attr("ctx_used", "tokens in the KV cache")
    ctx_size = _attr("ctx_size", "the KV cache's context length")
    kv_bytes = _attr("kv_bytes", "bytes the KV cache holds")
    memory_bytes = _attr("memory_bytes", "resident memory of the process")
    settings = _attr("settings", "the Settings record (replace it, don't mutate it)")
    model_record = _attr("model_record", "app.records.model.ModelRecord for the lenses, or None")
    attention_record = _attr("attention_record", "app.records.attention.AttentionRecord of the last reply, or None")
    kv_type = _attr("kv_type", "the KV cache's type: 'F32', 'F16', 'Q8_0' or 'Q4_0'")
    kv_full_bytes = _attr("kv_full_bytes", "bytes the KV cache would hold at its full context, or None if unknown")
    attention_path = _attr("attention_path", "the attention path of the last prefill: 'plain', 'tiled', ... or ''")

    def __init__(self, settings: Any = None, parent: QObject | None = None):
        super().__init__(parent)
        self._values: dict[str, Any] = {
            "model": None, "loading": None, "backend": "numpy", "generating": False, "tok_s": 0.0,
            "ctx_used": 0, "ctx_size": 0, "kv_bytes": 0, "memory_bytes": 0, "settings": settings,
            "model_record": None, "attention_record": None, "kv_type": "F16", "kv_full_bytes": None,
            "attention_path": "",
        }
