"""Text that is not valid Unicode is never fatal: one rule for every adapter and every field.

A JSON escape such as ``"\\ud800"`` (scraped ShareGPT dumps hold them) decodes to a lone
surrogate, which no UTF-8 encoder accepts. The rule (regen.core.sample): such a row is skipped as
``invalid_unicode``, with the field that holds it, like any other unusable row, and every
other row is read. These tests generate such rows from a good row of every adapter, once per
string in it (and inside the JSON-string columns the adapters decode), the way a JSON writer
that escapes non-ASCII text writes them.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from _sources_helpers import one_source

from regen.core.sample import Rejection, Sample
from regen.manifest import ADAPTERS
from regen.plan.report import build_plan
from regen.sources import iter_source, read_samples, source_set
from regen.sources.stream import ReadStats

XLAM_TOOL = {
    "name": "get_weather",
    "description": "Weather.",
    "parameters": {"city": {"type": "str", "description": "City."}},
}
GLAIVE_FN = {"name": "price", "description": "Price", "parameters": {"type": "object"}}
SWE_CALL = {"id": "c1", "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "ls"}'}}  # fmt: skip
#: a good row of every adapter (every string in it is replaced in turn)
GOOD: dict[str, dict[str, Any]] = {
    "sharegpt": {"id": "a1", "conversations": [{"from": "human", "value": "Hi"},
                                                {"from": "gpt", "value": "Hello"}]},
    "openthoughts": {"system": "Think.", "conversations": [
        {"from": "human", "value": "2+2?"},
        {"from": "gpt", "value": "<|begin_of_thought|>hm<|end_of_thought|>4"}]},
    "perfectblend": {"source": "x", "conversations": [{"from": "human", "value": "Q"},
                                                      {"from": "gpt", "value": "A"}]},
    "ultrachat": {"prompt": "Hi", "prompt_id": "p1", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello"}]},
    "swe_gym": {"instance_id": "r__p-1", "messages": [
        {"role": "system", "content": "You code."},
        {"role": "user", "content": "List files."},
        {"role": "assistant", "content": "Sure.", "tool_calls": [SWE_CALL]},
        {"role": "tool", "content": "a.py", "tool_call_id": "c1", "name": "bash"},
        {"role": "assistant", "content": "Done."}]},
    "opencodereasoning": {"id": "q1", "input": "Print 1.", "output": "<think>e</think>print(1)"},
    "xlam": {"id": 7, "query": "Oslo?", "tools": json.dumps([XLAM_TOOL]),
             "answers": json.dumps([{"name": "get_weather", "arguments": {"city": "Oslo"}}])},
    "glaive": {"system": "SYSTEM: Use -\n" + json.dumps(GLAIVE_FN),
               "chat": "USER: Price?\nASSISTANT: It is 3. <|endoftext|>"},
    "magicoder": {"instruction": "Sort a list.", "response": "sorted(x)"},
    "kimi_native": {"id": "n1", "input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]},
}  # fmt: skip
LONE = "\ud800"


def strings(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every string under ``value``."""
    if isinstance(value, str):
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in strings(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in strings(v, (*path, i))]
    return []


