"""regen.quality: hand-written turns for every flag, positive and negative; measures; row form."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from regen.quality import (
    COLUMNS,
    FLAGS,
    NOT_CHECKED,
    REFUSAL_PHRASES,
    QualityConfig,
    check_row,
    check_turn,
)
from regen.quality.repetition import compression_ratio, longest_repeat
from regen.quality.script import letters
from regen.quality.tools import call_problem, declared

PROSE = (
    "A heat pump moves heat instead of making it. In winter the outdoor coil evaporates a cold "
    "refrigerant, which absorbs heat even from freezing air; a compressor raises its pressure "
    "and temperature, and the indoor coil releases that heat into the house. Efficiency falls "
    "as the outdoor temperature drops, so cold-climate models use variable-speed compressors "
    "and vapour injection to keep delivering heat well below zero."
)
ASK = [{"role": "user", "content": "How does a heat pump keep a house warm in winter?"}]
ZH_ASK = [{"role": "user", "content": "请解释一下热泵在冬天是如何为房子供暖的，越详细越好。"}]
ZH_ANSWER = (
    "热泵不是直接产生热量，而是搬运热量。冬天室外机里的冷媒蒸发，即使在寒冷的空气中也能吸收热量；"
    "压缩机提高冷媒的压力和温度，室内机再把热量释放到房间里。室外温度越低，效率越低。"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {"type": "function", "function": {"name": "now"}},
]


def call(name: str, arguments: Any, i: int = 0) -> dict[str, Any]:
    return {"id": f"functions.{name}:{i}", "type": "function",
            "function": {"name": name, "arguments": arguments}}  # fmt: skip


def flags(**kw: Any) -> tuple[str, ...]:
    args: dict[str, Any] = {"messages": ASK, "reasoning": "Think about heat transfer.",
                            "content": PROSE, **kw}  # fmt: skip
    return check_turn(**args).flags


def test_a_normal_answer_has_no_flag() -> None:
    q = check_turn(ASK, "The user asks about heat pumps.", PROSE)
    assert q.flags == ()
    assert (q.prompt_script, q.answer_script, q.script_share) == ("latin", "latin", 1.0)
    assert q.refusal is None and q.bad_tool_calls == 0
    assert 0.4 < q.compression < 1.0 and q.repeat_words < 10


# -- repetition ----------------------------------------------------------------------

LOOP = " ".join(["Wait, let me check the compressor pressure again."] * 40)


def test_repetition_a_sentence_looped_to_max_tokens() -> None:
    q = check_turn(ASK, PROSE + " " + LOOP, "", finish_reason="length")
    assert "repetition" in q.flags
    assert q.repeat_ngram == 8 and q.repeat_words == 8 * 40
    assert q.compression < 0.15


def test_repetition_a_loop_in_the_content_that_stopped() -> None:
    assert "repetition" in flags(content=PROSE + " " + LOOP, finish_reason="stop")


def test_repetition_a_loop_whose_counter_changes_is_caught_by_compression() -> None:
    loop = " ".join(
        f"Step {k}: recheck the refrigerant pressure at the outdoor coil." for k in range(200)
    )
    q = check_turn(ASK, None, loop, finish_reason="length")
    assert q.repeat_words < 20  # no exact back-to-back copies...
    assert q.compression < 0.08 and "repetition" in q.flags  # ...but it compresses to nothing


def test_repetition_a_long_period_paragraph_loop() -> None:
    q = check_turn(ASK, None, "\n\n".join([PROSE] * 12), finish_reason="length")
    assert q.repeat_words == 0  # period (70 words) above repeat_max_ngram
    assert "repetition" in q.flags


@pytest.mark.parametrize(
    "content",
    [
        PROSE,
        "Yes. Yes. Yes. Absolutely, that works.",  # a short emphatic repeat
        "```python\nzeros = [" + ", ".join(["0"] * 50) + "]\n```\nThat is a list of 50 zeros.",
        "| a | b |\n|---|---|\n" + "\n".join(f"| {i} | {i * i} |" for i in range(60)),
        "\n".join(f"{i}. Check item {i} on the list." for i in range(1, 40)),
    ],
    ids=["prose", "short-emphasis", "zeros-array", "table", "numbered-list"],
)
def test_repetition_not_flagged_on_normal_structure(content: str) -> None:
    assert "repetition" not in flags(content=content)


def test_repetition_threshold_depends_on_whether_the_answer_stopped() -> None:
    body = PROSE + " " + " ".join(["the valve opens"] * 30)  # 90 words, 30 copies
    assert "repetition" in flags(content=body, finish_reason="length")
    assert "repetition" not in flags(content=body, finish_reason="stop")


def test_longest_repeat_and_compression_measures() -> None:
    assert longest_repeat("a b c a b c a b c d", 8) == (9, 3)
    assert longest_repeat("one two three four", 8) == (0, 0)
    assert longest_repeat("x x", 8) == (2, 1)
    assert longest_repeat("", 8) == (0, 0)
    assert compression_ratio("") == 1.0
    assert compression_ratio("ab" * 5000) < 0.01 < compression_ratio(PROSE)


# -- empty content / unclosed reasoning ----------------------------------------------


def test_empty_content_after_closed_reasoning() -> None:
    q = check_turn(ASK, "Heat pumps move heat. I know the answer.", "  \n", finish_reason="stop")
    assert q.flags == ("empty_content",)
    assert check_turn(ASK, None, "", finish_reason="stop").flags == ("empty_content",)


def test_empty_content_not_flagged_for_tool_calls_or_a_cut_answer() -> None:
    q = check_turn(ASK, "Look it up.", "", [call("now", "{}")], TOOLS, "tool_calls")
    assert q.flags == ()
    # cut by max_tokens right after </think>: that is truncation, not an empty answer
    assert check_turn(ASK, "", "", finish_reason="length").flags == ()


def test_reasoning_that_never_closes() -> None:
    q = check_turn(ASK, "Let me think about heat pumps and compressors", "", finish_reason="length")
    assert q.flags == ("reasoning_unclosed",)
    # the server ids show no </think> although the model stopped: never closed either
    q2 = check_turn(ASK, "Thinking...", "", finish_reason="stop", think_closed=False)
    assert q2.flags == ("reasoning_unclosed",)
    # closed, then nothing: empty content, not unclosed
    assert check_turn(ASK, "Done thinking.", "", think_closed=True).flags == ("empty_content",)


def test_reasoning_cut_after_content_started_is_not_unclosed() -> None:
    assert "reasoning_unclosed" not in flags(content="A heat pump moves", finish_reason="length")


# -- language ------------------------------------------------------------------------


def test_language_mismatch_english_prompt_chinese_answer() -> None:
    q = check_turn(ASK, None, ZH_ANSWER)
    assert q.flags == ("language_mismatch",)
    assert (q.prompt_script, q.answer_script) == ("latin", "han") and q.script_share < 0.25


def test_language_mismatch_chinese_prompt_english_answer() -> None:
    q = check_turn(ZH_ASK, "用户问热泵。", PROSE)
    assert q.flags == ("language_mismatch",)
    assert (q.prompt_script, q.answer_script, q.script_share) == ("han", "latin", 0.0)


@pytest.mark.parametrize(
    ("messages", "content"),
    [
        (ZH_ASK, ZH_ANSWER),  # same language
        (ZH_ASK, ZH_ANSWER + " 例如 Mitsubishi Zubadan 和 Daikin Altherma 系列。"),  # terms
        ([{"role": "user", "content": "Translate into Chinese: " + PROSE[:120]}], ZH_ANSWER),
        ([{"role": "user", "content": "Explain heat pumps. Please answer in Chinese."}], ZH_ANSWER),
        (
            [{"role": "system", "content": "Always answer in Japanese."}, *ASK],
            "ヒートポンプは熱を運びます。" * 4,
        ),
        (
            [
                {
                    "role": "user",
                    "content": "热泵在冬天是怎么工作的？ heat pump in winter, in detail",
                }
            ],
            ZH_ANSWER,
        ),
        (ASK, PROSE + " In Japanese it is ヒートポンプ."),  # a quoted word
        (ASK, "```python\nprint('热泵')\n```\n" + PROSE),  # code is not language
        ([{"role": "user", "content": "2+2?"}], "四"),  # too short to judge
        (ZH_ASK, "```python\ndef heat(x):\n    return x * 2\n```"),  # code only
        (
            [{"role": "user", "content": "Объясни, как работает тепловой насос зимой."}],
            "Тепловой насос переносит тепло с улицы в дом даже в мороз.",
        ),
    ],
    ids=[
        "zh-zh",
        "zh-with-terms",
        "translate",
        "named-language",
        "system-asks",
        "bilingual-user",
        "quote",
        "code-block",
        "too-short",
        "code-only",
        "ru-ru",
    ],
)
def test_language_mismatch_not_flagged(messages: list[dict[str, str]], content: str) -> None:
    assert "language_mismatch" not in check_turn(messages, None, content).flags


def test_letters_weigh_cjk_and_drop_code() -> None:
    assert letters("ab 中文 `xyz` https://example.com/abc") == {"latin": 2.0, "han": 6.0}
    assert letters("Привет, мир") == {"cyrillic": 9.0}


# -- refusal -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        "I'm sorry, but I can't help with that request.",
        "I’m sorry, but I can’t provide instructions for that.",  # typographic apostrophes
        "  I CANNOT ASSIST WITH that. However, here are some general safety resources ...",
        "抱歉，我无法协助完成这个请求。",
        "As an AI language model, I cannot browse the internet.",
    ],
)
def test_refusal_flagged(content: str) -> None:
    q = check_turn(ASK, None, content)
    assert "refusal" in q.flags and q.refusal in REFUSAL_PHRASES


@pytest.mark.parametrize(
    "content",
    [
        PROSE,
        PROSE + " I can't help with that part, but a technician can.",  # not at the opening
        "I can't stress this enough: check the refrigerant charge every year.",
        "Sorry for the delay! Here is how a heat pump works: it moves heat.",
    ],
)
def test_refusal_not_flagged(content: str) -> None:
    assert "refusal" not in check_turn(ASK, None, content).flags


# -- tool calls ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("c", "why"),
    [
        (call("get_weather", '{"city": "Oslo"'), "arguments are not JSON"),
        (call("get_weather", '["Oslo"]'), "arguments are not a JSON object"),
        (call("get_weather", '{"days": 3}'), "missing required 'city'"),
        (call("get_weather", '{"city": "Oslo", "unit": "C"}'), "undeclared parameter 'unit'"),
        (call("get_weather", '{"city": "Oslo", "days": "three"}'), "parameter 'days' is not"),
        (call("get_weather", '{"city": "Oslo", "days": true}'), "parameter 'days' is not"),
        (call("get_forecast", '{"city": "Oslo"}'), "undeclared function 'get_forecast'"),
    ],
)
def test_bad_tool_call(c: dict[str, Any], why: str) -> None:
    q = check_turn(ASK, None, "", [call("now", "{}", 1), c], TOOLS, "tool_calls")
    assert q.flags == ("bad_tool_call",) and q.bad_tool_calls == 1
    assert call_problem(c, declared(TOOLS)).startswith(why)


@pytest.mark.parametrize(
    "c",
    [
        call("get_weather", '{"city": "Oslo"}'),
        call("get_weather", '{"city": "Oslo", "days": 3.0}'),  # an integral float is an integer
        call("get_weather", {"city": "Oslo", "days": 2}),  # already parsed
        call("now", ""),  # no parameters declared, empty arguments
        call("now", '{"anything": 1}'),  # no schema to hold it to
    ],
)
def test_good_tool_call(c: dict[str, Any]) -> None:
    assert check_turn(ASK, None, "", [c], TOOLS, "tool_calls").flags == ()


def test_tool_calls_without_declarations_only_need_json_objects() -> None:
    assert check_turn(ASK, None, "", [call("x", '{"a": 1}')], None, "tool_calls").flags == ()
    q = check_turn(ASK, None, "", [call("x", "{oops")], None, "tool_calls")
    assert q.flags == ("bad_tool_call",)


# -- several flags, rows, config -----------------------------------------------------


def test_flags_come_in_flags_order_and_combine() -> None:
    q = check_turn(ASK, None, "I'm sorry, but I can't. " + " ".join(["不行"] * 80),
                   [call("nope", "{")], TOOLS, "length")  # fmt: skip
    assert q.flags == ("repetition", "language_mismatch", "refusal", "bad_tool_call")
    assert list(q.flags) == [f for f in FLAGS if f in q.flags]


def test_check_row_reads_stored_json_and_skips_native_rows() -> None:
    row = {
        "messages": json.dumps(ASK),
        "tools": json.dumps(TOOLS),
        "reasoning": "Checking the weather tool.",
        "content": "",
        "tool_calls": json.dumps([call("get_weather", '{"town": "Oslo"}')]),
        "finish_reason": "tool_calls",
    }
    q = check_row(row)
    assert q.flags == ("bad_tool_call",)
    assert check_row({**row, "finish_reason": None, "content": ""}) is NOT_CHECKED


def test_columns_fit_the_arrow_schema() -> None:
    rows = [
        check_turn(ASK, None, PROSE).columns(),
        check_turn(ASK, PROSE + LOOP, "", finish_reason="length").columns(),
        NOT_CHECKED.columns(),
    ]
    table = pa.Table.from_pylist(rows, schema=COLUMNS)
    assert table.column_names == COLUMNS.names
    assert table.column("quality_flags").to_pylist() == [
        [],
        ["repetition", "reasoning_unclosed"],
        [],
    ]


def test_config_thresholds_apply_and_reject_unknown_keys() -> None:
    body = PROSE + " " + " ".join(["the valve opens"] * 30)
    lenient = QualityConfig(repeat_min_words=500, compression_max=0.01)
    assert (
        "repetition"
        not in check_turn(ASK, None, body, finish_reason="length", config=lenient).flags
    )
    with pytest.raises(ValueError):
        QualityConfig(repeat_min_word=3)  # type: ignore[call-arg]


def test_deterministic() -> None:
    a = check_turn(ZH_ASK, PROSE + LOOP, ZH_ANSWER, [call("get_weather", "{")], TOOLS, "length")
    b = check_turn(ZH_ASK, PROSE + LOOP, ZH_ANSWER, [call("get_weather", "{")], TOOLS, "length")
    assert a == b
