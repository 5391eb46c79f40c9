"""Fitness checks of the house's layers, computed from the code's own imports (ast).

- no import circle among the modules of regen/, monitor/ and pipelines/ (every import counts:
  at the top, inside a function, under ``if TYPE_CHECKING``);
- the store (regen/store) imports nothing from the layers above it: regen.engine, regen.cli,
  regen.status, monitor;
- the layers of docs/architecture.md: a package imports only the packages that table allows.

(The third check of the house, no run-directory file name spelled outside
regen/store/layout.py, is tests/store/test_layout.py.)

The graph is built in a fresh interpreter: CPython 3.11.7's ast.parse can raise "AST
constructor recursion depth mismatch" once other tests have run in the same process.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: the code whose imports are checked
ROOTS = ("regen", "monitor", "pipelines")
#: packages the store may never import (it is below all of them)
ABOVE_THE_STORE = ("regen.engine", "regen.cli", "regen.status", "monitor")


def module_name(path: Path, repo: Path = REPO) -> str:
    parts = list(path.relative_to(repo).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(repo: Path = REPO) -> dict[str, set[str]]:
    """``{module: modules of this code it imports}``. ``from pkg import name`` imports
    ``pkg.name`` when that is a module, else ``pkg``; relative imports are resolved."""
    files = {module_name(p, repo): p for r in ROOTS for p in sorted((repo / r).rglob("*.py"))}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                         for a in node.names]  # fmt: skip
            for n in names:
                target = resolve(n)
                if target is not None and target != mod:
                    out.add(target)
        graph[mod] = out
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``store_module -> imported`` for every import of the store from above it."""

    def above(m: str) -> bool:
        return any(m == p or m.startswith(p + ".") for p in ABOVE_THE_STORE)

    return sorted(f"{m} -> {t}" for m, ts in graph.items()
                  if m == "regen.store" or m.startswith("regen.store.")
                  for t in ts if above(t))  # fmt: skip


def check(repo: Path = REPO) -> dict[str, list]:
    graph = import_graph(repo)
    return {"modules": [len(graph)], "circles": circles(graph), "upward": upward_imports(graph)}


@pytest.fixture(scope="module")
def found() -> dict[str, list]:
    code = (
        f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "from test_architecture import check; print(json.dumps(check()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout)


def test_the_graph_sees_the_package(found) -> None:
    assert found["modules"][0] > 100


def test_no_import_circle_in_the_package(found) -> None:
    assert found["circles"] == [], "import circles:\n" + "\n".join(map(str, found["circles"]))


def test_the_store_imports_nothing_above_it(found) -> None:
    assert found["upward"] == [], "the store imports upward:\n" + "\n".join(found["upward"])


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """A deliberate circle and a deliberate upward import are found (the checks can fail)."""
    for mod, text in {
        "regen/__init__.py": "",
        "regen/store/__init__.py": "",
        "regen/store/layout.py": "from regen.store import rundir\n",
        "regen/store/rundir.py": "def f():\n    from regen.store.layout import X\n",
        "regen/store/verify.py": "from ..engine import planning\n",
        "regen/engine/__init__.py": "",
        "regen/engine/planning.py": "from regen.store.layout import Y\n",
        "monitor/__init__.py": "",
        "pipelines/__init__.py": "",
    }.items():
        (tmp_path / mod).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / mod).write_text(text)
    got = check(tmp_path)
    assert got["circles"] == [["regen.store.layout", "regen.store.rundir"]]
    assert got["upward"] == ["regen.store.verify -> regen.engine.planning"]
