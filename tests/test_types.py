"""Types: how much ``Any`` regen lets through, and the type checker's configuration.

``./scripts/test`` runs mypy with the configuration in pyproject.toml (regen in mypy's default
mode; the packages of :data:`STRICT` strict). What mypy cannot see is ``Any``: here the name
``Any`` is counted (every NAME token ``Any``: an import, an annotation, ``typing.Any``) per
1,000 lines of regen's code outside the devkit, a line being one that is neither blank nor a
comment (its stripped text starts with ``#``); docstrings count as lines, their words do not
count as names.
"""

from __future__ import annotations

import io
import tokenize
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the most ``Any`` per 1,000 lines (issue 44; 29.4 when it was filed)
LIMIT_PER_1000 = 8.0
#: the packages mypy checks strictly (pyproject.toml's override)
STRICT = ("core", "store", "engine", "client", "export", "targets", "plan")
#: the flags of mypy's ``--strict`` that a module may set (``warn_redundant_casts`` and
#: ``warn_unused_configs`` are global: pyproject.toml's [tool.mypy] sets them)
STRICT_FLAGS = {
    "disallow_any_generics": True,
    "disallow_subclassing_any": True,
    "disallow_untyped_calls": True,
    "disallow_untyped_defs": True,
    "disallow_incomplete_defs": True,
    "check_untyped_defs": True,
    "disallow_untyped_decorators": True,
    "warn_unused_ignores": True,
    "warn_return_any": True,
    "implicit_reexport": False,
    "strict_equality": True,
    "extra_checks": True,
}


def any_names(text: str) -> int:
    """How many NAME tokens ``Any`` ``text`` holds."""
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return sum(1 for t in tokens if t.type == tokenize.NAME and t.string == "Any")


def code_lines(text: str) -> int:
    """Lines that are neither blank nor a comment."""
    return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


def count(root: Path) -> tuple[Counter[str], int]:
    """``Any`` per file (files with none left out) and the lines of regen outside the devkit."""
    found: Counter[str] = Counter()
    lines = 0
    for path in sorted((root / "regen").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("regen/devkit/"):
            continue
        text = path.read_text(encoding="utf-8")
        lines += code_lines(text)
        if n := any_names(text):
            found[rel] = n
    return found, lines


def test_any_is_rare() -> None:
    found, lines = count(ROOT)
    total = sum(found.values())
    rate = 1000 * total / lines
    top = ", ".join(f"{f} {n}" for f, n in found.most_common(12))
    assert rate <= LIMIT_PER_1000, (
        f"{total} Any in {lines:,} lines of regen outside the devkit: {rate:.1f} per 1,000, "
        f"more than {LIMIT_PER_1000:g}; most: {top}"
    )


def test_the_count_reads_names_not_words() -> None:
    text = (
        '"""Any docstring: Any words."""\n'
        "from typing import Any  # Any in a comment\n"
        "\n"
        "# Any\n"
        "def f(x: Any, y: typing.Any) -> AnyStr:\n"
        "    return 'Any' + x.Any\n"
    )
    assert any_names(text) == 4  # the import, x, typing.Any, x.Any
    assert code_lines(text) == 4


def test_mypy_is_strict_on_the_packages_that_hold_the_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert config["files"] == ["regen"]
    assert config["warn_redundant_casts"] and config["warn_unused_configs"]
    strict = [o for o in config["overrides"] if o.get("disallow_untyped_defs")]
    assert len(strict) == 1
    assert sorted(strict[0]["module"]) == sorted(f"regen.{p}.*" for p in STRICT)
    assert {k: v for k, v in strict[0].items() if k != "module"} == STRICT_FLAGS
