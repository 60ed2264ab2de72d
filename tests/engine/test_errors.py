"""engine.errors: a long value in a message keeps both ends (a deep path keeps its file name)."""
from __future__ import annotations

from engine.errors import ModelFormatError


def test_a_long_path_keeps_its_file_name() -> None:
    path = "/tmp/" + "deep/" * 40 + "model.gguf"
    text = str(ModelFormatError("file", "model file changed on disk; reload it", value=path))
    shown = text.split(" = ", 1)[1].split(": model file", 1)[0]
    assert len(shown) == 80 and shown.startswith("'/tmp/deep/") and shown.endswith("deep/model.gguf'") and "…" in shown
    assert str(ModelFormatError("file", "x", value="/a/b.gguf")) == "file = '/a/b.gguf': x"
