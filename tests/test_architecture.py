"""Fitness checks of the house's layers, computed from the code's own imports (ast).

- no import circle among the modules of regen/, monitor/ and pipelines/ (every import counts:
  at the top, inside a function, under ``if TYPE_CHECKING``), nor among their packages;
- the floors of docs/architecture.md ("Layers: floors"): a package imports only from its own
  floor or lower ones, and every package has a floor;
- production code (all but regen.devkit) never imports the devkit;
- imports sit at the top of a module: inside functions only the heavy dependencies that
  docs/architecture.md lists ("Heavy dependencies"), and the rest under 5% of all imports.

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
#: the developer kit: no other package imports it
DEVKIT = "regen.devkit"
#: the most imports inside functions, beside the heavy dependencies (share of all imports)
MAX_IN_FUNCTION = 0.05
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


def package(module: str) -> str:
    """``regen.store.layout`` -> ``regen.store``; ``monitor.live`` -> ``monitor``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "regen" and len(parts) > 1 else parts[0]


def section(doc: str, title: str) -> str:
    return doc.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def floors(doc: str) -> dict[str, int]:
    """``{package: floor}`` from the table of docs/architecture.md's "Layers: floors"."""
    out: dict[str, int] = {}
    for line in section(doc, "Layers: floors").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].isdigit():
            for name in re.findall(r"`([\w.]+)`", cells[1]):
                out[name] = int(cells[0])
    return out


def heavy(doc: str) -> set[str]:
    """The dependencies that may be imported inside a function ("Heavy dependencies")."""
    paragraphs = [x for x in section(doc, "Heavy dependencies").split("\n\n") if x.strip()]
    return set(re.findall(r"`([\w.]+)`", paragraphs[-1]))


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {package(m): set() for m in graph}
    for mod, targets in graph.items():
        out[package(mod)] |= {package(t) for t in targets} - {package(mod)}
    return out


def floor_violations(graph: dict[str, set[str]], doc: str) -> tuple[list[str], list[str]]:
    """(``module -> imported`` for every import to a higher floor, packages without a floor)."""
    floor = floors(doc)
    unknown = sorted({package(m) for m in graph} - set(floor))
    up = [f"{mod} -> {t}" for mod, ts in graph.items() for t in sorted(ts)
          if floor.get(package(t), -1) > floor.get(package(mod), 99)]  # fmt: skip
    return sorted(up), unknown


def devkit_imports(graph: dict[str, set[str]]) -> list[str]:
    def kit(m: str) -> bool:
        return m == DEVKIT or m.startswith(DEVKIT + ".")

    return sorted(f"{m} -> {t}" for m, ts in graph.items() if not kit(m) for t in ts if kit(t))


def in_function_imports(repo: Path, allowed: set[str]) -> tuple[int, list[str]]:
    """(import statements in all, ``module:line name`` of those inside a function that import
    anything but ``allowed``)."""
    total, inside = 0, []
    for r in ROOTS:
        for path in sorted((repo / r).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            funcs = [n for n in ast.walk(tree)
                     if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]  # fmt: skip
            nested = {id(x) for f in funcs for x in ast.walk(f) if x is not f}
            seen: set[int] = set()
            for f in funcs:
                if id(f) in nested:
                    continue
                for n in ast.walk(f):
                    if isinstance(n, ast.Import | ast.ImportFrom) and id(n) not in seen:
                        seen.add(id(n))
                        names = (
                            [a.name for a in n.names]
                            if isinstance(n, ast.Import)
                            else [n.module or "."]
                        )
                        if not any(x.split(".")[0] in allowed for x in names):
                            inside.append(f"{module_name(path, repo)}:{n.lineno} {names[0]}")
            total += sum(isinstance(n, ast.Import | ast.ImportFrom) for n in ast.walk(tree))
    return total, inside


def check(repo: Path = REPO, doc: str | None = None) -> dict[str, list]:
    graph = import_graph(repo)
    text = ARCHITECTURE.read_text(encoding="utf-8") if doc is None else doc
    up, unknown = floor_violations(graph, text)
    total, inside = in_function_imports(repo, heavy(text))
    return {"modules": [len(graph)], "circles": circles(graph),
            "package_circles": circles(package_graph(graph)), "upward": up,
            "no_floor": unknown, "devkit": devkit_imports(graph),
            "imports": [total], "in_function": inside}  # fmt: skip


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


def test_no_import_circle_between_packages(found) -> None:
    assert found["package_circles"] == [], found["package_circles"]


def test_no_import_goes_up_the_floors(found) -> None:
    assert found["upward"] == [], (
        "imports up docs/architecture.md's floors (move the code, or change the table on "
        "purpose):\n" + "\n".join(found["upward"])
    )


def test_every_package_has_a_floor(found) -> None:
    assert found["no_floor"] == [], found["no_floor"]


def test_production_never_imports_the_devkit(found) -> None:
    assert found["devkit"] == [], "\n".join(found["devkit"])


def test_imports_sit_at_the_top_but_the_heavy_ones(found) -> None:
    total, inside = found["imports"][0], found["in_function"]
    assert len(inside) <= MAX_IN_FUNCTION * total, (
        f"{len(inside)} of {total} imports inside functions ({len(inside) / total:.1%}), "
        f"beside the heavy dependencies:\n" + "\n".join(inside)
    )


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """A deliberate circle, an import up the floors, a production import of the devkit and an
    import inside a function are found (the checks can fail)."""
    for mod, text in {
        "regen/__init__.py": "",
        "regen/store/__init__.py": "",
        "regen/store/layout.py": "from regen.store import rundir\n",
        "regen/store/rundir.py": "def f():\n    from regen.store.layout import X\n",
        "regen/store/verify.py": "from ..engine import planning\n",
        "regen/engine/__init__.py": "",
        "regen/engine/planning.py": "from regen.store.layout import Y\nimport regen.devkit.sim\n",
        "regen/devkit/__init__.py": "",
        "regen/devkit/sim.py": "from regen.store import layout\n",
        "monitor/__init__.py": "",
        "pipelines/__init__.py": "",
    }.items():
        (tmp_path / mod).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / mod).write_text(text)
    doc = (
        "## Layers: floors\n\n| floor | packages |\n|---|---|\n| 0 | `regen` |\n"
        "| 1 | `regen.store` |\n| 2 | `regen.engine` |\n| 3 | `regen.devkit` |\n\n"
        "## Heavy dependencies\n\nsome words\n\n`torch`\n\n## More\n"
    )
    got = check(tmp_path, doc)
    assert got["circles"] == [["regen.store.layout", "regen.store.rundir"]]
    assert got["upward"] == [
        "regen.engine.planning -> regen.devkit.sim",
        "regen.store.verify -> regen.engine.planning",
    ]
    assert got["no_floor"] == ["monitor", "pipelines"]
    assert got["devkit"] == ["regen.engine.planning -> regen.devkit.sim"]
    assert got["package_circles"] == [["regen.devkit", "regen.engine", "regen.store"]]
    assert got["in_function"] == ["regen.store.rundir:2 regen.store.layout"]


def test_regen_help_imports_none_of_the_heavy_dependencies() -> None:
    """What the heavy list is for: building `regen`'s parser (every command's module, the
    devkit's through their entry points) imports none of them."""
    code = (
        "import json, sys; from regen.cli.main import build_parser; build_parser(); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = {m.split(".")[0] for m in json.loads(out.stdout)}
    assert loaded & heavy(ARCHITECTURE.read_text(encoding="utf-8")) == set()
