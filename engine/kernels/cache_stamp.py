"""numba's on-disk cache keyed on every compiled source of the engine, not only the function's own file.

numba decides whether a cached kernel is fresh from its own source file alone (a hash of that file). A kernel
inlines helpers and intrinsics from other modules (engine.kernels.simd's vector code, activations' fp16
conversions, the floats' dot products), so a change there left its callers' cached machine code in use until
their own files changed: old arithmetic under new code, which no error reveals. `install()` puts locators in
front of numba's own for the files of this package tree: the same cache folders (in the tree, NUMBA_CACHE_DIR,
or the user-wide one), with a freshness stamp that also covers every engine file holding compiled code
(`tree_stamp`). Editing any of them recompiles all kernels once; an installed package never changes, so its
users never pay for it. Called by engine.kernels.activations before any kernel is decorated.
"""
from __future__ import annotations

import hashlib
import io
import tokenize
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1]
_MARKERS = (b"njit", b"intrinsic", b"llvmlite")  # a file with compiled code, or code generating it
_STAMP: list[str] = []


def _names_a_marker(data: bytes) -> bool:
    """Whether the code (not a comment or a string) names njit, intrinsic or llvmlite: a file that only mentions
    llvmlite in its docstring (engine.kernels.pages) has no compiled code, and editing it recompiles nothing."""
    if not any(m in data for m in _MARKERS):
        return False
    try:
        for tok in tokenize.tokenize(io.BytesIO(data).readline):
            if tok.type == tokenize.NAME and tok.string.encode() in _MARKERS:
                return True
    except (tokenize.TokenError, SyntaxError):
        return True  # unreadable here: count it, as before
    return False


def compiled_sources(root: Path = ENGINE) -> list[Path]:
    """The engine's Python files holding jitted functions, intrinsics or the LLVM code they generate."""
    return [p for p in sorted(root.rglob("*.py")) if _names_a_marker(p.read_bytes())]


def stamp_of(root: Path) -> str:
    """A hash of every compiled source's path (relative to root) and bytes."""
    h = hashlib.sha256()
    for p in compiled_sources(root):
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def tree_stamp() -> str:
    """stamp_of the engine package, computed once per process."""
    if not _STAMP:
        _STAMP.append(stamp_of(ENGINE))
    return _STAMP[0]


def _in_engine(py_file: str) -> bool:
    try:
        return Path(py_file).resolve().is_relative_to(ENGINE)
    except (OSError, ValueError):
        return False


class _TreeStamp:
    """Mixin for numba's source-file locators: engine files only, stamped with their own hash and the tree's."""

    def get_source_stamp(self):  # noqa: ANN201 - numba's interface: any picklable value
        return (super().get_source_stamp(), tree_stamp())  # type: ignore[misc]

    @classmethod
    def from_function(cls, py_func, py_file):  # noqa: ANN001, ANN206
        if not _in_engine(py_file):
            return None
        return super().from_function(py_func, py_file)  # type: ignore[misc]


def install() -> None:
    """Put the tree-stamped locators first in numba's list (once; a numba without this layout is left as is)."""
    try:
        from numba.core import caching  # noqa: PLC0415 - only where numba is present
    except ImportError:  # pragma: no cover
        return
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    bases = [getattr(caching, n, None) for n in ("UserProvidedCacheLocator", "InTreeCacheLocator",
                                                  "UserWideCacheLocator")]
    if impl is None or not isinstance(getattr(impl, "_locator_classes", None), list) or None in bases:
        return
    if any(issubclass(c, _TreeStamp) for c in impl._locator_classes):
        return
    ours = [type(f"Engine{b.__name__}", (_TreeStamp, b), {"__module__": __name__}) for b in bases]
    impl._locator_classes[:0] = ours
