"""Load single modules of the installed SGLang wheel on CPU, without its package ``__init__``.

``import sglang`` runs a chain that pulls in torch, triton, FlashInfer and more. The contract
tests need only a few pure-Python files (the OpenAI protocol models, the Kimi reasoning and
tool-call detectors). :func:`load` registers empty parent packages (``sglang``,
``sglang.srt``, ...) whose ``__path__`` points into the installed wheel, then imports the
module the normal way: its own imports resolve inside the wheel through those empty parents,
so only the files it really needs run. ``sglang.utils`` (IPython, requests, numpy for notebook
helpers) is replaced by a module holding the one function ``protocol.py`` takes from it.

The wheel must be exactly :data:`SGLANG_VERSION`: :func:`check_version` fails loudly
otherwise (the facts these tests pin were read in that version's code).
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

#: the SGLang release whose code these tests were written against (scripts/bootstrap pins it)
SGLANG_VERSION = "0.5.23"


@functools.cache
def wheel_root() -> Path:
    """Folder of the installed ``sglang`` package (found without importing it)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(
            f"sglang=={SGLANG_VERSION} is not installed: run scripts/bootstrap "
            "(it installs the wheel with --no-deps for these contract tests)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def check_version() -> str:
    """The installed version; a test failure naming both versions when it is not the pin."""
    installed = importlib.metadata.version("sglang")
    recorded = (wheel_root() / "_version.py").read_text(encoding="utf-8")
    if installed != SGLANG_VERSION or f"'{SGLANG_VERSION}'" not in recorded:
        pytest.fail(
            f"the contract tests pin sglang=={SGLANG_VERSION} but sglang=={installed} is "
            "installed: re-read the wheel's code (CONTRACTS.md §2b) before moving the pin"
        )
    return installed


def _convert_json_schema_to_str(json_schema: Any) -> str:
    """``sglang.utils.convert_json_schema_to_str`` for dicts and strings (what regen sends)."""
    return json_schema if isinstance(json_schema, str) else json.dumps(json_schema)


def _ensure_parents(name: str, root: Path) -> None:
    parts = name.split(".")
    for i in range(1, len(parts)):
        pkg = ".".join(parts[:i])
        if pkg in sys.modules:
            continue
        path = str(root.parent.joinpath(*parts[:i]))
        mod = types.ModuleType(pkg)
        mod.__spec__ = importlib.machinery.ModuleSpec(pkg, None, is_package=True)
        mod.__spec__.submodule_search_locations = [path]
        mod.__path__ = [path]
        mod.__package__ = pkg
        sys.modules[pkg] = mod
    if "sglang.utils" not in sys.modules:
        utils = types.ModuleType("sglang.utils")
        utils.convert_json_schema_to_str = _convert_json_schema_to_str  # type: ignore[attr-defined]
        sys.modules["sglang.utils"] = utils


def load(name: str) -> types.ModuleType:
    """Import ``name`` (e.g. ``sglang.srt.entrypoints.openai.protocol``) from the wheel."""
    check_version()
    root = wheel_root()
    loaded = sys.modules.get("sglang")
    if loaded is not None and getattr(loaded, "__file__", None):
        pytest.fail("the real sglang package is imported in this process; cannot stub it")
    _ensure_parents(name, root)
    module = importlib.import_module(name)
    assert module.__file__ is not None and Path(module.__file__).is_relative_to(root)
    return module


#: prints, as JSON, the source of the named definitions of a file (argv: path, names; a name is a
#: top-level function or assigned name, or ``Class.method``), decorators included, in file order
_DEFS_SCRIPT = r"""
import ast, json, sys
path, names = sys.argv[1], set(sys.argv[2:])
lines = open(path, encoding="utf-8").read().splitlines()
def names_of(node):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()
def text(node):
    first = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
    return "\n".join(lines[first - 1 : node.end_lineno])
found = {}
for node in ast.parse("\n".join(lines)).body:
    for name in names_of(node) & names:
        found[name] = text(node)
    if isinstance(node, ast.ClassDef):
        for sub in node.body:
            for name in {f"{node.name}.{n}" for n in names_of(sub)} & names:
                found[name] = text(sub)
print(json.dumps(found))
"""


@functools.cache
def wheel_defs(relpath: str, names: tuple[str, ...]) -> dict[str, str]:
    """The source text of ``names`` in the wheel's file ``relpath`` (under ``sglang/``): each
    top-level function or assignment, or ``Class.method`` (dedented), in file order, to compile
    one by one.

    The file is parsed in a fresh interpreter: in a process where other tests have run,
    CPython 3.11.7's ``ast.parse`` can raise "AST constructor recursion depth mismatch"
    (compiling text, as the callers do, builds no Python AST objects and is not affected).
    A name the file no longer defines fails the test, naming it."""
    path = wheel_root() / relpath
    out = subprocess.run(
        [sys.executable, "-c", _DEFS_SCRIPT, str(path), *names],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    found: dict[str, str] = json.loads(out.stdout)
    missing = set(names) - found.keys()
    if missing:
        pytest.fail(f"{relpath} no longer defines {sorted(missing)}")
    return {name: textwrap.dedent(text) for name, text in found.items()}


def wheel_exec(relpath: str, names: tuple[str, ...], ns: dict[str, Any], flags: int = 0) -> None:
    """Define ``names`` of the wheel's file ``relpath`` in the namespace ``ns`` (their source by
    :func:`wheel_defs`, compiled one by one with the compiler ``flags``, under the file's name)."""
    filename = str(wheel_root() / relpath)
    for source in wheel_defs(relpath, names).values():
        exec(compile(source, filename, "exec", flags=flags, dont_inherit=True), ns)
