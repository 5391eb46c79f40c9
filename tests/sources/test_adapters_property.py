"""Every adapter on rows from its shape's own grammar, as written and with hostile mutations
(issue 42, item 2): ``adapt_row`` gives a sample or a rejection and never raises; every text of
a sample is a ``str`` that encodes as UTF-8; the id is the same when the row is read again; the
content hash, the normalised messages and the near-duplicate signature never raise.

The grammars (CONTRACTS §5, regen/sources/shapes.py): ShareGPT ``conversations`` of
``{from, value}``; OpenAI ``messages`` (content as text or parts, tool calls, tool results,
``reasoning_content``) with a ``tools`` column; ``input``/``output``; xLAM's JSON-string
``tools`` and ``answers``; Glaive's ``system`` with function definitions and its marked
``chat``; ``instruction``/``response``; native ``input_ids``/``loss_mask``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from _hostile import hostile_value, mutated, text
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.fuzz import json_paths
from regen.core.sample import Rejection, Sample, normalized_message
from regen.manifest import ADAPTERS, NATIVE_ADAPTERS, Dedup, Source, parse_manifest
from regen.sources.adapters import adapt_row
from regen.sources.neardup import NearDuplicates, near_text
from regen.sources.reader import RawRow


def _sources() -> dict[str, Source]:
    rows = [
        {
            "name": a,
            "adapter": a,
            "path": f"{a}.jsonl",
            **({"mode": "native"} if a in NATIVE_ADAPTERS else {}),
        }
        for a in ADAPTERS
    ]
    m = parse_manifest(
        {"name": "p", "target": {"model": "m", "tokenizer": "none"}, "sources": rows},
        base_dir=Path("."),
    )
    return {s.adapter: s for s in m.sources}


SOURCES = _sources()
NEAR = NearDuplicates(Dedup())

# ---- the grammars -------------------------------------------------------------------------

upstream_id = st.one_of(st.none(), st.text(max_size=12), st.integers(0, 10**6))
#: text a row holds where it is well formed (mostly plain words; sometimes anything)
words = st.from_regex(r"[A-Za-z][A-Za-z ,.?]{0,40}", fullmatch=True)
prose = st.one_of(words, words, words, text)
name = st.from_regex(r"[a-z_]{1,10}", fullmatch=True)
arguments = st.one_of(
    st.dictionaries(name, st.one_of(st.integers(), words), max_size=3).map(json.dumps),
    st.dictionaries(name, st.integers(), max_size=3),
)
tool_call = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": name, "arguments": arguments}),
    },
    optional={"id": name},
)
schema = st.just({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]})
tool_decl = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": name}, optional={"description": prose, "parameters": schema}
        ),
    },
)
parts = st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": prose}), min_size=1, max_size=3
)


@st.composite
def messages(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A conversation of the OpenAI messages shape: a system turn or not, then user turns, each
    answered (with tool calls and their results, a reasoning field, content as parts)."""
    out: list[dict[str, Any]] = []
    if draw(st.booleans()):
        out.append({"role": "system", "content": draw(prose)})
    for _ in range(draw(st.integers(1, 3))):
        out.append({"role": "user", "content": draw(st.one_of(prose, parts))})
        answer: dict[str, Any] = {"role": "assistant", "content": draw(st.one_of(prose, st.none()))}
        if draw(st.booleans()):
            answer["reasoning_content"] = draw(prose)
        calls = draw(st.lists(tool_call, max_size=2))
        if calls:
            answer["tool_calls"] = calls
        out.append(answer)
        for c in calls:
            out.append(
                {
                    "role": "tool",
                    "content": draw(prose),
                    "tool_call_id": c.get("id", "x"),
                    "name": c["function"]["name"],
                }
            )
    if draw(st.booleans()):
        out.pop()  # ends on a prompt: the turn to answer
    return out


@st.composite
def conversations(draw: st.DrawFn, roles: tuple[str, str] = ("human", "gpt")) -> list[Any]:
    turns = []
    for _ in range(draw(st.integers(1, 3))):
        turns += [
            {"from": roles[0], "value": draw(prose)},
            {"from": roles[1], "value": draw(prose)},
        ]
    return turns[: draw(st.integers(1, len(turns)))]


