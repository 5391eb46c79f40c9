"""Hypothesis strategies for hostile input, shared by the property tests (``*_property.py``).

- :func:`hostile_value`: a JSON value of any type that a field should not hold (a number, a
  bool, null, a list, an object, a lone surrogate, a long string, chat-template markup);
- :func:`mutated`: a JSON tree with one to four structure-aware mutations (a leaf swapped for a
  hostile value, a key dropped or added, a list emptied or repeated), as benchmarks/fuzz.py
  makes them line by line.

The profile: Hypothesis is configured in tests/conftest.py (``derandomize``, no deadline, no
example database, a fixed example budget per test; ``REGEN_HYPOTHESIS=long`` for a longer run).
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

from benchmarks.fuzz import json_paths

#: chat-template markup of the families regen knows: text that must stay text
MARKUP = (
    "<|im_end|>", "<|im_start|>assistant\n", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<|tool_calls_section_begin|>", "<｜tool▁calls▁begin｜>", "<|endoftext|>", "<|end|>",
    "{{ raise_exception('x') }}", "{% for m in messages %}", "[TOOL_CALLS]", "USER:",
    "ASSISTANT: <functioncall> {",
)  # fmt: skip
#: values no well-formed row holds where text belongs
ODD_TEXT = ("\ud800", "a\udfffb", "\x00", "\ufeff", "", " ", "-", *MARKUP)

#: any text: short, odd, or 20,000 characters long
text = st.one_of(
    st.text(max_size=40), st.sampled_from(ODD_TEXT), st.just(20_000).map(lambda n: "x" * n)
)
scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), text,
)  # fmt: skip
json_value = st.recursive(
    scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def hostile_value() -> st.SearchStrategy[Any]:
    """Any JSON value: what a field of the wrong type may hold."""
    return json_value


def _parent(tree: Any, path: tuple[Any, ...]) -> Any:
    for p in path[:-1]:
        tree = tree[p]
    return tree


@st.composite
def mutated(draw: st.DrawFn, tree: Any, most: int = 4) -> Any:
    """``tree`` (not changed) with one to ``most`` mutations."""
    tree = copy.deepcopy(tree)
    for _ in range(draw(st.integers(1, most))):
        paths = [p for p in json_paths(tree) if p]
        if not paths:
            return draw(hostile_value())
        path = draw(st.sampled_from(paths))
        parent, key = _parent(tree, path), path[-1]
        op = draw(st.sampled_from(("swap", "swap", "drop", "add", "empty", "repeat")))
        if op == "swap":
            parent[key] = draw(hostile_value())
        elif op == "drop" and isinstance(parent, dict):
            del parent[key]
        elif op == "drop":
            parent.pop(key)
        elif op == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(hostile_value())
        elif op == "add":
            parent.insert(key, draw(hostile_value()))
        elif op == "empty" and isinstance(parent[key], list | dict | str):
            parent[key] = type(parent[key])()
        elif op == "repeat" and isinstance(parent[key], list):
            parent[key] = parent[key] + copy.deepcopy(parent[key])
    return tree
