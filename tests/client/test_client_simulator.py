"""ChatClient and the start checks against the simulated SGLang server (regen.devkit.simulate).

The simulator answers deterministically from the request, so stored content is compared with
``regen.devkit.simulate.answer.answer(request)`` byte for byte. Servers run in a thread (cheap).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from _chat_fakes import FixedRandom, SleepRecorder

from regen.client import ChatClient, RetryPolicy, check_endpoints
from regen.core.errors import EndpointError, PermanentError, RequestTimeoutError
from regen.devkit.simulate.answer import answer
from regen.devkit.simulate.testing import simulator_in_thread
from regen.manifest import Endpoint, Sampling
from regen.targets.kimi import KIMI

pytestmark = pytest.mark.timeout(120)

MODEL = "moonshotai/Kimi-K2.5"
TOKENIZER = Path(__file__).resolve().parents[2] / "manifests" / "demo" / "tokenizer"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def sim():
    with simulator_in_thread(
        instant=True,
        max_running_requests=24,
        speculative_algorithm="EAGLE3",
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
        tool_call_rate=1.0,
    ) as s:
        yield s


def msgs(tag: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": f"Question {tag}: what is a draft model?"},
    ]


def kimi_kwargs(sampling: Sampling) -> dict[str, Any]:
    """The chat_template_kwargs a manifest of a Kimi target sends (the simulator is Kimi's)."""
    return {**KIMI.template_kwargs(sampling.thinking), **sampling.chat_template_kwargs}


def expected(messages, sampling: Sampling, tools=None):
    body: dict[str, Any] = {
        "messages": messages,
        "max_tokens": sampling.max_tokens,
        "chat_template_kwargs": kimi_kwargs(sampling),
    }
    if tools:
        body["tools"] = tools
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    return answer(body)


def complete(
    url: str, messages, tools=None, *, retry=None, timeout_s=30.0, on_failure=None, **sampling
):
    s = Sampling(**{"max_tokens": 512, **sampling})
    c = ChatClient(
        Endpoint(url=url),
        model=MODEL,
        sampling=s,
        retry=retry or RetryPolicy(max_attempts=1),
        timeout_s=timeout_s,
        template_kwargs=kimi_kwargs(s),
    )

    async def go():
        try:
            return await c.complete(messages, tools, sample_id="t", on_failure=on_failure)
        finally:
            await c.aclose()

    return asyncio.run(go()), s


def test_start_check_reads_server_info(sim):
    (info,) = asyncio.run(check_endpoints([Endpoint(url=sim.url)], MODEL))
    assert info.models == (MODEL,)
    assert info.max_running_requests == 24
    assert info.version
    assert info.speculative["speculative_algorithm"] == "EAGLE3"
    assert info.speculative["speculative_num_draft_tokens"] == 4


def test_stream_matches_the_simulators_answer(sim):
    m = msgs("stream")
    r, s = complete(sim.url, m, seed=11)
    ans = expected(m, s)
    assert r.content == ans.content and r.reasoning == ans.reasoning
    assert r.finish_reason == ans.finish_reason
    assert r.completion_tokens == ans.completion_tokens
    assert r.reasoning_tokens == ans.reasoning_tokens
    assert r.prompt_tokens and r.prompt_tokens > 0
    assert r.ttft_s is not None and r.ttft_s <= r.latency_s


def test_thinking_off_and_truncation(sim):
    m = msgs("short")
    r, s = complete(sim.url, m, thinking=False, max_tokens=3)
    ans = expected(m, s)
    assert ans.reasoning == "" and not r.reasoning
    assert (r.content, r.finish_reason, r.completion_tokens) == (ans.content, "length", 3)


def test_tool_calls_match(sim):
    m = msgs("tools")
    r, s = complete(sim.url, m, TOOLS)
    ans = expected(m, s, TOOLS)
    assert ans.tool_calls and r.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.arguments) for c in r.tool_calls] == [
        (c.id, c.name, c.arguments) for c in ans.tool_calls
    ]
    assert r.content == ans.content


@pytest.mark.parametrize("mode", ["stream", "nonstream"])
def test_the_servers_exact_ids_streamed_or_whole(mode):
    with simulator_in_thread(instant=True, tokenizer=str(TOKENIZER)) as t:
        m = msgs("ids")
        r, s = complete(t.url, m, token_ids=mode, max_tokens=64)
    ans = expected(m, s)
    assert r.content == ans.content and r.reasoning == ans.reasoning
    assert r.prompt_token_ids and len(r.prompt_token_ids) == r.prompt_tokens
    assert r.output_token_ids and len(r.output_token_ids) == r.completion_tokens
    assert (r.ttft_s is None) == (mode == "nonstream")