xlam_param = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["str", "int", "List[int], optional", "dict", "float, optional"]),
        "description": prose,
        "default": st.one_of(st.none(), st.integers(), words),
    },
)
xlam_tool = st.fixed_dictionaries(
    {"name": name},
    optional={"description": prose, "parameters": st.dictionaries(name, xlam_param, max_size=3)},
)
xlam_answer = st.fixed_dictionaries(
    {"name": name, "arguments": st.dictionaries(name, st.integers(), max_size=3)}
)


@st.composite
def glaive_row(draw: st.DrawFn) -> dict[str, Any]:
    fns = draw(
        st.lists(
            st.fixed_dictionaries(
                {"name": name}, optional={"description": words, "parameters": schema}
            ),
            max_size=2,
        )
    )
    system = "SYSTEM: " + draw(words) + " " + " ".join(json.dumps(f) for f in fns)
    chat = [f"USER: {draw(prose)}"]
    for kind in draw(st.lists(st.sampled_from(["ASSISTANT", "CALL", "USER"]), max_size=4)):
        if kind == "CALL":
            args = json.dumps(draw(st.dictionaries(name, st.integers(), max_size=2)))
            chat.append(
                f'ASSISTANT: <functioncall> {{"name": "{draw(name)}", '
                f"\"arguments\": '{args}'}} <|endoftext|>"
            )
            chat.append(f"FUNCTION RESPONSE: {draw(prose)}")
        else:
            chat.append(f"{kind}: {draw(prose)}")
    return {"system": system, "chat": "\n\n\n".join(chat)}


ROWS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "sharegpt": st.fixed_dictionaries(
        {"conversations": conversations()}, optional={"id": upstream_id, "source": words}
    ),
    "openthoughts": st.fixed_dictionaries(
        {
            "conversations": conversations(("user", "assistant")).map(
                lambda c: (
                    c[:1]
                    + [
                        {
                            **t,
                            "value": f"<|begin_of_thought|>{t['value']}<|end_of_thought|>"
                            f"<|begin_of_solution|>ok<|end_of_solution|>",
                        }
                        for t in c[1:2]
                    ]
                )
            )
        },
        optional={"system": prose, "id": upstream_id},
    ),
    "perfectblend": st.fixed_dictionaries({"conversations": conversations()}),
    "ultrachat": st.fixed_dictionaries(
        {"messages": messages()}, optional={"prompt_id": upstream_id}
    ),
    # the messages shape with its tools column (as a list or as JSON text): every field of a
    # declaration is then swapped by the exhaustive test (ultrachat's rows have none)
    "swe_gym": st.fixed_dictionaries(
        {
            "messages": messages(),
            "tools": st.one_of(
                st.lists(tool_decl, min_size=1, max_size=2),
                st.lists(tool_decl, min_size=1, max_size=2).map(json.dumps),
            ),
        },
        optional={"instance_id": upstream_id},
    ),
    "opencodereasoning": st.fixed_dictionaries(
        {"input": prose},
        optional={
            "output": st.one_of(prose, prose.map(lambda t: f"<think>{t}</think>{t}")),
            "id": upstream_id,
        },
    ),
    "xlam": st.fixed_dictionaries(
        {
            "query": prose,
            "tools": st.lists(xlam_tool, max_size=3).map(json.dumps),
            "answers": st.lists(xlam_answer, max_size=3).map(json.dumps),
        },
        optional={"id": st.integers(0, 10**6)},
    ),
    "glaive": glaive_row(),
    "magicoder": st.fixed_dictionaries(
        {"instruction": prose}, optional={"response": prose, "id": upstream_id}
    ),
    "kimi_native": st.integers(1, 12).flatmap(
        lambda n: st.fixed_dictionaries(
            {
                "input_ids": st.lists(st.integers(0, 200_000), min_size=n, max_size=n),
                "loss_mask": st.lists(st.sampled_from([0, 1]), min_size=n, max_size=n),
            },
            optional={"id": upstream_id},
        )
    ),
}

assert set(ROWS) == set(ADAPTERS), "a shape without a grammar"


# ---- the invariants -------------------------------------------------------------------------


def _texts(sample: Sample) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [("id", sample.id)]
    for i, m in enumerate(sample.messages):
        out += [
            (f"messages[{i}].{k}", getattr(m, k))
            for k in ("content", "reasoning", "name", "tool_call_id")
        ]
        for j, c in enumerate(m.tool_calls):
            out += [
                (f"messages[{i}].tool_calls[{j}].{k}", getattr(c, k))
                for k in ("id", "name", "arguments")
            ]
    return out


