"""regen.bench.greedy: the two servers' answers at concurrency 1, compared when the sampling is
greedy; the digests the bench records (regen.bench.load.answer_digest) and the verdicts."""

from __future__ import annotations

from _bench_common import report

from regen.bench.greedy import compare_greedy
from regen.bench.load import LevelRun, RequestRecord, answer_digest
from regen.bench.report import Greedy
from regen.bench.verdicts import verdicts
from regen.client.stream import StreamAccumulator


def streamed(*chunks: dict[str, object]) -> StreamAccumulator:
    acc = StreamAccumulator(fast=False)
    for c in chunks:
        acc.add({"choices": [c]})
    return acc


def level(role: str, concurrency: int, answers: dict[str, str | None]) -> LevelRun:
    records = [
        RequestRecord(
            role=role,
            concurrency=concurrency,
            source="chat",
            sample_id=sid,
            ok=answer is not None,
            answer=answer,
            completion_tokens=10,
        )
        for sid, answer in answers.items()
    ]
    return LevelRun(role=role, concurrency=concurrency, wall_s=1.0, records=records)


def test_the_digest_is_the_ids_when_the_server_streams_them_else_the_text() -> None:
    with_ids = streamed({"delta": {"content": "Hi"}, "token_ids": [7, 8]})
    same_ids_other_text = streamed({"delta": {"content": "Hello"}, "token_ids": [7, 8]})
    assert answer_digest(with_ids).startswith("ids:")
    assert answer_digest(with_ids) == answer_digest(same_ids_other_text)
    assert answer_digest(with_ids) != answer_digest(streamed({"delta": {}, "token_ids": [7, 9]}))

    text = streamed({"delta": {"reasoning_content": "think"}}, {"delta": {"content": "Hi"}})
    assert answer_digest(text).startswith("text:")
    # reasoning and content are told apart: the same characters elsewhere are another answer
    moved = streamed({"delta": {"content": "thinkHi"}})
    assert answer_digest(text) != answer_digest(moved)
    call = {"index": 0, "id": "c1", "function": {"name": "get_weather", "arguments": '{"a": 1}'}}
    other = {"index": 0, "id": "c1", "function": {"name": "get_weather", "arguments": '{"a": 2}'}}
    assert answer_digest(streamed({"delta": {"tool_calls": [call]}})) != answer_digest(
        streamed({"delta": {"tool_calls": [other]}})
    )


def test_answers_at_concurrency_1_are_compared_prompt_by_prompt() -> None:
    levels = [
        level("baseline", 1, {"a": "ids:1", "b": "ids:2", "c": "ids:3", "d": None}),
        level("speculative", 1, {"a": "ids:1", "b": "ids:9", "c": "ids:3", "d": "ids:4"}),
        # other levels batch: not compared, whatever they answered
        level("baseline", 4, {"a": "ids:5"}),
        level("speculative", 4, {"a": "ids:6"}),
    ]
    g = compare_greedy(levels, 0.0)
    # d failed on the baseline: not compared
    assert g == Greedy(compared=3, identical=2, method="token_ids", tokens=30, differing=["b"])


def test_nothing_is_compared_unless_greedy_at_concurrency_1_by_one_method() -> None:
    same = [level("baseline", 1, {"a": "ids:1"}), level("speculative", 1, {"a": "ids:1"})]
    assert compare_greedy(same, 0.6) is None  # sampled answers may differ
    assert compare_greedy(same, None) is None  # not known: not compared
    batched = [level("baseline", 2, {"a": "ids:1"}), level("speculative", 2, {"a": "ids:1"})]
    assert compare_greedy(batched, 0.0) is None
    mixed = [level("baseline", 1, {"a": "ids:1"}), level("speculative", 1, {"a": "text:1"})]
    assert compare_greedy(mixed, 0.0) is None  # ids on one side, text on the other
    text = [level("baseline", 1, {"a": "text:1"}), level("speculative", 1, {"a": "text:1"})]
    assert compare_greedy(text, 0.0) == Greedy(compared=1, identical=1, method="text", tokens=10)


def test_a_changed_greedy_answer_is_a_problem_before_the_speedup() -> None:
    rep = report({1: (90.0, 144.0)}, {"sharegpt": 2.1})
    rep.greedy = Greedy(compared=20, identical=18, method="token_ids", tokens=2000,
                        differing=["s1", "s2"])  # fmt: skip
    found = verdicts(rep)
    codes = [v.code for v in found]
    assert codes.index("greedy-differs") < codes.index("speedup")
    [v] = [v for v in found if v.code == "greedy-differs"]
    assert v.severity == "problem"
    assert v.text.startswith("2 of 20 greedy answers differ with the draft (token ids; s1, s2)")

    rep.greedy = Greedy(compared=20, identical=20, method="text", tokens=2000)
    [v] = [v for v in verdicts(rep) if v.code.startswith("greedy")]
    assert (v.severity, v.code) == ("good", "greedy-identical")
    assert v.text == "greedy answers identical with and without the draft: 20/20 (text)"
    rep.greedy = None
    assert not [v for v in verdicts(rep) if v.code.startswith("greedy")]