def dotted(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def with_text(row: dict[str, Any], path: tuple[Any, ...], text: str) -> dict[str, Any]:
    """A copy of ``row`` whose string at ``path`` gets ``text`` inserted in its middle."""
    new = copy.deepcopy(row)
    node = new
    for part in path[:-1]:
        node = node[part]
    old = node[path[-1]]
    node[path[-1]] = old[: len(old) // 2] + text + old[len(old) // 2 :]
    return new


CASES = [(a, p) for a in ADAPTERS for p in strings(GOOD[a])]


def read(tmp: Path, adapter: str, rows: list[dict[str, Any]]) -> list[Sample | Rejection]:
    # json.dumps escapes non-ASCII (ensure_ascii): a lone surrogate is written as \ud800
    lines = [json.dumps(r).encode() for r in rows]
    m = one_source(tmp, adapter, lines)
    return list(iter_source(source_set(m), m.sources[0]))


def test_every_adapter_has_a_good_row() -> None:
    assert set(GOOD) == set(ADAPTERS)


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_the_good_rows_are_samples(tmp_path: Path, adapter: str) -> None:
    (s,) = read(tmp_path, adapter, [GOOD[adapter]])
    assert isinstance(s, Sample), s


@pytest.mark.parametrize(("adapter", "path"), CASES, ids=[f"{a}:{dotted(p)}" for a, p in CASES])
def test_a_lone_surrogate_in_any_field_skips_the_row_naming_the_field(
    tmp_path: Path, adapter: str, path: tuple[Any, ...]
) -> None:
    bad = with_text(GOOD[adapter], path, LONE)
    first, second = read(tmp_path, adapter, [bad, GOOD[adapter]])
    assert isinstance(first, Rejection), first
    assert (first.row, first.reason, first.field) == (1, "invalid_unicode", dotted(path))
    assert "U+D800" in first.detail
    str(first).encode("utf-8")  # the warning itself is writable
    assert isinstance(second, Sample)  # the next row is read as usual


@pytest.mark.parametrize(("adapter", "path"), CASES, ids=[f"{a}:{dotted(p)}" for a, p in CASES])
def test_a_valid_surrogate_pair_anywhere_is_kept(
    tmp_path: Path, adapter: str, path: tuple[Any, ...]
) -> None:
    row = with_text(GOOD[adapter], path, "\U0001f600")  # written as \ud83d\ude00
    (s,) = read(tmp_path, adapter, [row])
    assert not (isinstance(s, Rejection) and s.reason == "invalid_unicode"), s


#: strings inside the JSON-string columns an adapter decodes itself (the raw row is valid
#: text there: only the decoded sample holds the surrogate), with the sample field named
NESTED = [
    ("xlam", {"tools": json.dumps([{**XLAM_TOOL, "name": "get" + LONE}])},
     "tools[0].function.name"),
    ("xlam", {"answers": json.dumps([{"name": "get_weather", "arguments": {"city": LONE}}])},
     "messages[1].tool_calls[0].arguments"),
    ("xlam", {"tools": json.dumps([{**XLAM_TOOL, "description": "W" + LONE}])},
     "tools[0].function.description"),
    ("glaive", {"system": "SYSTEM: Use -\n" + json.dumps({**GLAIVE_FN, "name": LONE})},
     "tools[0].function.name"),
    ("ultrachat", {"tools": json.dumps([{"type": "function", "function": {"name": LONE}}])},
     "tools[0].function.name"),
]  # fmt: skip


@pytest.mark.parametrize(("adapter", "change", "field"), NESTED)
def test_a_lone_surrogate_in_a_decoded_json_column_skips_the_row(
    tmp_path: Path, adapter: str, change: dict[str, Any], field: str
) -> None:
    row = {**GOOD[adapter], **change}
    (r,) = read(tmp_path, adapter, [row])
    assert isinstance(r, Rejection), r
    assert (r.reason, r.field) == ("invalid_unicode", field)


def test_upper_case_escapes_are_found_too(tmp_path: Path) -> None:
    line = b'{"id": "u", "conversations": [{"from": "human", "value": "x\\uDBFF y"}]}'
    m = one_source(tmp_path, "sharegpt", [line])
    (r,) = list(iter_source(source_set(m), m.sources[0]))
    assert isinstance(r, Rejection) and r.reason == "invalid_unicode"


def test_plan_and_read_skip_the_same_rows_and_say_so_once(tmp_path: Path, caplog) -> None:
    rows = [with_text(GOOD["sharegpt"], p, LONE) for p in strings(GOOD["sharegpt"])]
    rows += [{**GOOD["sharegpt"], "id": f"ok{i}"} for i in range(3)]
    lines = [json.dumps(r).encode() for r in rows]
    m = one_source(tmp_path, "sharegpt", lines)
    with caplog.at_level(logging.WARNING, logger="regen.sources.stream"):
        stats = ReadStats()
        kept = list(read_samples(source_set(m), stats))
    st = stats.sources["sharegpt"]
    n_bad = len(rows) - 3
    assert st.rejected == {"invalid_unicode": n_bad} and st.kept == len(kept)
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping")]
    assert len(skipped) == n_bad and all("invalid_unicode" in s for s in skipped)
    plan = build_plan(m, tok_per_s=100.0)
    assert plan.to_dict()["sources"]["sharegpt"]["rejected"] == {"invalid_unicode": n_bad}
    assert plan.to_dict()["sources"]["sharegpt"]["kept"] == len(kept)
    json.dumps(plan.to_dict(), ensure_ascii=False).encode("utf-8")  # plan --json writes it