def test_a_503_overload_inside_a_stream_is_retried_and_backs_off():
    with simulator_in_thread(instant=True, fault_sequence="503,retract,ok") as f:
        sleep = SleepRecorder()
        retry = RetryPolicy(max_attempts=4, backoff_initial_s=1.0, sleep=sleep,
                            rng=FixedRandom(0.5))  # fmt: skip
        failures: list[str] = []
        m = msgs("overload")
        r, s = complete(f.url, m, retry=retry, on_failure=lambda e, n, w: failures.append(e.kind))
        assert failures == ["overloaded", "overloaded"] and r.attempts == 3
        assert sleep.waits == [0.75, 1.5]  # SGLang sends no Retry-After
        assert r.content == expected(m, s).content


def test_usage_on_the_finish_reason_chunk():
    with simulator_in_thread(instant=True, usage_shape="finish") as other:
        m = msgs("finish-shape")
        r, s = complete(other.url, m)
    ans = expected(m, s)
    assert (r.content, r.reasoning) == (ans.content, ans.reasoning)
    assert r.completion_tokens == ans.completion_tokens
    assert r.reasoning_tokens == ans.reasoning_tokens


def test_context_too_long_is_permanent_and_not_retried():
    with simulator_in_thread(instant=True, context_length=64) as small:
        sleep = SleepRecorder()
        with pytest.raises(PermanentError) as info:
            complete(small.url, msgs("ctx"), retry=RetryPolicy(max_attempts=4, sleep=sleep))
        assert info.value.status == 400 and sleep.waits == []


def test_fault_sequence_is_retried_with_the_exact_waits():
    with simulator_in_thread(instant=True, fault_sequence="429,500,disconnect", retry_after=7) as f:
        sleep = SleepRecorder()
        retry = RetryPolicy(
            max_attempts=8,
            backoff_initial_s=1.0,
            backoff_max_s=60.0,
            sleep=sleep,
            rng=FixedRandom(0.5),
        )
        m = msgs("faults")
        r, s = complete(f.url, m, retry=retry)
        assert r.attempts == 4
        assert sleep.waits == [7.0, 1.5, 3.0]  # Retry-After 7 beats 0.75
        assert r.content == expected(m, s).content


def test_a_stall_longer_than_the_timeout_is_a_timeout():
    with (
        simulator_in_thread(instant=True, fault_sequence="stall", stall_s=1) as f,
        pytest.raises(RequestTimeoutError),
    ):
        complete(f.url, msgs("stall"), timeout_s=0.3)


def test_slots_come_from_internal_states_when_the_flag_is_not_set(caplog):
    with simulator_in_thread(instant=True, memory_slots=40, dp_size=2) as t:
        caplog.set_level(logging.INFO, logger="regen.client.endpoints")
        (info,) = asyncio.run(check_endpoints([Endpoint(url=t.url)], MODEL))
    # SGLang without --max-running-requests: the top level is None, the live value per DP rank
    assert (info.max_running_requests, info.slots_source) == (40, "internal_states")
    assert "its 40 batch slots (internal_states) size the in-flight limits" in caplog.text


def test_the_start_check_sends_the_key_and_says_when_one_is_missing(monkeypatch):
    monkeypatch.setenv("REGEN_SIM_KEY", "k-123")
    with simulator_in_thread(instant=True, api_key="k-123", max_running_requests=8) as t:
        (info,) = asyncio.run(
            check_endpoints([Endpoint(url=t.url, api_key_env="REGEN_SIM_KEY")], MODEL)
        )
        assert info.max_running_requests == 8 and info.server_info
        with pytest.raises(EndpointError, match="wants an API key and regen sent no key"):
            asyncio.run(check_endpoints([Endpoint(url=t.url)], MODEL))


def test_a_seed_without_deterministic_inference_is_warned(caplog):
    with (
        simulator_in_thread(instant=True) as plain,
        simulator_in_thread(instant=True, enable_deterministic_inference=True) as det,
    ):
        caplog.set_level(logging.WARNING, logger="regen.client.endpoints")
        eps = [Endpoint(url=plain.url), Endpoint(url=det.url)]
        infos = asyncio.run(check_endpoints(eps, MODEL, seed=7))
        assert [i.deterministic for i in infos] == [False, True]
        warned = [r.getMessage() for r in caplog.records if "enable-deterministic" in r.message]
        assert len(warned) == 1 and plain.url in warned[0] and det.url not in warned[0]
        caplog.clear()
        asyncio.run(check_endpoints(eps, MODEL, seed=None))
        assert not [r for r in caplog.records if "enable-deterministic" in r.message]
