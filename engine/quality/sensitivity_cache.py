"""Measured sensitivities on disk, per model file and calibration text, so a cancelled search resumes.

One JSON file per (model file, calibration tokens, importance matrix, measuring method) under the
user cache (platformdirs: ~/.cache/gguf-lens/mix on Linux). Every write goes to a temporary file
that is renamed over the old one, so a crash leaves the previous complete file. A file that does not
parse or does not match its key is ignored with a message, and the measurement starts again.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from engine.quality.sensitivity import PROBE_BPW, TensorSensitivity

log = logging.getLogger(__name__)

FORMAT = 4  # bump when the measurement or the file layout changes: older files are then ignored (4: F16 candidates)


def default_dir() -> Path:
    """Where the sensitivities are kept: the user cache of gguf-lens."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("gguf-lens")) / "mix"


def file_digest(path: str | os.PathLike[str], head: int = 4 << 20) -> str:
    """A fingerprint of a model file: its size and the hash of its first and last bytes (header and tensor data)."""
    p = Path(path)
    size = p.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(p, "rb") as f:
        h.update(f.read(head))
        if size > 2 * head:
            f.seek(size - head)
            h.update(f.read(head))
    return h.hexdigest()[:24]


def cache_key(model_path: str | os.PathLike[str], ids: Sequence[int], numerics: str,
              importance: Mapping[str, np.ndarray] | None = None, group_layers: int = 1) -> str:
    """The key of one measurement: model file, calibration tokens, numerics, importance matrix, method."""
    group = f" group {group_layers}" if group_layers > 1 else ""  # one tensor at a time keeps the original key
    h = hashlib.sha256(f"v{FORMAT} probe {PROBE_BPW} {numerics} {file_digest(model_path)}{group}".encode())
    h.update(np.asarray(ids, np.int64).tobytes())
    for name in sorted(importance or {}):
        h.update(name.encode())
        h.update(np.ascontiguousarray(np.asarray(importance[name], np.float32)).tobytes())  # type: ignore[index]
    return h.hexdigest()[:32]


class SensitivityCache:
    """The sensitivities of one key, read and written atomically."""

    def __init__(self, key: str, folder: str | os.PathLike[str] | None = None, label: str = ""):
        self.key = key
        self.label = label
        self.folder = Path(folder) if folder is not None else default_dir()
        self.path = self.folder / f"{key}.json"

    def load(self) -> tuple[dict[str, TensorSensitivity], str | None]:
        """The tensors measured so far, and a message when a file was there but could not be used."""
        if not self.path.exists():
            return {}, None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != self.key:
                raise ValueError("written for another model, text or version")
            out = {}
            for entry in data["tensors"]:
                s = TensorSensitivity.from_dict(entry)
                out[s.name] = s
            return out, None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            msg = f"ignored the sensitivity cache {self.path.name} ({type(exc).__name__}: {exc}); measuring again"
            log.warning(msg)
            return {}, msg

    def save(self, tensors: Mapping[str, TensorSensitivity]) -> None:
        """Write every measured tensor (temporary file, fsync, rename); a failure is logged, never raised."""
        data = {"format": FORMAT, "key": self.key, "label": self.label,
                "tensors": [t.as_dict() for t in tensors.values()]}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".sens-", suffix=".tmp", dir=self.folder)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(data, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            log.warning("could not write the sensitivity cache %s: %s", self.path, exc)

    def clear(self) -> None:
        """Forget this key's measurements."""
        self.path.unlink(missing_ok=True)
