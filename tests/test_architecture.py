"""Fitness checks of the house's layers, computed from the code's own imports (ast).

- no import circle among the modules of regen/, monitor/ and pipelines/ (every import counts:
  at the top, inside a function, under ``if TYPE_CHECKING``), nor among their packages;
- the floors of docs/architecture.md ("Layers: floors"): a package imports only from its own
  floor or lower ones, and every package has a floor;
- production code (all but regen.devkit) never imports the devkit;
- imports sit at the top of a module: inside functions only the heavy dependencies that
  docs/architecture.md lists ("Heavy dependencies"), and the rest under 5% of all imports;
- the run directory ("Who writes it"): the modules that call a ``RunDir``'s writing methods
  themselves are exactly those of the "writes itself" table, and those that take a local path
  from it (``rd.path(...)`` not handed straight to a stream of ``rd.fs``) exactly those of the
  "by path" table, the store aside.

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
#: a ``RunDir``'s methods that write (regen/store/rundir.py)
RUNDIR_WRITES = frozenset({"write_json_atomic", "write_text_atomic", "write_bytes_atomic",
                           "atomic_writer", "makedirs", "delete", "move"})  # fmt: skip
#: the standard library's modules that have methods of those names (not a RunDir)
STDLIB = frozenset({"os", "shutil"})
#: a pyarrow filesystem's methods that write, called on a RunDir's ``fs``
FS_WRITES = frozenset({"open_output_stream", "open_append_stream", "create_dir", "delete_dir",
                       "delete_dir_contents", "delete_file", "move", "copy_file"})  # fmt: skip
#: ... and those that read
FS_READS = frozenset({"open_input_file", "open_input_stream"})
#: the package that owns the run directory: it writes and takes paths as it likes
STORE = "regen.store"


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


def run_dir_tables(doc: str) -> dict[str, set[str]]:
    """``{"writes itself": modules or packages, "by path": ...}`` from the tables of
    docs/architecture.md's "Who writes it" (the backticked names of each row's first cell)."""
    text = section(doc, "Run directory (the only shared state)").split("### Who writes it", 1)[1]
    out: dict[str, set[str]] = {}
    table = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            table = None
        elif table is None:
            table = cells[0]
            out[table] = set()
        elif not set(cells[0]) <= set("-"):
            out[table] |= set(re.findall(r"`([\w.]+)`", cells[0]))
    return out


def run_dir_access(repo: Path = REPO) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(``{module: ["line: call"]}`` of the calls of a RunDir's writing methods, and of the
    local paths taken from a RunDir), for every module outside the store."""
    writes: dict[str, list[str]] = {}
    paths: dict[str, list[str]] = {}
    for r in ROOTS:
        for path in sorted((repo / r).rglob("*.py")):
            mod = module_name(path, repo)
            if mod == STORE or mod.startswith(STORE + "."):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            # the rd.path(...) calls handed to a stream of the RunDir's fs: as its argument,
            # or through a name that is
            to_fs: set[int] = set()
            fs_names: set[str] = set()
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                attr, recv = node.func.attr, ast.unparse(node.func.value)
                on_fs = recv == "fs" or recv.endswith(".fs")
                if on_fs and attr in FS_READS | FS_WRITES:
                    to_fs |= {id(a) for a in node.args}
                    fs_names |= {a.id for a in node.args if isinstance(a, ast.Name)}
                if (attr in RUNDIR_WRITES and recv not in STDLIB) or (on_fs and attr in FS_WRITES):
                    writes.setdefault(mod, []).append(f"{node.lineno}: {recv}.{attr}")
            for node in ast.walk(tree):
                if (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and isinstance(node.targets[0], ast.Name)
                        and node.targets[0].id in fs_names):  # fmt: skip
                    to_fs.add(id(node.value))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "path" and len(node.args) == 1
                        and not node.keywords and id(node) not in to_fs):  # fmt: skip
                    paths.setdefault(mod, []).append(f"{node.lineno}: {ast.unparse(node)}")
    return writes, paths


def _listed(mod: str, names: set[str]) -> bool:
    return any(mod == n or mod.startswith(n + ".") for n in names)


