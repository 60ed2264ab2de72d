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
    boundary = ROOT / "app" / "workers"  # the one thread boundary: the app/workers/ package
    offenders = [p.relative_to(ROOT) for p in _sources("app") if pat.search(p.read_text()) and boundary not in p.parents]
    assert offenders == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_level_import_circles() -> None:
    """No module imports itself back through others (function-level imports count; annotation-only ones don't)."""
    grimp = __import__("grimp")
    graph = grimp.build_graph("engine", "app", exclude_type_checking_imports=True)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert _cycles(edges) == []


def test_models_holds_architectures_and_their_shared_definitions_only() -> None:
    """Every module in engine/models/ is an architecture (it registers one) or one of the named shared definitions;
    execution machinery lives in engine/runtime and engine/ops."""
    import importlib
    import pkgutil

    import engine.models as pkg
    from engine.models import registry

    registry._discover()
    archs = {cls.__module__ for cls in registry.ARCHITECTURES.values()}
    modules = {f"engine.models.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)}
    shared = {f"engine.models.{name}" for name in registry._SHARED}
    assert modules - shared == archs
    for name in sorted(modules - shared):  # each architecture file is short: switches and metadata
        source = Path(importlib.import_module(name).__file__).read_text()
        assert len(source.splitlines()) <= 150, name
