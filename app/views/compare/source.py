"""Compare's B menu: what B is, and the adapters the Experiments tab has on the chat's model, offered as they are.

B is the Quantization lens's overrides, a preset, a searched mix, the file itself (with another KV cache), another
GGUF, the file with an adapter chosen here, float32 numerics, or the file with an adapter file (LoRA or control vector)
that Experiments has on the chat's model, at its scale there: chosen in one click, without asking for the file again.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QWidget

from app.records.interventions import LoadedAdapter

SOURCES = (("overrides", "overrides", "the Quantization lens's overrides"),
           ("preset", "a preset:", "the file requantized to a llama-quantize preset"),
           ("mix", "a searched mix", "a mix found by 'Find the best mix' (click a ◆ point of the Presets page)"),
           ("file", "the file", "the file again (same weights): with another KV cache type"),
           ("gguf", "another GGUF…", "another GGUF file of the same model"),
           ("adapter", "file + LoRA…", "the file with a LoRA adapter (llama.cpp's GGUF format) applied: what the "
                                      "fine-tune changes, by layer and token"),
           ("numerics", "float32 numerics", "the file in float32 numerics (A: ggml's 8-bit activations)"))
ITEM_CHARS = 30  # a B menu item longer than this is elided (its tooltip says it whole): the menu stays narrow
LOADED_CHARS = 44  # an Experiments adapter's item: its scale stays in sight
LOADED = "loaded:"  # the item data of the Experiments adapters: 'loaded:0', 'loaded:1'


class SourceBox(QComboBox):
    """The B menu: one item per kind of B (its key as item data), then one per adapter on the chat's model."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        for i, (key, text, tip) in enumerate(SOURCES):
            self.addItem(text, key)
            self.setItemData(i, tip, Qt.ItemDataRole.ToolTipRole)
        self.setToolTip("What B is; A is always the file as it is on disk")
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.loaded: tuple[LoadedAdapter, ...] = ()

    def select(self, key: str) -> None:
        """Choose the item of this key ('preset', 'adapter', 'loaded:0', ...)."""
        self.setCurrentIndex(self.findData(key))

    def loaded_choice(self) -> LoadedAdapter | None:
        """The Experiments adapter chosen as B, if one is."""
        key = str(self.currentData())
        return self.loaded[int(key[len(LOADED):])] if key.startswith(LOADED) else None

    def set_loaded(self, adapters: tuple[LoadedAdapter, ...]) -> LoadedAdapter | None:
        """Offer these adapters (the ones before go); the one chosen stays chosen while it is offered. Returns the
        chosen one when it is no longer offered (the caller keeps B as it was)."""
        chosen = self.loaded_choice()
        for i in range(self.count() - 1, -1, -1):
            if str(self.itemData(i)).startswith(LOADED):
                self.removeItem(i)
        self.loaded = tuple(adapters)
        at = self.findData("adapter") + 1
        for j, ad in enumerate(self.loaded):
            self.insertItem(at + j, "", f"{LOADED}{j}")
            self.set_item(at + j, f"Experiments: {ad.label}", LOADED_CHARS)
            self.setItemData(at + j, f"the file with the {ad.label} the Experiments tab has on the chat's model "
                             f"({ad.path})", Qt.ItemDataRole.ToolTipRole)
        if chosen is None:
            return None
        if chosen in self.loaded:
            self.select(f"{LOADED}{self.loaded.index(chosen)}")
            return None
        return chosen

    def set_item(self, i: int, text: str, limit: int = ITEM_CHARS) -> None:
        """An item's text, elided past `limit` characters; its tooltip holds all of it."""
        short = text if len(text) <= limit else text[: limit - 1] + "…"
        self.setItemText(i, short)
        self.setItemData(i, text, Qt.ItemDataRole.ToolTipRole)
