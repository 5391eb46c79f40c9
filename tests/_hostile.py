"""Hypothesis strategies for hostile input, shared by the property tests (``*_property.py``).

- :func:`hostile_value`: a JSON value of any type that a field should not hold (a number, a
  bool, null, a list, an object, a lone surrogate, a long string, chat-template markup);
- :func:`mutated`: a JSON tree with one to four structure-aware mutations: the mutations
  benchmarks/fuzz.py makes line by line (``mutate_tree``), their choices drawn by Hypothesis.

The profile: Hypothesis is configured in tests/conftest.py (``derandomize``, no deadline, no
example database, a fixed example budget per test; ``REGEN_HYPOTHESIS=long`` for a longer run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from benchmarks.fuzz import mutate_tree

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


@dataclass(slots=True)
class DrawPicks:
    """A mutation's choices drawn by Hypothesis (benchmarks.fuzz.Picks)."""

    draw: st.DrawFn

    def choice(self, options: Sequence[Any]) -> Any:
        return self.draw(st.sampled_from(options))

    def count(self, low: int, high: int) -> int:
        return self.draw(st.integers(low, high))

    def value(self) -> Any:
        return self.draw(hostile_value())

    def key(self) -> str:
        return self.draw(st.text(max_size=8))


@st.composite
def mutated(draw: st.DrawFn, tree: Any, most: int = 4) -> Any:
    """``tree`` (not changed) with one to ``most`` mutations (benchmarks.fuzz.mutate_tree)."""
    return mutate_tree(tree, DrawPicks(draw), most)
