"""``python tests/_module_attrs.py ROOT...``: the attributes the code reads from a module of its
own through a name an import bound (``from regen.store import layout as L`` … ``L.NAME``) that
the module does not have, as a JSON list of ``"path:line: alias.attr (module)"``.

Run in a fresh interpreter by tests/test_module_attributes.py (it imports the modules).
"""

from __future__ import annotations

import ast
import importlib
import json
import sys
import types
from pathlib import Path

#: the packages whose modules are checked when the code imports them
OWN = ("regen", "monitor", "pipelines", "benchmarks")


def bound_modules(tree: ast.Module) -> dict[str, types.ModuleType]:
    """Names this file's imports bind to one of our modules (not classes or functions)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update({a.asname: a.name for a in node.names if a.asname})
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    out: dict[str, types.ModuleType] = {}
    for alias, name in names.items():
        if name.split(".", 1)[0] not in OWN:
            continue
        try:
            mod = importlib.import_module(name)
        except ImportError:  # a class or function: `from regen.x import Name`
            continue
        out[alias] = mod
    return out


def missing(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    mods = bound_modules(tree)
    return [
        f"{path}:{node.lineno}: {node.value.id}.{node.attr} ({mods[node.value.id].__name__})"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in mods
        and not hasattr(mods[node.value.id], node.attr)
    ]


if __name__ == "__main__":
    found = [
        m for root in sys.argv[1:] for p in sorted(Path(root).rglob("*.py")) for m in missing(p)
    ]
    print(json.dumps(found))
