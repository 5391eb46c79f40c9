"""Fitness checks of the house's layers, computed from the code's own imports (ast).

- no import circle among the modules of regen/, monitor/ and pipelines/ (every import counts:
  at the top, inside a function, under ``if TYPE_CHECKING``);
- the store (regen/store) imports nothing from the layers above it: regen.engine, regen.cli,
  regen.status, monitor;
- the layers of docs/architecture.md ("which package may import which"): a package imports only
  the foundation and the packages its row of that table lists.

(The third check of the house, no run-directory file name spelled outside
regen/store/layout.py, is tests/store/test_layout.py.)

The graph is built in a fresh interpreter: CPython 3.11.7's ast.parse can raise "AST
constructor recursion depth mismatch" once other tests have run in the same process.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: the code whose imports are checked
ROOTS = ("regen", "monitor", "pipelines")
#: packages the store may never import (it is below all of them)
ABOVE_THE_STORE = ("regen.engine", "regen.cli", "regen.status", "monitor")
ARCHITECTURE = REPO / "docs" / "architecture.md"


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


def package(module: str) -> str:
    """``regen.store.layout`` -> ``regen.store``; ``monitor.live`` -> ``monitor``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "regen" and len(parts) > 1 else parts[0]


def allowed_imports(doc: str) -> tuple[set[str], dict[str, set[str]]]:
    """The foundation and ``{package: packages it may import}`` from the "Layers" section of
    docs/architecture.md (its sentence naming the foundation, and its table)."""
    section = doc.split("## Layers", 1)[1].split("\n## ", 1)[0]
    para = section.split("The foundation", 1)[1].split("\n\n", 1)[0]
    foundation = set(re.findall(r"`([\w.]+)`", para))
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            table[cells[0].strip("`")] = set(re.findall(r"`([\w.]+)`", cells[1]))
    return foundation, table


def layer_violations(graph: dict[str, set[str]], doc: str) -> list[str]:
    """``module -> imported`` for every import between packages that the table does not
    allow (a package missing from the table may import only the foundation)."""
    foundation, table = allowed_imports(doc)
    out = []
    for mod, targets in graph.items():
        mine = package(mod)
        ok = foundation | (set() if mine in foundation else table.get(mine, set()))
        for t in sorted(targets):
            theirs = package(t)
            if theirs != mine and theirs not in ok:
                out.append(f"{mod} -> {t}")
    return sorted(out)


def check(repo: Path = REPO, doc: str | None = None) -> dict[str, list]:
    graph = import_graph(repo)
    text = ARCHITECTURE.read_text(encoding="utf-8") if doc is None else doc
    return {"modules": [len(graph)], "circles": circles(graph), "upward": upward_imports(graph),
            "layers": layer_violations(graph, text)}  # fmt: skip


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


def test_packages_import_only_what_the_architecture_allows(found) -> None:
    assert found["layers"] == [], (
        "imports docs/architecture.md's layers do not allow (move the code, or change the "
        "table on purpose):\n" + "\n".join(found["layers"])
    )


def test_every_package_has_a_row_in_the_layers_table() -> None:
    foundation, table = allowed_imports(ARCHITECTURE.read_text(encoding="utf-8"))
    packages = {"monitor", "pipelines", *(
        f"regen.{p.stem if p.is_file() else p.name}" for p in (REPO / "regen").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    )}  # fmt: skip
    assert packages - {"regen"} <= (foundation | set(table)), packages - foundation - set(table)


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
    doc = (
        "## Layers\n\nThe foundation: `regen`.\n\n| package | may import |\n|---|---|\n"
        "| `regen.engine` | `regen.store` |\n| `regen.store` | — |\n"
    )
    got = check(tmp_path, doc)
    assert got["circles"] == [["regen.store.layout", "regen.store.rundir"]]
    assert got["upward"] == ["regen.store.verify -> regen.engine.planning"]
    assert got["layers"] == ["regen.store.verify -> regen.engine.planning"]
