"""The rules of the house (ARCHITECTURE.md), checked: engine imports no Qt, only backend.py imports cupy."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_linter_contract() -> None:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    r = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "KEPT" in r.stdout


def _sources(pkg: str) -> list[Path]:
    return sorted((ROOT / pkg).rglob("*.py"))


def test_only_backend_imports_cupy() -> None:
    pat = re.compile(r"^\s*(import cupy|from cupy)", re.M)
    offenders = [p.relative_to(ROOT) for p in _sources("engine") + _sources("app")
                 if pat.search(p.read_text()) and p != ROOT / "engine" / "backend.py"]
    assert offenders == []


def test_engine_never_prints() -> None:
    pat = re.compile(r"^\s*print\(", re.M)
    offenders = [p.relative_to(ROOT) for p in _sources("engine") if pat.search(p.read_text())
                 and p.relative_to(ROOT / "engine").parts[0] != "cli"]
    assert offenders == []


def test_threads_start_only_in_workers() -> None:
    pat = re.compile(r"threading\.Thread\(|QThread\(|thread_worker|QThreadPool|ThreadPoolExecutor")
    offenders = [p.relative_to(ROOT) for p in _sources("app") if pat.search(p.read_text()) and p.name != "workers.py"]
    assert offenders == []
