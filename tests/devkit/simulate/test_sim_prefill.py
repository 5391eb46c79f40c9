"""Prefill and the prefix cache of the simulator (issue 43): the cache's LRU and block
counting, what a multi-turn conversation finds cached on one server, the prefill's cost in the
scheduler's server time, and a closed stream's slot that SGLang frees only ~2 s later."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import pytest

from regen.devkit.simulate.config import SimConfig
from regen.devkit.simulate.prefix_cache import (
    PrefixCache,
    after_answer,
    answer_segment,
    message_segments,
    token_segments,
)
from regen.devkit.simulate.scheduler import Job, Scheduler
from regen.devkit.simulate.testing import simulator_in_thread
from regen.devkit.simulate.tokens import prompt_tokens

pytestmark = pytest.mark.timeout(60)


def test_cache_counts_whole_blocks_and_never_the_last_token():
    cache = PrefixCache(capacity=10_000, block_size=16)
    ids = list(range(100))
    assert cache.match(token_segments(ids, 16), len(ids)) == 0
    cache.insert(token_segments(ids, 16))
    # the same prompt: all but its last token, in whole blocks: 96
    assert cache.match(token_segments(ids, 16), 100) == 96
    # a prompt sharing 40 tokens: whole blocks of them, 32
    other = ids[:40] + [999] * 30
    assert cache.match(token_segments(other, 16), 70) == 32
    # page size 1 (SGLang): segments still of MIN_ID_SEGMENT ids, every matched token counts
    one = PrefixCache(capacity=10_000, block_size=1)
    one.insert(token_segments(ids, 1))
    assert one.match(token_segments(ids, 1), 100) == 99
    c = cache.counters
    assert (c.requests, c.queries, c.hits) == (3, 270, 128)


def test_cache_evicts_least_recently_used_leaves():
    cache = PrefixCache(capacity=64, block_size=16)
    a, b, c = ([k] * 32 for k in (1, 2, 3))
    cache.insert(token_segments(a, 16))
    cache.insert(token_segments(b, 16))
    assert cache.match(token_segments(a, 16), 33) == 32  # a is used now: b is the oldest
    cache.insert(token_segments(c, 16))  # 96 tokens > 64: b goes
    assert cache.tokens == 64
    assert cache.match(token_segments(b, 16), 33) == 0
    assert cache.match(token_segments(a, 16), 33) == 32
    assert cache.match(token_segments(c, 16), 33) == 32
    assert cache.counters.evicted == 32


def test_salts_share_nothing():
    cache = PrefixCache(capacity=10_000, block_size=16)
    ids = list(range(64))
    cache.insert(token_segments(ids, 16, salt="a"))
    assert cache.match(token_segments(ids, 16, salt="b"), 64) == 0
    assert cache.match(token_segments(ids, 16, salt="a"), 64) == 48


TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]


def _turns() -> list[list[dict[str, Any]]]:
    sys_ = {"role": "system", "content": "You are a careful engineer. " * 20}
    user = {"role": "user", "content": "Fix the failing test in the repository, please."}
    call = {"role": "assistant", "content": "Looking.",
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "ls", "arguments": '{"path": "."}'}}]}  # fmt: skip
    result = {"role": "tool", "tool_call_id": "c1", "content": "a.py b.py tests " * 30}
    return [[sys_, user], [sys_, user, call, result]]


def test_message_segments_add_up_to_the_prompt_count():
    for msgs in _turns():
        segs = message_segments(msgs, TOOLS)
        assert sum(t for _, t in segs) == prompt_tokens(msgs, TOOLS)


def test_the_next_turn_matches_through_the_answer():
    first, second = _turns()
    cache = PrefixCache(capacity=100_000)
    segs = message_segments(first, TOOLS)
    assert cache.match(segs) == 0
    cache.insert(segs)
    # the answer, as the next turn re-sends it (arguments re-spaced: same call)
    answer = answer_segment("Looking.", [("ls", '{"path":"."}')], 20)
    cache.insert(after_answer(segs, answer))
    segs2 = message_segments(second, TOOLS)
    expected = sum(t for _, t in segs2[:-2])  # all but the tool result and generation prompt
    assert cache.match(segs2) == expected


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_server_reports_cached_tokens_and_counters(engine: str):
    first = _turns()[0]
    with simulator_in_thread(instant=True, engine=engine, enable_cache_report=True,
                             enable_metrics=True, mean_tokens=20) as sim:  # fmt: skip
        url = sim.url
        a = _post(url, {"model": _MODEL, "messages": first, "tools": TOOLS, "max_tokens": 30})
        assert a["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        msg = a["choices"][0]["message"]
        history = [*first, {k: msg[k] for k in ("role", "content", "tool_calls") if msg.get(k)}]
        history.append({"role": "user", "content": "go on"})
        b = _post(url, {"model": _MODEL, "messages": history, "tools": TOOLS, "max_tokens": 30})
        usage = b["usage"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        block = 1 if engine == "sglang" else 16
        prompt_part = a["usage"]["prompt_tokens"] - 3  # its prompt less the generation prompt
        assert prompt_part + a["usage"]["completion_tokens"] >= cached > prompt_part - block
        assert cached % block == 0
        stats = json.loads(_get(sim.base + "/stats"))["prefix_cache"]
        assert stats["hits"] == cached
        assert stats["queries"] == a["usage"]["prompt_tokens"] + usage["prompt_tokens"]
        page = _get(sim.base + "/metrics")
        if engine == "vllm":
            assert f"vllm:prefix_cache_hits_total{{engine=\"0\",model_name=\"{_MODEL}\"}} " \
                   f"{float(cached)}" in page  # fmt: skip
            assert "vllm:prefix_cache_queries_total" in page
        else:
            assert "sglang:cache_hit_rate{" in page
            assert 'sglang:cached_tokens_total{cache_source="device"' in page


_MODEL = SimConfig().model_name


def test_report_is_off_by_default():
    first, _ = _turns()
    with simulator_in_thread(instant=True, mean_tokens=5) as sim:
        a = _post(sim.url, {"model": _MODEL, "messages": first, "max_tokens": 8})
    assert a["usage"]["prompt_tokens_details"] is None


def test_defaults_by_engine():
    sg, vl = SimConfig(), SimConfig(engine="vllm")
    assert (sg.cache_block_size, sg.abort_delay, sg.prefill_us_per_token) == (1, 2.0, 0.0)
    assert (vl.cache_block_size, vl.abort_delay) == (16, 0.0)
    assert sg.cache_tokens == sg.kv_tokens


async def _run_until(sched: Scheduler, done: Any, limit: int = 2000) -> None:
    for _ in range(limit):  # bounded in count; each wait is one step of a few ms
        if done():
            return
        await asyncio.sleep(0.002)
    raise AssertionError("scheduler did not get there")


def test_prefill_is_chunked_and_costs_server_time():
    async def main() -> tuple[Scheduler, Job, Job]:
        sched = Scheduler(4, 0.001, 1, prefill_s_per_token=1e-6, chunk=1000)
        sched.start()
        long = Job(total=3, prompt=2500, prefill=2500)
        short = Job(total=3, prompt=10, prefill=10)
        sched.submit(long)
        sched.submit(short)
        try:
            await _run_until(sched, lambda: long.done and short.done)
        finally:
            await sched.stop()
        return sched, long, short

    sched, long, short = asyncio.run(main())
    c = sched.counters
    assert c.prefill_tokens == 2510
    assert c.prefill_s == pytest.approx(2510e-6)
    # 1000 + 1000 + 500 (+ the short one's 10 in the third chunk): the long prompt's first
    # token comes in its third step, the short one's in that step too (it waits its turn)
    assert long.first_at is not None and short.first_at is not None
    assert c.steps >= 3 + 2  # three chunks, then the last two tokens
    assert c.busy_s == pytest.approx(c.steps * 0.001 + c.prefill_s, rel=0.02)


def test_a_closed_stream_runs_on_until_its_abort():
    async def main() -> tuple[Scheduler, Job, int, bool]:
        sched = Scheduler(2, 0.002, 1)
        sched.start()
        job = Job(total=100_000)
        sched.submit(job)
        try:
            await _run_until(sched, lambda: job.produced > 0)
            sched.close(job, 0.1)
            still = not job.cancelled
            at_close = job.produced
            await _run_until(sched, lambda: job.cancelled)
        finally:
            await sched.stop()
        return sched, job, at_close, still

    sched, job, at_close, still = asyncio.run(main())
    assert still and job.cancelled and job.produced > at_close
    assert sched.counters.tokens == job.produced  # the aborted job's tokens are counted
    assert sched.n_running == 0


def test_close_without_delay_aborts_at_once():
    async def main() -> Job:
        sched = Scheduler(2, 0.002, 1)
        job = Job(total=10)
        sched.submit(job)
        sched.close(job, 0.0)
        return job

    assert asyncio.run(main()).cancelled


def _running_after_close(engine: str, delay: float) -> tuple[int, int, int]:
    """Stream a long answer, close it after its first chunk; (running just after the close,
    tokens then, tokens once nothing runs)."""
    import httpx2

    with simulator_in_thread(engine=engine, abort_delay_s=delay, mean_tokens=100_000,
                             length_sigma=0, step_ms=2.0) as sim:  # fmt: skip
        body = {"model": _MODEL, "messages": [{"role": "user", "content": "go"}],
                "stream": True, "max_tokens": 100_000}  # fmt: skip
        with (
            httpx2.Client(timeout=30) as http,
            http.stream("POST", sim.url + "/chat/completions", json=body) as r,
        ):
            for _ in r.iter_bytes():
                break
        for _ in range(500):  # bounded: the server notices at its next write (a step)
            st = sim.stats()
            if st["client_gone"]:
                break
            time.sleep(0.01)
        running, at_close = st["running"], st["tokens_generated"]
        for _ in range(1000):
            st = sim.stats()
            if st["running"] == 0:
                break
            time.sleep(0.01)
        assert st["running"] == 0
        return running, at_close, st["tokens_generated"]


def test_sglang_keeps_a_closed_streams_slot_until_its_abort():
    running, at_close, final = _running_after_close("sglang", 1.5)
    assert running == 1 and final > at_close  # it went on generating, counted
    running, _, _ = _running_after_close("vllm", 0.0)
    assert running == 0


def test_the_lru_heap_stays_bounded():
    cache = PrefixCache(capacity=10**9, block_size=16)  # never full: nothing evicted
    ids = list(range(64))
    cache.insert(token_segments(ids, 16))
    for _ in range(5000):
        cache.match(token_segments(ids, 16), 64)
    assert len(cache._heap) <= 4 * cache.nodes + 1024
