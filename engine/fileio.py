"""Durable file writes shared by the GGUF writer, the catalog and the app's stores."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def fsync_dir(folder: Path) -> None:
    """Make a rename inside `folder` durable where the OS allows it (best effort)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes_atomic(path: Path, data: bytes, before_replace: Callable[[], None] | None = None) -> None:
    """Write `data` to `path` via a temp file in the same folder, fsync and rename: never a half-written file.

    `before_replace` runs once the new bytes are durable and before they take the old file's place (a backup).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
