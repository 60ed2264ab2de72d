"""Durable file writes shared by the GGUF writer, the catalog and the app's stores."""
from __future__ import annotations

import os
from pathlib import Path


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


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a temp file in the same folder, fsync and rename: never a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