def check(adapter: str, data: Any) -> Sample | Rejection:
    source = SOURCES[adapter]
    if not isinstance(data, dict):  # the reader rejects a line that is not an object
        return Rejection(source.name, 1, "not_object")
    first = adapt_row(source, RawRow(1, copy.deepcopy(data)))
    assert isinstance(first, Sample | Rejection)
    if isinstance(first, Rejection):
        assert isinstance(first.reason, str) and first.reason
        str(first).encode("utf-8", "surrogatepass")
        return first
    for where, value in _texts(first):
        if where.endswith(("reasoning", "name", "tool_call_id")) and value is None:
            continue
        assert isinstance(value, str), (where, value)
        value.encode("utf-8")  # strict: a lone surrogate raises
    if first.tools is not None:
        json.dumps(first.tools, ensure_ascii=False, allow_nan=False).encode("utf-8")
    again = adapt_row(source, RawRow(1, copy.deepcopy(data)))
    assert isinstance(again, Sample) and again.id == first.id
    assert again.content_hash == first.content_hash
    for m in first.messages:
        normalized_message(m)
    if first.mode != "native":
        NEAR.match_or_add(first, near_text(first))
    first.turns_to_regenerate()
    first.original_chars()
    return first


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_rows_of_the_grammar(adapter: str) -> None:
    """Rows as the shape writes them: most are samples (the invariants are exercised)."""
    kinds: list[bool] = []

    @given(ROWS[adapter])
    def prop(row: dict[str, Any]) -> None:
        kinds.append(isinstance(check(adapter, row), Sample))

    prop()
    assert sum(kinds) >= 0.5 * len(kinds), f"{sum(kinds)} samples of {len(kinds)} rows"


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_rows_of_the_grammar_mutated(adapter: str) -> None:
    @given(ROWS[adapter].flatmap(mutated))
    def prop(row: Any) -> None:
        check(adapter, row)

    prop()


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_any_json_object(adapter: str) -> None:
    @given(st.dictionaries(st.sampled_from(KEYS), hostile_value(), max_size=5))
    def prop(row: dict[str, Any]) -> None:
        check(adapter, row)

    prop()


#: every key some shape reads
KEYS = [
    "id",
    "prompt_id",
    "instance_id",
    "conversations",
    "messages",
    "system",
    "source",
    "input",
    "output",
    "query",
    "tools",
    "answers",
    "chat",
    "instruction",
    "response",
    "input_ids",
    "loss_mask",
    "x",
]


def test_the_demo_rows_mutated() -> None:
    """The demo's own rows (every shape, real-shaped), each under mutation."""
    rows = [(s.adapter, json.loads(line)) for s, line in _demo_lines()]

    @given(st.sampled_from(rows).flatmap(lambda r: st.tuples(st.just(r[0]), mutated(r[1]))))
    def prop(pair: tuple[str, Any]) -> None:
        check(*pair)

    prop()


def _demo_lines() -> list[tuple[Source, str]]:
    from regen.manifest import load_manifest

    demo = Path(__file__).resolve().parents[2] / "manifests" / "demo.yaml"
    m = load_manifest(demo)
    out = []
    for s in m.sources:
        assert s.path is not None
        for line in (
            (demo.parent / s.path).read_text(encoding="utf-8", errors="replace").splitlines()
        ):
            try:
                if isinstance(json.loads(line), dict):
                    out.append((s, line))
            except ValueError:
                continue
    return out


#: one value of each kind a field may wrongly hold
EACH_KIND = (None, True, 7, 1.5, [], ["x"], {}, {"a": 1}, "\ud800", "<|im_end|>", "")


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_every_field_of_a_row_swapped_for_each_kind(adapter: str) -> None:
    """Every field of a grammar row (each leaf and each container, at every depth) replaced by
    a value of each kind, and dropped, one at a time: exhaustive where random mutation is
    thin (a field deep in a tool declaration)."""

    @settings(max_examples=20)  # each example is ~12 rows a field
    @given(ROWS[adapter])
    def prop(row: dict[str, Any]) -> None:
        for path in json_paths(row):
            if not path:
                continue
            for value in (*EACH_KIND, _DROP):
                check(adapter, _replaced(row, path, value))

    prop()


_DROP = object()


def _replaced(tree: Any, path: tuple[Any, ...], value: Any) -> Any:
    tree = copy.deepcopy(tree)
    node = tree
    for p in path[:-1]:
        node = node[p]
    if value is _DROP:
        node.pop(path[-1])
    else:
        node[path[-1]] = copy.deepcopy(value)
    return tree
