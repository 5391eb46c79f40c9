"""The metrics an engine's own code declares, read from its source with ``ast`` (not imported:
SGLang's ``metrics_collector.py`` and vLLM's ``loggers.py`` import torch, CUDA helpers and their
whole runtime).

:func:`declared` finds every ``Gauge`` / ``Counter`` / ``Histogram`` / ``Summary`` construction
(directly, or through the engines' injectable ``self._gauge_cls(...)`` hooks) whose ``name`` is
a string literal with the engine's prefix, and evaluates its ``labelnames`` expression: list
and tuple literals, ``+``, ``*spread``, ``list(...)``, ``X.keys()`` of the collector's label
dict, and names assigned a list earlier in the same function. Counters are keyed without
``_total`` (``prometheus_client`` strips it from the family and adds it to the sample), as a
parsed page names them. Each entry records the class whose code declares it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

#: constructor name -> metric type (the family type a page declares)
TYPES = {
    "Gauge": "gauge",
    "_gauge_cls": "gauge",
    "Counter": "counter",
    "_counter_cls": "counter",
    "Histogram": "histogram",
    "_histogram_cls": "histogram",
    "Summary": "summary",
    "_summary_cls": "summary",
}


@dataclass(frozen=True, slots=True)
class Declared:
    name: str  #: the family name (counters without _total)
    type: str
    labels: frozenset[str] | None  #: None: the expression could not be read statically
    owner: str  #: the class (or function) whose code declares it


class _Unknown(Exception):
    pass


def _callee(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return None


def _eval(node: ast.AST, env: dict[str, ast.AST], base: tuple[str, ...]) -> list[str]:
    """The label names ``node`` evaluates to (``base``: the collector's own labels)."""
    if isinstance(node, ast.List | ast.Tuple):
        out: list[str] = []
        for elt in node.elts:
            if isinstance(elt, ast.Starred):
                out += _eval(elt.value, env, base)
            elif isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                out.append(elt.value)
            else:
                raise _Unknown
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _eval(node.left, env, base) + _eval(node.right, env, base)
    if isinstance(node, ast.Call):
        name = _callee(node)
        if name == "keys" and not node.args:  # labels.keys(): the collector's labels
            return list(base)
        if name == "list" and len(node.args) == 1:
            return _eval(node.args[0], env, base)
    if isinstance(node, ast.Name):
        if node.id in env:
            return _eval(env[node.id], env, base)
        if node.id in ("labelnames", "labels"):  # a parameter: the collector's labels
            return list(base)
    raise _Unknown


def _assignments(fn: ast.AST) -> dict[str, ast.AST]:
    env: dict[str, ast.AST] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and isinstance(node.value, ast.List | ast.BinOp):
                env[target.id] = node.value
    return env


def declared(
    path: Path, prefix: str, base: dict[str, tuple[str, ...]], default: tuple[str, ...] = ()
) -> dict[str, Declared]:
    """Every metric ``path`` declares with ``prefix``; ``base`` gives the label names that
    ``labels.keys()`` / a ``labelnames`` parameter stand for, per declaring class."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: dict[str, Declared] = {}
    for owner in ast.walk(tree):
        if not isinstance(owner, ast.ClassDef | ast.FunctionDef) or owner.col_offset != 0:
            continue
        labels_of_owner = base.get(owner.name, default)
        for fn in ast.walk(owner):
            if not isinstance(fn, ast.FunctionDef):
                continue
            env = _assignments(fn)
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call) or _callee(node) not in TYPES:
                    continue
                kw = {k.arg: k.value for k in node.keywords if k.arg}
                name_node = kw.get("name") or (node.args[0] if node.args else None)
                if not (isinstance(name_node, ast.Constant) and isinstance(name_node.value, str)):
                    continue
                name = name_node.value
                if not name.startswith(prefix):
                    continue
                kind = TYPES[_callee(node) or ""]
                if kind == "counter" and name.endswith("_total"):
                    name = name[: -len("_total")]
                try:
                    names = _eval(kw["labelnames"], env, labels_of_owner)
                    labels: frozenset[str] | None = frozenset(names)
                except (_Unknown, KeyError):
                    labels = None
                out.setdefault(name, Declared(name, kind, labels, owner.name))
    return out


def dict_keys(path: Path, function: str, variable: str = "labels") -> tuple[str, ...]:
    """The keys of the dict literal assigned to ``variable`` in ``function`` (the label dict a
    collector is built with), in order."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == function:
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Assign)
                    and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id == variable
                    and isinstance(node.value, ast.Dict)
                ):
                    return tuple(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    raise LookupError(f"no dict literal {variable} = {{...}} in {function}() of {path}")


def subscript_keys(path: Path, function: str, variable: str = "labels") -> set[str]:
    """The keys ``function`` adds with ``variable["key"] = ...`` (labels set only sometimes)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    keys: set[str] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == function:
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
                    t = node.targets[0]
                    named = isinstance(t.value, ast.Name) and t.value.id == variable
                    if named and isinstance(t.slice, ast.Constant):
                        keys.add(t.slice.value)
    return keys