def run_dir_check(repo: Path = REPO, doc: str | None = None) -> dict[str, list]:
    """What the code does against "Who writes it": modules that write (or take a local path)
    without a row in its table, and names in a table that no module matches any more."""
    text = ARCHITECTURE.read_text(encoding="utf-8") if doc is None else doc
    tables = run_dir_tables(text)
    writers, by_path = tables["writes itself"], tables["by path"]
    writes, paths = run_dir_access(repo)
    writers_unlisted = [f"{m}:{c}" for m, cs in writes.items() if not _listed(m, writers)
                        for c in cs]  # fmt: skip
    paths_unlisted = [f"{m}:{c}" for m, cs in paths.items() if not _listed(m, by_path)
                      for c in cs]  # fmt: skip
    return {
        "writers_unlisted": sorted(writers_unlisted),
        "writers_idle": sorted(
            n for n in writers - {STORE} if not any(_listed(m, {n}) for m in writes)
        ),
        "paths_unlisted": sorted(paths_unlisted),
        "paths_idle": sorted(n for n in by_path if not any(_listed(m, {n}) for m in paths)),
    }


@pytest.fixture(scope="module")
def found() -> dict[str, list]:
    code = (
        f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "from test_architecture import check, run_dir_check; "
        "print(json.dumps({**check(), **run_dir_check()}))"
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


def test_only_the_listed_modules_write_the_run_directory_themselves(found) -> None:
    assert found["writers_unlisted"] == [], (
        "writes through a RunDir's own methods, not listed in docs/architecture.md's \"Who "
        "writes it\" (write through the store's records, or list it and say why):\n"
        + "\n".join(found["writers_unlisted"])
    )
    assert found["writers_idle"] == [], f"listed as writers, write nothing: {found['writers_idle']}"


def test_only_the_listed_modules_take_a_local_path_from_the_run_directory(found) -> None:
    assert found["paths_unlisted"] == [], (
        'a local path taken from a RunDir, not listed in "Who writes it"\'s by-path table '
        "(read and write through the RunDir):\n" + "\n".join(found["paths_unlisted"])
    )
    assert found["paths_idle"] == [], f"listed as by path, take none: {found['paths_idle']}"


def test_the_run_directory_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """A write through a RunDir outside the table, a local path taken outside the by-path
    table, and table rows that match no module are found; the store's own writes, a stream
    opened on the RunDir's fs, ``os.makedirs`` and a listed writer are not."""
    for mod, text in {
        "regen/store/parts.py": "def f(rd):\n    rd.write_bytes_atomic('x', b'')\n",
        "regen/engine/tracker.py": (
            "import os\n\ndef f(rd, n):\n    os.makedirs('tmp')\n"
            "    rd.write_json_atomic(n, {})\n    return open(rd.path(n))\n"
        ),
        "regen/export/select.py": (
            "def f(rd, n):\n    p = rd.path(n)\n    with rd.fs.open_input_file(p) as f:\n"
            "        return f.read(), rd.fs.open_input_file(rd.path(n))\n"
        ),
        "regen/export/run.py": "def f(dest):\n    dest.delete('shard')\n",
        "regen/plan/index.py": "def f(rd):\n    return rd.fs.open_output_stream(rd.path('t'))\n",
        "monitor/__init__.py": "",
        "pipelines/__init__.py": "",
    }.items():
        (tmp_path / mod).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / mod).write_text(text)
    doc = (
        "## Run directory (the only shared state)\n\ntree\n\n### Who writes it\n\nrules\n\n"
        "| writes itself | what |\n|---|---|\n| `regen.store` | all |\n"
        "| `regen.export.run`, `regen.train.launch` | export/, train/ |\n\n"
        "| by path | what |\n|---|---|\n| `regen.devkit.cpu_train` | train/cpu/ |\n"
    )
    got = run_dir_check(tmp_path, doc)
    assert got == {
        "writers_unlisted": [
            "regen.engine.tracker:5: rd.write_json_atomic",
            "regen.plan.index:2: rd.fs.open_output_stream",
        ],
        "writers_idle": ["regen.train.launch"],
        "paths_unlisted": ["regen.engine.tracker:6: rd.path(n)"],
        "paths_idle": ["regen.devkit.cpu_train"],
    }


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
