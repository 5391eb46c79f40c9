"""`AnswerConfig.prompt_share`: the part of an answer's length the prompt decides (issue 8),
and the benchmark workload whose original answers carry that signal."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import statistics
from typing import Any

import pytest
from _sim_common import TOOLS

from regen.core.errors import ConfigError
from regen.devkit.simulate import AnswerConfig, answer
from regen.devkit.simulate.answer import prompt_z, request_prompt_z

#: requests and what the simulator answered them before prompt_share existed:
#: (completion tokens, reasoning tokens, finish reason, digest of the whole answer)
PINNED: list[tuple[dict[str, Any], AnswerConfig, tuple[int, int, str, str]]] = [
    (
        {"messages": [{"role": "user", "content": "question 0"}]},
        AnswerConfig(),
        (124, 43, "stop", "330a3f04fdc13880"),
    ),
    (
        {"messages": [{"role": "user", "content": "question 1"}], "seed": 5},
        AnswerConfig(),
        (222, 83, "stop", "f7874832bce43c37"),
    ),
    (
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "write "},
                        {"type": "text", "text": "a poem"},
                    ],
                },
            ],
            "seed": 0,
        },
        AnswerConfig(mean_tokens=400),
        (371, 166, "stop", "ec25c3569da4a115"),
    ),
    (
        {"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS, "seed": 3},
        AnswerConfig(tool_call_rate=1.0),
        (118, 80, "tool_calls", "17cce0c3eb88d0cc"),
    ),
    (
        {
            "messages": [{"role": "user", "content": "question 7"}],
            "max_tokens": 50,
            "chat_template_kwargs": {"thinking": False},
        },
        AnswerConfig(mean_tokens=100, length_sigma=0.5),
        (50, 0, "length", "71abf5a026474641"),
    ),
    (
        {"messages": [{"role": "user", "content": "question 8"}]},
        AnswerConfig(mean_tokens=60, length_sigma=0),
        (60, 27, "stop", "0ef51466545515b8"),
    ),
]


def digest(a: Any) -> str:
    calls = [c.as_openai(i) for i, c in enumerate(a.tool_calls)]
    blob = json.dumps(
        [a.reasoning, a.content, calls, a.finish_reason, a.tool_tokens, a.prompt_tokens],
        ensure_ascii=False,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def user(text: str, *, seed: int | None = 0, history: list[dict[str, Any]] | None = None,
         **extra: Any) -> dict[str, Any]:  # fmt: skip
    return {"messages": [*(history or []), {"role": "user", "content": text}], "seed": seed,
            **extra}  # fmt: skip


def pearson(xs: list[float], ys: list[float]) -> float:
    return statistics.correlation(xs, ys)


# --- prompt_share 0: today's answers ----------------------------------------------------------


@pytest.mark.parametrize("i", range(len(PINNED)))
def test_share_zero_keeps_todays_answers_byte_for_byte(i):
    request, config, (tokens, reasoning, finish, pinned) = PINNED[i]
    for cfg in (config, config.model_copy(update={"prompt_share": 0.0})):
        a = answer(request, cfg)
        assert (a.completion_tokens, a.reasoning_tokens, a.finish_reason, digest(a)) == (
            tokens, reasoning, finish, pinned,
        )  # fmt: skip


def test_share_zero_keeps_todays_lengths_in_bulk():
    lengths = [answer(user(f"question {i}", seed=i % 3)).completion_tokens for i in range(300)]
    assert sum(lengths) == 79631
    assert hashlib.sha256(",".join(map(str, lengths)).encode()).hexdigest()[:16] == (
        "d06ce23d10bd7b67"
    )


# --- prompt_z ---------------------------------------------------------------------------------


def test_prompt_z_is_a_function_of_seed_and_last_user_text():
    z = prompt_z(0, "write an essay")
    assert z == prompt_z(0, "write an essay")
    assert len({z, prompt_z(1, "write an essay"), prompt_z(None, "write an essay"),
                prompt_z(0, "write an essay.")}) == 4  # fmt: skip
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert request_prompt_z(user("write an essay")) == z
    assert request_prompt_z(user("write an essay", history=history, max_tokens=9)) == z
    parts = [{"type": "text", "text": "write an "}, {"type": "text", "text": "essay"}]
    assert request_prompt_z({"messages": [{"role": "user", "content": parts}], "seed": 0}) == z
    # the last user message counts, even with assistant/tool messages after it
    after = {
        "messages": [
            {"role": "user", "content": "write an essay"},
            {"role": "assistant", "content": "", "tool_calls": []},
            {"role": "tool", "content": "42", "tool_call_id": "x"},
        ],
        "seed": 0,
    }
    assert request_prompt_z(after) == z
    assert request_prompt_z({"messages": [{"role": "system", "content": "s"}]}) is None


def test_prompt_z_is_standard_normal():
    zs = [prompt_z(0, f"prompt {i}") for i in range(4000)]
    assert abs(statistics.fmean(zs)) < 0.05
    assert 0.95 < statistics.stdev(zs) < 1.05


def test_no_user_message_uses_the_request_draw_alone():
    body = {"messages": [{"role": "system", "content": "say something"}], "seed": 1}
    assert answer(body, AnswerConfig(prompt_share=1.0)) == answer(body)


# --- prompt_share 1 and 0.5 -------------------------------------------------------------------


def test_share_one_the_prompt_alone_decides_the_length():
    cfg = AnswerConfig(prompt_share=1.0)
    histories = [
        None,
        [{"role": "system", "content": "you are terse"}],
        [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "reply"}],
    ]
    lengths = []
    for i in range(40):
        got = {answer(user(f"task {i}", history=h), cfg).completion_tokens for h in histories}
        assert len(got) == 1, (i, got)
        lengths.append(got.pop())
        # the text still differs: only the length is the prompt's
        a = answer(user(f"task {i}", history=histories[1]), cfg)
        assert a.content != answer(user(f"task {i}", history=histories[2]), cfg).content
    assert len(set(lengths)) > 30  # different messages, different lengths
    other_seed = [answer(user(f"task {i}", seed=1), cfg).completion_tokens for i in range(40)]
    assert sum(a != b for a, b in zip(lengths, other_seed, strict=True)) > 30


def test_share_one_length_is_cut_by_max_tokens_only():
    cfg = AnswerConfig(prompt_share=1.0)
    full = answer(user("long task"), cfg)
    cut = answer(user("long task", max_tokens=full.completion_tokens // 2), cfg)
    assert cut.finish_reason == "length"
    assert cut.completion_tokens == full.completion_tokens // 2


def test_share_half_correlates_log_lengths_of_a_shared_prompt():
    cfg = AnswerConfig(prompt_share=0.5)
    a_log, b_log = [], []
    for i in range(2000):
        text = f"prompt number {i}"
        a = answer(user(text), cfg)
        b = answer(user(text, history=[{"role": "system", "content": f"context {i}"}]), cfg)
        a_log.append(math.log(a.completion_tokens))
        b_log.append(math.log(b.completion_tokens))
    r = pearson(a_log, b_log)
    assert 0.42 < r < 0.58, r
    # without the knob the same pairs are independent
    zero = AnswerConfig()
    a0 = [math.log(answer(user(f"prompt number {i}"), zero).completion_tokens) for i in range(500)]
    b0 = [
        math.log(answer(user(f"prompt number {i}", history=[
            {"role": "system", "content": f"context {i}"}]), zero).completion_tokens)
        for i in range(500)
    ]  # fmt: skip
    assert abs(pearson(a0, b0)) < 0.12


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_mean_length_stays_the_configured_mean(share):
    cfg = AnswerConfig(mean_tokens=200, prompt_share=share)
    lengths = [
        answer(user(f"q{i}", chat_template_kwargs={"thinking": False}), cfg).completion_tokens
        for i in range(2000)
    ]
    assert 180 <= statistics.fmean(lengths) <= 220


def test_config_rejects_a_share_outside_0_1():
    with pytest.raises(ValueError):
        AnswerConfig(prompt_share=1.5)
    with pytest.raises(ValueError):
        AnswerConfig(prompt_share=-0.1)


def test_cli_flag_reaches_the_answer_config():
    import argparse

    from regen.devkit.commands import simulate

    parser = argparse.ArgumentParser()
    simulate.add_arguments(parser)
    assert simulate.build_config(parser.parse_args([])).answer.prompt_share == 0.0
    config = simulate.build_config(parser.parse_args(["--prompt-share", "0.7"]))
    assert config.answer.prompt_share == 0.7
    with pytest.raises(ConfigError, match="prompt_share"):
        simulate.build_config(parser.parse_args(["--prompt-share", "2"]))


# --- the benchmark workload -------------------------------------------------------------------


@pytest.fixture(scope="module")
def workload():
    from benchmarks import _workload

    return _workload


def test_workload_prompts_do_not_depend_on_length_corr(workload):
    base = workload.make_rows(200, multi=0.5, seed=3)
    corr = workload.make_rows(200, multi=0.5, seed=3, length_corr=0.7)
    users = [[t["value"] for t in r["conversations"] if t["from"] == "human"] for r in base]
    assert users == [[t["value"] for t in r["conversations"] if t["from"] == "human"]
                     for r in corr]  # fmt: skip
    # the prompts of the 1,500-conversation benchmark workload as they were before the
    # originals got their lengths (pinned: the benchmarks' history compares against them)
    rows = workload.make_rows()
    users = [[t["value"] for t in r["conversations"] if t["from"] == "human"] for r in rows]
    pinned = [[r["id"] for r in rows], users]
    assert hashlib.sha256(json.dumps(pinned).encode()).hexdigest()[:16] == "007e5e1e9c19e87f"


def test_workload_originals_follow_the_prompt_draw(workload):
    rows = workload.make_rows(300, length_corr=1.0)
    for r in rows:
        conv = r["conversations"]
        for human, gpt in zip(conv[::2], conv[1::2], strict=True):
            mu = math.log(256.0) - 0.5
            want = min(2048, max(1, round(math.exp(mu + prompt_z(0, human["value"])))))
            assert len(gpt["value"].split(" ")) == want
    zero = workload.make_rows(300)
    words = [len(t["value"].split(" ")) for r in zero for t in r["conversations"][1::2]]
    assert len(set(words)) > 100 and max(words) <= 2048  # long-tailed, not fixed-size


def test_workload_prompt_z_is_the_one_of_the_request_regen_sends(workload, tmp_path):
    """Every turn's request (built as benchmarks/_eventsim.chains builds it, through regen's
    adapter, turn logic and client) has the prompt draw of the row's user text."""
    from _worker_config import client_for

    from regen.core.result import TurnResult
    from regen.core.sample import ToolCall
    from regen.engine.turns import regenerate
    from regen.manifest import load_manifest
    from regen.sources import read_samples, source_set

    path = workload.write_workload(tmp_path, 60, multi=0.6, length_corr=0.5)
    m = load_manifest(path)
    assert m.sampling.seed == workload.SAMPLING_SEED
    rows = {json.loads(line)["id"]: json.loads(line) for line in
            (tmp_path / "sharegpt.jsonl").read_text().splitlines()}  # fmt: skip
    client = client_for(m)
    samples = list(read_samples(source_set(m)))
    assert len(samples) == 60

    async def one(sample: Any) -> list[dict[str, Any]]:
        bodies: list[dict[str, Any]] = []

        async def complete(msgs: list[dict[str, Any]], tools: Any) -> TurnResult:
            body = client.request_body(msgs, tools)
            bodies.append(body)
            a = answer(body, AnswerConfig(prompt_share=0.5))
            calls = tuple(ToolCall(c.id, c.name, c.arguments) for c in a.tool_calls)
            return TurnResult(a.content, a.reasoning or None, calls, a.finish_reason,
                              "m", "e")  # fmt: skip

        await regenerate(sample, complete)
        return bodies

    turns = 0
    for sample in samples:
        bodies = asyncio.run(one(sample))
        row = rows[sample.id.split(":", 1)[1].split("#")[0]]
        users = [t["value"] for t in row["conversations"] if t["from"] == "human"]
        assert len(bodies) <= len(users)
        for body, text in zip(bodies, users, strict=False):
            assert request_prompt_z(body) == prompt_z(0, text)
            turns += 1
    assert turns > 80  # multi-turn conversations were checked turn by turn
