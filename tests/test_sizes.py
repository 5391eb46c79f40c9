"""Fitness check of the house's sizes, counted from the code itself (ast): in ``regen/``
outside the developer kit (``regen/devkit``), no class is over ``MAX_CLASS`` lines and no
function (or method, or nested function) over ``MAX_FUNCTION``.

A size is ``end_lineno - lineno + 1`` of the ``class`` or ``def`` statement (its decorators
not counted; a class's methods count in the class, and each again on its own).

Exempt: a model of fields only, whose size grows with the fields it has and nothing else. A
class is one when its body holds nothing but annotated assignments (``name: type`` with or
without a value, ``#:`` comments beside them), string expressions (its docstring, or a
docstring after a field) and ``model_config = ...``. A method, a validator, a nested class or
any other statement makes it an ordinary class.

The sizes are counted in a fresh interpreter: CPython 3.11.7's ast.parse can raise "AST
constructor recursion depth mismatch" once other tests have run in the same process
(tests/test_architecture.py).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the code whose sizes are held, and the part of it left out
ROOT, DEVKIT = "regen", Path("regen") / "devkit"
#: the most lines of a class, and of a function
MAX_CLASS, MAX_FUNCTION = 300, 60

Def = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def size(node: Def) -> int:
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def fields_only(node: ast.ClassDef) -> bool:
    """A model of fields only (see the module docstring)."""

    def field(stmt: ast.stmt) -> bool:
        if isinstance(stmt, ast.AnnAssign):
            return True
        if isinstance(stmt, ast.Expr):
            return isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)
        return (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id == "model_config"
        )

    return all(field(stmt) for stmt in node.body)


def definitions(tree: ast.Module) -> list[tuple[str, Def]]:
    """Every class and function of a module, each with its qualified name (``Class.method``,
    ``function.inner``)."""
    out: list[tuple[str, Def]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, Def):
                name = f"{prefix}{child.name}"
                out.append((name, child))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def oversized(repo: Path = REPO) -> list[str]:
    """``"lines path:name (class|function, max N)"`` of each class over ``MAX_CLASS`` lines
    (models of fields only apart) and each function over ``MAX_FUNCTION``, largest first."""
    found: list[tuple[int, str]] = []
    for path in sorted((repo / ROOT).rglob("*.py")):
        rel = path.relative_to(repo)
        if rel.is_relative_to(DEVKIT):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name, node in definitions(tree):
            n = size(node)
            if isinstance(node, ast.ClassDef):
                if n > MAX_CLASS and not fields_only(node):
                    found.append((n, f"{rel.as_posix()}:{name} (class, max {MAX_CLASS})"))
            elif n > MAX_FUNCTION:
                found.append((n, f"{rel.as_posix()}:{name} (function, max {MAX_FUNCTION})"))
    return [f"{n:5d} {what}" for n, what in sorted(found, key=lambda x: (-x[0], x[1]))]


def _oversized_in_a_fresh_interpreter() -> list[str]:
    code = (
        f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "from test_sizes import oversized; print(json.dumps(oversized()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout)


def test_no_class_or_function_is_over_its_size() -> None:
    found = _oversized_in_a_fresh_interpreter()
    assert found == [], (
        f"{len(found)} classes and functions in {ROOT}/ (outside {DEVKIT.as_posix()}/) over "
        f"{MAX_CLASS} lines (a class) or {MAX_FUNCTION} (a function); split them by what they "
        "do:\n" + "\n".join(found)
    )


def _lines(n: int, indent: str = "    ") -> str:
    return "".join(f"{indent}x{i} = {i}\n" for i in range(n))


def test_the_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    """A 61-line function, a 301-line class, a long model with a validator, a 61-line method
    and a 61-line nested function are found; a 60-line function, a 300-line class, a long model
    of fields only and anything in the devkit are not."""
    fields = "".join(f"    f{i}: int = {i}  #: a field\n" for i in range(320))
    files = {
        "regen/__init__.py": "",
        "regen/big.py": (
            f"def long():\n{_lines(60)}\n\n"  # 61 lines
            f"def fits():\n{_lines(59)}\n\n"  # 60 lines
            f"class Hub:\n{_lines(300)}\n\n"  # 301 lines
            f"class Room:\n{_lines(299)}\n\n"  # 300 lines
            f"async def outer():\n    async def inner():\n{_lines(60, ' ' * 8)}\n"
        ),
        "regen/models.py": (
            "from pydantic import BaseModel, ConfigDict, field_validator\n\n\n"
            f'class Settings(BaseModel):\n    """Fields."""\n\n'
            f'    model_config = ConfigDict(extra="forbid")\n{fields}'
            '    """The last field."""\n\n\n'
            f"class Checked(BaseModel):\n{fields}"
            "    @field_validator('f0')\n    @classmethod\n"
            "    def v(cls, x):\n        return x\n\n\n"
            f"class Service:\n    def run(self):\n{_lines(60, ' ' * 8)}"
        ),
        "regen/devkit/__init__.py": "",
        "regen/devkit/sim.py": f"def huge():\n{_lines(500)}",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert oversized(tmp_path) == [
        "  325 regen/models.py:Checked (class, max 300)",
        "  301 regen/big.py:Hub (class, max 300)",
        "   62 regen/big.py:outer (function, max 60)",
        "   61 regen/big.py:long (function, max 60)",
        "   61 regen/big.py:outer.inner (function, max 60)",
        "   61 regen/models.py:Service.run (function, max 60)",
    ]
