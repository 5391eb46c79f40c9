"""The simulated server stays split by what it does (regen/devkit/simulate/server.py and the
modules of its stages): no class over 300 lines, no function over 60 (counted as the house
counts them: a definition's first to last line)."""

from __future__ import annotations

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parents[3] / "regen" / "devkit" / "simulate"
#: the server and the modules of its stages
SERVER = ("server", "state", "replies", "intake", "admission", "complete", "streaming", "info")
MAX_CLASS, MAX_FUNCTION = 300, 60


def oversized(source: str) -> list[str]:
    """``name: lines`` of every class over :data:`MAX_CLASS` lines and every function over
    :data:`MAX_FUNCTION`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            limit = MAX_CLASS if isinstance(node, ast.ClassDef) else MAX_FUNCTION
            if size > limit:
                out.append(f"{node.name}: {size}")
    return out


def test_the_counter_finds_a_long_function_and_a_long_class() -> None:
    long_function = "def f():\n" + "    x = 1\n" * 60
    long_class = "class C:\n" + "".join(f"    def m{i}(self):\n        pass\n" for i in range(150))
    assert oversized(long_function) == ["f: 61"]
    assert oversized(long_class) == ["C: 301"]
    assert oversized("def g():\n    return 1\n") == []


def test_no_class_or_function_of_the_server_is_oversized() -> None:
    found = {m: oversized((SIM / f"{m}.py").read_text(encoding="utf-8")) for m in SERVER}
    assert {m: f for m, f in found.items() if f} == {}
