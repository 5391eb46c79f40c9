"""Each of the ten adapters on good rows and on bad rows (reason code and field checked)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from _sources_helpers import one_source

from regen.core.sample import Message, Rejection, Sample, ToolCall
from regen.manifest import ADAPTERS
from regen.sources import NATIVE_ADAPTERS, PARSERS, iter_source, source_set


def run(tmp: Path, adapter: str, rows: list[Any], **extra: Any) -> list[Sample | Rejection]:
    m = one_source(tmp, adapter, rows, **extra)
    return list(iter_source(source_set(m), m.sources[0]))


def only_sample(items: list[Sample | Rejection]) -> Sample:
    assert len(items) == 1 and isinstance(items[0], Sample), items
    return items[0]


def rejection(items: list[Sample | Rejection]) -> Rejection:
    assert len(items) == 1 and isinstance(items[0], Rejection), items
    return items[0]


def test_every_manifest_adapter_has_a_parser() -> None:
    assert set(PARSERS) | NATIVE_ADAPTERS == set(ADAPTERS)


# --- sharegpt / perfectblend / openthoughts (from/value) -------------------------------------


def test_sharegpt_good_maps_roles_and_keeps_upstream_id(tmp_path: Path) -> None:
    row = {
        "id": "abc_0",
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello!"},
            {"from": "human", "value": "Weather?"},
            {"from": "bing", "value": "Sunny."},
            {"from": "human", "value": "And tomorrow?"},
            {"from": "chatgpt", "value": "Rain."},
            {"from": "human", "value": "Ok"},
            {"from": "bard", "value": "Bye."},
        ],
    }
    s = only_sample(run(tmp_path, "sharegpt", [row]))
    assert re.fullmatch(r"sharegpt:abc_0#[0-9a-f]{8}", s.id), s.id
    assert [m.role for m in s.messages] == ["system"] + ["user", "assistant"] * 4
    assert s.messages[2] == Message("assistant", "Hello!")
    assert s.mode == "regenerate" and s.turns == "all" and s.turns_to_regenerate() == 4
    assert s.row == 1


@pytest.mark.parametrize(
    ("row", "reason", "field"),
    [
        ({"id": "1"}, "missing_field", "conversations"),
        ({"conversations": "hi"}, "wrong_type", "conversations"),
        (
            {"conversations": [{"from": "alien", "value": "x"}]},
            "unknown_role",
            "conversations[0].from",
        ),
        (
            {"conversations": [{"from": "human", "value": 3}]},
            "wrong_type",
            "conversations[0].value",
        ),
        ({"conversations": [{"from": "gpt", "value": "only me"}]}, "no_user_turn", None),
        ({"conversations": [{"from": "human", "value": "  "}]}, "empty_prompt", None),
        (
            {"conversations": [{"from": "gpt", "value": "Sure!"}, {"from": "human", "value": "a"}]},
            "assistant_first",
            "messages[0]",
        ),
        (
            {"conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": ""}]},
            "empty_turn",
            "messages[1]",
        ),
    ],
)
def test_sharegpt_bad(tmp_path: Path, row: dict[str, Any], reason: str, field: str | None) -> None:
    r = rejection(run(tmp_path, "sharegpt", [row]))
    assert (r.source, r.row, r.reason, r.field) == ("sharegpt", 1, reason, field)


def test_perfectblend_good_has_hash_id_and_upstream_source(tmp_path: Path) -> None:
    row = {
        "conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}],
        "source": "metamath",
    }
    s = only_sample(run(tmp_path, "perfectblend", [row]))
    assert s.id.startswith("perfectblend:h") and len(s.id) == len("perfectblend:h") + 16
    assert s.meta == {"upstream_source": "metamath"}


def test_perfectblend_bad(tmp_path: Path) -> None:
    r = rejection(run(tmp_path, "perfectblend", [{"conversations": [{"value": "x"}]}]))
    assert (r.reason, r.field) == ("unknown_role", "conversations[0].from")


def test_openthoughts_good_system_column_and_reasoning_split(tmp_path: Path) -> None:
    answer = (
        "<|begin_of_thought|>\n\n7 * 6 = 42\n\n<|end_of_thought|>\n\n"
        "<|begin_of_solution|>\n\n**42**\n\n<|end_of_solution|>"
    )
    row = {
        "system": "Think first.",
        "conversations": [
            {"from": "user", "value": "7*6?"},
            {"from": "assistant", "value": answer},
        ],
    }
    s = only_sample(run(tmp_path, "openthoughts", [row]))
    assert s.messages == [
        Message("system", "Think first."),
        Message("user", "7*6?"),
        Message("assistant", "**42**", reasoning="7 * 6 = 42"),
    ]


def test_openthoughts_bad(tmp_path: Path) -> None:
    r = rejection(run(tmp_path, "openthoughts", [{"system": "s", "problem": "x"}]))
    assert (r.reason, r.field) == ("missing_field", "conversations")


# --- ultrachat / swe_gym (OpenAI messages) ----------------------------------------------------


def test_ultrachat_good_prompt_id_and_content_parts(tmp_path: Path) -> None:
    row = {
        "prompt": "Hi",
        "prompt_id": "p1",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"text": "there"}]},
            {"role": "assistant", "content": "Hello"},
        ],
    }
    s = only_sample(run(tmp_path, "ultrachat", [row]))
    assert re.fullmatch(r"ultrachat:p1#[0-9a-f]{8}", s.id), s.id
    assert s.messages == [Message("user", "Hi there"), Message("assistant", "Hello")]


@pytest.mark.parametrize(
    ("row", "reason", "field"),
    [
        ({"prompt_id": "x"}, "missing_field", "messages"),
        ({"messages": [{"role": "narrator", "content": "x"}]}, "unknown_role", "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "wrong_type", "messages[0].content"),
        ({"messages": ["hi"]}, "wrong_type", "messages[0]"),
    ],
)
def test_ultrachat_bad(tmp_path: Path, row: dict[str, Any], reason: str, field: str) -> None:
    r = rejection(run(tmp_path, "ultrachat", [row]))
    assert (r.reason, r.field) == (reason, field)


def _swe_row(arguments: Any) -> dict[str, Any]:
    return {
        "instance_id": "repo__proj-1",
        "messages": [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Fix the bug."},
            {
                "role": "assistant",
                "content": "Looking.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "execute_bash", "arguments": arguments},
                    }
                ],
            },
            {"role": "tool", "content": "a.py", "tool_call_id": "call_1", "name": "execute_bash"},
            {"role": "assistant", "content": "Fixed."},
        ],
    }


def test_swe_gym_good_tool_turns_and_last_turn(tmp_path: Path) -> None:
    rows = [_swe_row('{"command": "ls"}'), _swe_row({"command": "ls"})]
    s1, s2 = run(tmp_path, "swe_gym", rows, turns="last")
    assert isinstance(s1, Sample) and isinstance(s2, Sample)
    s = s1
    prefix = "swe_gym:repo__proj-1#"
    assert s.id.startswith(prefix) and len(s.id) == len(prefix) + 8
    assert s.messages[2].tool_calls == (ToolCall("call_1", "execute_bash", '{"command": "ls"}'),)
    assert s.messages[3] == Message("tool", "a.py", tool_call_id="call_1", name="execute_bash")
    assert s.turns == "last" and s.turns_to_regenerate() == 1
    # a dict argument is dumped to the same JSON: same content, same id
    assert s2.id == s1.id and s2.content_hash == s1.content_hash


def test_swe_gym_trajectories_of_one_instance_get_order_independent_ids(tmp_path: Path) -> None:
    a, b = _swe_row('{"command": "ls"}'), _swe_row('{"command": "pwd"}')
    ids_ab = [s.id for s in run(tmp_path, "swe_gym", [a, b], turns="last")]
    ids_ba = [s.id for s in run(tmp_path, "swe_gym", [b, a], turns="last")]
    assert ids_ab[0] != ids_ab[1]
    assert ids_ab == ids_ba[::-1]


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ('{"command": "ls', "messages[2].tool_calls[0].function.arguments"),
        (42, "messages[2].tool_calls[0].function.arguments"),
    ],
)
def test_swe_gym_bad_tool_json(tmp_path: Path, arguments: Any, field: str) -> None:
    r = rejection(run(tmp_path, "swe_gym", [_swe_row(arguments)], turns="last"))
    assert (r.reason, r.field) == ("bad_tool_json", field)


def test_swe_gym_bad_tool_call_without_name(tmp_path: Path) -> None:
    row = _swe_row("{}")
    row["messages"][2]["tool_calls"][0]["function"] = {"arguments": "{}"}
    r = rejection(run(tmp_path, "swe_gym", [row], turns="last"))
    assert (r.reason, r.field) == ("bad_tool_json", "messages[2].tool_calls[0]")


# --- opencodereasoning (input/output) ---------------------------------------------------------


def test_opencodereasoning_good_splits_think(tmp_path: Path) -> None:
    row = {"id": "q1", "input": "Print 1.", "output": "<think>\neasy\n</think>\n\nprint(1)"}
    s = only_sample(run(tmp_path, "opencodereasoning", [row]))
    assert re.fullmatch(r"opencodereasoning:q1#[0-9a-f]{8}", s.id), s.id
    assert s.messages == [
        Message("user", "Print 1."),
        Message("assistant", "print(1)", reasoning="easy"),
    ]


@pytest.mark.parametrize(
    ("row", "reason", "field"),
    [
        ({"id": "q", "input": "-", "output": "x"}, "empty_prompt", "input"),
        ({"id": "q", "output": "x"}, "missing_field", "input"),
        ({"id": "q", "input": ["a"]}, "wrong_type", "input"),
    ],
)
def test_opencodereasoning_bad(
    tmp_path: Path, row: dict[str, Any], reason: str, field: str
) -> None:
    r = rejection(run(tmp_path, "opencodereasoning", [row]))
    assert (r.reason, r.field) == (reason, field)


# --- xlam -------------------------------------------------------------------------------------

XLAM_TOOL = {
    "name": "get_weather",
    "description": "Weather.",
    "parameters": {
        "city": {"description": "City.", "type": "str"},
        "units": {"description": "Units.", "type": "str, optional", "default": "metric"},
        "days": {"description": "Days.", "type": "List[int], optional"},
    },
}


def test_xlam_good_user_turn_tools_and_calls(tmp_path: Path) -> None:
    answers = [{"name": "get_weather", "arguments": {"city": "Oslo"}}]
    row = {
        "id": 7,
        "query": "Oslo?",
        "tools": json.dumps([XLAM_TOOL]),
        "answers": json.dumps(answers),
    }
    s = only_sample(run(tmp_path, "xlam", [row]))
    assert s.id == "xlam:7"
    assert s.messages == [
        Message("user", "Oslo?"),
        Message(
            "assistant",
            "",
            tool_calls=(ToolCall("functions.get_weather:0", "get_weather", '{"city": "Oslo"}'),),
        ),
    ]
    assert s.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "description": "City."},
                        "units": {"type": "string", "description": "Units.", "default": "metric"},
                        "days": {"type": "array", "description": "Days."},
                    },
                    "required": ["city"],
                },
            },
        }
    ]


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"query": "q", "tools": "[", "answers": "[]"}, "tools"),
        ({"query": "q", "tools": "[]", "answers": '[{"name": "f"'}, "answers"),
        ({"query": "q", "tools": '{"name": "f"}', "answers": "[]"}, "tools"),
        ({"query": "q", "tools": "[]", "answers": '[{"arguments": {}}]'}, "answers[0]"),
        ({"query": "q", "tools": '[{"description": "x"}]', "answers": "[]"}, "tools[0]"),
    ],
)
def test_xlam_bad_tool_json(tmp_path: Path, row: dict[str, Any], field: str) -> None:
    r = rejection(run(tmp_path, "xlam", [row]))
    assert (r.reason, r.field) == ("bad_tool_json", field)


def test_xlam_bad_missing_query(tmp_path: Path) -> None:
    r = rejection(run(tmp_path, "xlam", [{"tools": "[]", "answers": "[]"}]))
    assert (r.reason, r.field) == ("missing_field", "query")


# --- glaive -----------------------------------------------------------------------------------

GLAIVE_FN = {
    "name": "get_stock_price",
    "description": "Price",
    "parameters": {"type": "object", "properties": {"symbol": {"type": "string"}}},
}
GLAIVE_SYSTEM = (
    "SYSTEM: You are a helpful assistant with access to the following functions. "
    "Use them if required -\n" + json.dumps(GLAIVE_FN, indent=4) + "\n\n"
)
GLAIVE_CHAT = (
    "USER: Apple price?\n\n\n"
    'ASSISTANT: <functioncall> {"name": "get_stock_price", "arguments": '
    '\'{"symbol": "AAPL"}\'} <|endoftext|>\n\n\n'
    'FUNCTION RESPONSE: {"price": 187.4}\n\n\n'
    "ASSISTANT: It is $187.40. <|endoftext|>\n\n\n"
)


def test_glaive_good_function_call_and_response(tmp_path: Path) -> None:
    s = only_sample(run(tmp_path, "glaive", [{"system": GLAIVE_SYSTEM, "chat": GLAIVE_CHAT}]))
    call = ToolCall("functions.get_stock_price:0", "get_stock_price", '{"symbol": "AAPL"}')
    assert s.messages == [
        Message(
            "system",
            "You are a helpful assistant with access to the following functions. "
            "Use them if required -",
        ),
        Message("user", "Apple price?"),
        Message("assistant", "", tool_calls=(call,)),
        Message("tool", '{"price": 187.4}', tool_call_id=call.id, name="get_stock_price"),
        Message("assistant", "It is $187.40."),
    ]
    assert s.tools == [{"type": "function", "function": GLAIVE_FN}]
    assert s.id.startswith("glaive:h")


def test_glaive_good_without_functions(tmp_path: Path) -> None:
    row = {
        "system": "SYSTEM: You are helpful.",
        "chat": "USER: Hi\n\n\nASSISTANT: Hello <|endoftext|>",
    }
    s = only_sample(run(tmp_path, "glaive", [row]))
    assert s.tools is None
    assert [m.content for m in s.messages] == ["You are helpful.", "Hi", "Hello"]


@pytest.mark.parametrize(
    ("row", "reason", "field"),
    [
        ({"system": "", "chat": "just text"}, "malformed_chat", "chat"),
        ({"system": "", "chat": "hello\nUSER: hi"}, "malformed_chat", "chat"),
        (
            {"system": 'SYSTEM: use -\n{"name": "f",}', "chat": "USER: hi"},
            "bad_tool_json",
            "system",
        ),
        (
            {"system": "", "chat": "USER: hi\nASSISTANT: <functioncall> {nope} <|endoftext|>"},
            "bad_tool_json",
            "chat",
        ),
        ({"system": "x"}, "missing_field", "chat"),
        ({"system": "", "chat": "ASSISTANT: hello"}, "no_user_turn", None),
    ],
)
def test_glaive_bad(tmp_path: Path, row: dict[str, Any], reason: str, field: str | None) -> None:
    r = rejection(run(tmp_path, "glaive", [row]))
    assert (r.reason, r.field) == (reason, field)


# --- magicoder --------------------------------------------------------------------------------


def test_magicoder_good(tmp_path: Path) -> None:
    s = only_sample(
        run(tmp_path, "magicoder", [{"instruction": "Sort a list.", "response": "sorted(x)"}])
    )
    assert s.messages == [Message("user", "Sort a list."), Message("assistant", "sorted(x)")]
    assert s.id.startswith("magicoder:h")


@pytest.mark.parametrize(
    ("row", "reason", "field"),
    [
        ({"response": "x"}, "missing_field", "instruction"),
        ({"instruction": "\n ", "response": "x"}, "empty_prompt", None),
        ({"instruction": {"a": 1}}, "wrong_type", "instruction"),
    ],
)
def test_magicoder_bad(tmp_path: Path, row: dict[str, Any], reason: str, field: str | None) -> None:
    r = rejection(run(tmp_path, "magicoder", [row]))
    assert (r.reason, r.field) == (reason, field)


# --- kimi_native ------------------------------------------------------------------------------


def test_kimi_native_good(tmp_path: Path) -> None:
    rows = [
        {"id": "n1", "input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]},
        {"input_ids": [1], "loss_mask": [1]},
    ]
    a, b = run(tmp_path, "kimi_native", rows)
    assert isinstance(a, Sample) and isinstance(b, Sample)
    assert (a.id, a.mode, a.input_ids, a.loss_mask, a.messages) == (
        "kimi_native:n1",
        "native",
        [5, 6, 7],
        [0, 1, 1],
        [],
    )
    assert b.id == f"kimi_native:h{b.content_hash}"
    assert a.turns_to_regenerate() == 0


@pytest.mark.parametrize(
    ("row", "reason", "field"),
    [
        ({"loss_mask": [1]}, "missing_field", "input_ids"),
        ({"input_ids": "1 2", "loss_mask": [1]}, "id_type", "input_ids"),
        ({"input_ids": [1, 2.5], "loss_mask": [1, 1]}, "id_type", "input_ids"),
        ({"input_ids": [1, True], "loss_mask": [1, 1]}, "id_type", "input_ids"),
        ({"input_ids": [], "loss_mask": []}, "empty", "input_ids"),
        ({"input_ids": [1, 2], "loss_mask": [1]}, "length_mismatch", "loss_mask"),
        ({"input_ids": [1, 2], "loss_mask": [1, 2]}, "mask_value", "loss_mask"),
        ({"input_ids": [1, -2], "loss_mask": [1, 1]}, "id_out_of_vocab", "input_ids"),
        ({"input_ids": [1, 2], "loss_mask": [0, 0]}, "mask_all_zero", "loss_mask"),
    ],
)
def test_kimi_native_bad(tmp_path: Path, row: dict[str, Any], reason: str, field: str) -> None:
    r = rejection(run(tmp_path, "kimi_native", [row]))
    assert (r.reason, r.field) == (reason, field)


def test_kimi_native_check_hook_rejects_with_its_reason(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "input_ids": [1, 999], "loss_mask": [0, 1]},
        {"id": "b", "input_ids": [1, 2], "loss_mask": [0, 1]},
    ]
    m = one_source(tmp_path, "kimi_native", rows)
    seen: list[str] = []

    def check(s: Sample) -> str | None:
        seen.append(s.id)
        return "id_out_of_vocab" if max(s.input_ids or [0]) >= 100 else None

    a, b = list(iter_source(source_set(m), m.sources[0], native_check=check))
    assert isinstance(a, Rejection) and (a.reason, a.row) == ("id_out_of_vocab", 1)
    assert isinstance(b, Sample) and b.id == "kimi_native:b"
    assert seen == ["kimi_native:a", "kimi_native:b"]


# --- every text typed at the door (issue 42's crashes: an int or a list in a text field) -------
def _swe(tool_msg: dict[str, Any], assistant: dict[str, Any] | None = None) -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return {"instance_id": "x", "messages": [
        {"role": "user", "content": "go"},
        assistant or {"role": "assistant", "content": "", "tool_calls": [call]},
        tool_msg,
        {"role": "assistant", "content": "done"},
    ]}  # fmt: skip


@pytest.mark.parametrize(
    ("row", "field"),
    [
        (_swe({"role": "tool", "content": "ok", "tool_call_id": 7}), "messages[2].tool_call_id"),
        (_swe({"role": "tool", "content": "ok", "name": ["f"]}), "messages[2].name"),
        (_swe({"role": "tool", "content": "ok", "name": 2.5}), "messages[2].name"),
        (_swe({"role": "tool", "content": "ok"},
              {"role": "assistant", "content": "", "reasoning_content": {"a": 1}}),
         "messages[1].reasoning_content"),
    ],
)  # fmt: skip
def test_a_wrong_type_in_an_optional_text_is_a_rejection_naming_it(
    tmp_path: Path, row: dict[str, Any], field: str
) -> None:
    r = rejection(run(tmp_path, "swe_gym", [row]))
    assert (r.reason, r.field) == ("wrong_type", field), r


def test_empty_optional_texts_stay_absent(tmp_path: Path) -> None:
    row = _swe({"role": "tool", "content": "ok", "tool_call_id": "", "name": None})
    s = only_sample(run(tmp_path, "swe_gym", [row]))
    assert (s.messages[2].tool_call_id, s.messages[2].name) == (None, None)


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (Message("user", 5), "messages[0].content"),  # type: ignore[arg-type]
        (Message("user", "hi", name=3), "messages[0].name"),  # type: ignore[arg-type]
        (Message("tool", "r", tool_call_id=["c"]), "messages[0].tool_call_id"),  # type: ignore[arg-type]
        (Message("assistant", "", tool_calls=(ToolCall("c", "f", {"a": 1}),)),  # type: ignore[arg-type]
         "messages[0].tool_calls[0].arguments"),
    ],
)  # fmt: skip
def test_check_texts_names_the_first_field_that_is_not_text(message: Message, field: str) -> None:
    from regen.core.errors import RowError
    from regen.sources.shapes import check_texts

    with pytest.raises(RowError) as e:
        check_texts([message])
    assert (e.value.reason, e.value.field) == ("wrong_type", field)
