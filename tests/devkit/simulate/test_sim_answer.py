import json
import statistics

import pytest
from _sim_common import TOOLS

from regen.devkit.simulate import AnswerConfig, answer, conversation_key, count_tokens, request_key


def req(i: int = 0, **extra):
    return {"messages": [{"role": "user", "content": f"question {i}"}], **extra}


def test_same_request_same_answer_byte_for_byte():
    a, b = answer(req(1, seed=5)), answer(json.loads(json.dumps(req(1, seed=5))))
    assert a == b
    assert answer(req(1, seed=6)) != a
    assert answer(req(2, seed=5)) != a


def test_pieces_are_the_text_and_counts_add_up():
    for i in range(200):
        a = answer(req(i))
        assert a.reasoning == "".join(a.reasoning_pieces)
        assert a.content == "".join(a.content_pieces)
        assert count_tokens(a.reasoning) == a.reasoning_tokens
        assert count_tokens(a.content) == len(a.content_pieces)
        assert a.completion_tokens == a.reasoning_tokens + len(a.content_pieces) + a.tool_tokens
        assert a.finish_reason == "stop" and a.reasoning_tokens >= 1


def test_thinking_off_has_no_reasoning():
    a = answer(req(3, chat_template_kwargs={"thinking": False}))
    assert a.reasoning == "" and a.reasoning_tokens == 0 and a.content


def test_max_tokens_cuts_a_prefix_and_flags_length():
    full = answer(req(4))
    cut = answer(req(4, max_tokens=full.completion_tokens - 1))
    assert cut.finish_reason == "length"
    assert cut.completion_tokens == full.completion_tokens - 1
    assert full.reasoning.startswith(cut.reasoning)
    assert full.content.startswith(cut.content)
    same = answer(req(4, max_completion_tokens=full.completion_tokens))
    assert same == full
    assert answer(req(4, max_tokens=0)).completion_tokens == 0


def test_lengths_are_long_tailed_around_the_mean():
    cfg = AnswerConfig(mean_tokens=200, length_sigma=1.0)
    lengths = [answer(req(i), cfg).completion_tokens for i in range(2000)]
    mean = statistics.fmean(lengths)
    assert 160 < mean < 240
    q = statistics.quantiles(lengths, n=100)
    assert q[98] > 4 * statistics.median(lengths)  # p99 far above the median
    fixed = {
        answer(req(i), AnswerConfig(mean_tokens=50, length_sigma=0)).completion_tokens
        for i in range(50)
    }
    assert fixed == {50}


def test_tool_calls_follow_the_schema_and_the_kimi_id():
    cfg = AnswerConfig(tool_call_rate=1.0)
    history = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "functions.now:0",
                    "type": "function",
                    "function": {"name": "now", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "functions.now:0", "content": "noon"},
    ]
    seen = 0
    for i in range(40):
        body = {"messages": [*history, {"role": "user", "content": f"and {i}?"}], "tools": TOOLS}
        a = answer(body, cfg)
        assert a.finish_reason == "tool_calls" and a.tool_calls
        for n, call in enumerate(a.tool_calls):
            assert call.id == f"functions.{call.name}:{1 + n}"
            args = json.loads(call.arguments)
            if call.name == "get_weather":
                seen += 1
                assert set(args) == {"city", "unit"} and args["unit"] in ("c", "f")
                assert isinstance(args["city"], str)
            else:
                assert args == {}
    assert seen > 5
    none = answer({**req(1), "tools": TOOLS}, AnswerConfig(tool_call_rate=0.0))
    assert not none.tool_calls and none.finish_reason == "stop"


@pytest.mark.parametrize("rate", [0.5])
def test_tool_call_rate_is_roughly_kept(rate):
    cfg = AnswerConfig(tool_call_rate=rate)
    calls = sum(bool(answer({**req(i), "tools": TOOLS}, cfg).tool_calls) for i in range(400))
    assert 150 < calls < 250


def test_keys_ignore_transport_options_but_not_content():
    a = req(1, max_tokens=9)
    assert request_key(a) == request_key({**a, "stream": True, "return_token_ids": True})
    assert request_key(a) != request_key(req(1, max_tokens=10))
    turn2 = {
        "messages": [
            *a["messages"],
            {"role": "assistant", "content": "x"},
            {"role": "user", "content": "y"},
        ]
    }
    assert conversation_key(turn2) == conversation_key(a)
    assert conversation_key(req(2)) != conversation_key(a)


def test_a_cut_inside_the_tool_call_section_drops_the_calls():
    cfg = AnswerConfig(tool_call_rate=1.0)
    body = {**req(9), "tools": TOOLS}
    full = answer(body, cfg)
    assert full.tool_calls and full.tool_tokens > 2
    cap = full.completion_tokens - 1
    cut = answer({**body, "max_tokens": cap}, cfg)
    assert (cut.reasoning, cut.content) == (full.reasoning, full.content)
    assert cut.tool_calls == () and cut.finish_reason == "length"
    assert cut.completion_tokens == cap
