"""The simulator's /metrics page, its queue limit and its second client, against a real
simulated server (in a thread: each test sets its own capacity). tests/contract holds the
page's names, types and labels against SGLang's and vLLM's code."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest

from regen.client.profiles import SGLANG, VLLM
from regen.client.server_load import counter_total, parse_page, read_load
from regen.core.errors import ConfigError
from regen.devkit.simulate.config import SimConfig
from regen.devkit.simulate.testing import simulator_in_thread
from tests._loadgen import make_body, run_load

#: requests of a background client that never end while a test looks at the server
FOREVER = 1_000_000


def wait_for(sim, pred, timeout_s: float = 30.0) -> dict:
    """/stats once ``pred(stats)`` holds (the scheduler admits jobs at its next step)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = sim.stats()
        if pred(stats):
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.02)


def load_of(sim, engine: str = "sglang"):
    names = (VLLM if engine == "vllm" else SGLANG).metrics
    return read_load(parse_page(sim.metrics_text()).samples, names, at=time.monotonic())


def post(sim, stream: bool) -> tuple[int, bytes]:
    body = make_body(0, "moonshotai/Kimi-K2.5", 8, stream=stream)
    req = urllib.request.Request(sim.url + "/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_sglang_serves_metrics_only_when_enabled() -> None:
    with simulator_in_thread(instant=True) as sim:
        with pytest.raises(urllib.error.HTTPError) as e:
            sim.metrics_text()
        e.value.close()  # its response holds the connection
        assert e.value.code == 404  # SGLang without --enable-metrics
    with simulator_in_thread(instant=True, enable_metrics=True) as sim:
        page = parse_page(sim.metrics_text())
        assert page.families["sglang:num_running_reqs"].type == "gauge"


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_the_page_is_the_servers_state_with_every_clients_requests(engine: str) -> None:
    """Two slots, a second client holding five requests: two run, three wait, and the KV pool
    holds the running ones' prompts and outputs; the page says so in either engine's names."""
    with simulator_in_thread(engine=engine, enable_metrics=True, max_running_requests=2,
                             background_requests=5, background_max_tokens=FOREVER,
                             background_prompt_tokens=1000, max_total_tokens=10_000,
                             step_ms=20) as sim:  # fmt: skip
        wait_for(sim, lambda s: s["running"] == 2)
        load = load_of(sim, engine)
        assert (load.running, load.queued, load.load) == (2, 3, 5)
        used = 2 * 1000  # two prompts, plus what the two running jobs generated so far
        assert used / 10_000 <= load.kv_usage < (used + 2000) / 10_000
        stats = sim.stats()
        assert stats["background"] == {"requests": 5, "completed": 0, "tokens": 0}


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_token_counters_add_up_to_what_was_answered(engine: str) -> None:
    with simulator_in_thread(engine=engine, enable_metrics=True, max_running_requests=4,
                             step_ms=1, mean_tokens=30) as sim:  # fmt: skip
        result = asyncio.run(run_load(sim.url, requests=12, concurrency=4, max_tokens=40))
        assert result.requests == 12
        stats = sim.stats()
        samples = parse_page(sim.metrics_text()).samples
        load = read_load(samples, (VLLM if engine == "vllm" else SGLANG).metrics, time.monotonic())
        assert load.generation_tokens == stats["completion_tokens"] == stats["tokens_generated"]
        assert load.prompt_tokens == stats["prompt_tokens"]
        assert (load.running, load.queued) == (0, 0)
        if engine == "sglang":
            assert counter_total(samples, "sglang:num_requests_total") == 12
            assert counter_total(samples, "sglang:e2e_request_latency_seconds_count") == 12
            assert load.gen_throughput is not None and load.gen_throughput > 0
        else:
            assert counter_total(samples, "vllm:request_success_total") == 12
            assert counter_total(samples, "vllm:time_to_first_token_seconds_count") == 12


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_full_queue_answers_503_in_each_engines_shape(engine: str) -> None:
    """--max-queued-requests 2: SGLang refuses a request finding 2 waiting, vLLM one finding
    2 running and waiting (its --max-num-queued-reqs); streamed, HTTP 200 then the error."""
    background = 4 if engine == "sglang" else 2  # sglang: 2 run, 2 wait; vllm: 2 run
    with simulator_in_thread(engine=engine, enable_metrics=True, max_running_requests=2,
                             max_queued_requests=2, background_requests=background,
                             background_max_tokens=FOREVER, step_ms=20) as sim:  # fmt: skip
        wait_for(sim, lambda s: s["running"] == 2)
        status, body = post(sim, stream=False)
        assert status == 503
        err = json.loads(body)
        message = err["message"] if engine == "sglang" else err["error"]["message"]
        assert message.startswith(
            "The request queue is full" if engine == "sglang" else "The engine is currently busy"
        )
        status, body = post(sim, stream=True)
        assert status == 200 and b'"code":503' in body and body.endswith(b"data: [DONE]\n\n")
        stats = sim.stats()
        assert stats["queue_full"] == 2 and stats["completed"] == 0
        load = load_of(sim, engine)
        assert load.refused == (2 if engine == "vllm" else None)  # SGLang has no such counter


def test_a_queue_with_room_takes_the_request() -> None:
    """One waiting, a limit of 2: the next request joins the queue (and is not refused)."""
    import aiohttp

    async def join_queue(sim) -> dict:
        async with aiohttp.ClientSession() as s:
            body = make_body(2, "moonshotai/Kimi-K2.5", 8)
            sent = asyncio.ensure_future(
                s.post(
                    sim.url + "/chat/completions",
                    data=body,
                    headers={"Content-Type": "application/json"},
                )
            )
            stats = await asyncio.to_thread(wait_for, sim, lambda st: st["queued"] == 2)
            sent.cancel()
            return stats

    with simulator_in_thread(enable_metrics=True, max_running_requests=2, max_queued_requests=2,
                             background_requests=3, background_max_tokens=FOREVER,
                             step_ms=5) as sim:  # fmt: skip
        wait_for(sim, lambda s: s["running"] == 2 and s["queued"] == 1)
        stats = asyncio.run(join_queue(sim))
    assert stats["queue_full"] == 0 and stats["received"] == 1


def test_each_data_parallel_rank_queues_up_to_the_flag() -> None:
    """SGLang's schedulers (one per DP rank) each apply --max-queued-requests to their own
    waiting queue: with 2 ranks and a flag of 2, a request finding 3 waiting joins them, the
    one after it (finding 4) is refused."""
    import aiohttp

    async def fill(sim) -> tuple[dict, int]:
        async with aiohttp.ClientSession() as s:
            body = make_body(2, "moonshotai/Kimi-K2.5", 8)
            headers = {"Content-Type": "application/json"}
            sent = asyncio.ensure_future(
                s.post(sim.url + "/chat/completions", data=body, headers=headers)
            )
            stats = await asyncio.to_thread(wait_for, sim, lambda st: st["queued"] == 4)
            status, _ = await asyncio.to_thread(post, sim, False)
            sent.cancel()
            return stats, status

    with simulator_in_thread(enable_metrics=True, dp_size=2, max_running_requests=2,
                             max_queued_requests=2, background_requests=5,
                             background_max_tokens=FOREVER, step_ms=20) as sim:  # fmt: skip
        wait_for(sim, lambda s: s["running"] == 2 and s["queued"] == 3)
        joined, status = asyncio.run(fill(sim))
        refused = sim.stats()["queue_full"]
    assert joined["queue_full"] == 0 and joined["received"] == 1
    assert status == 503 and refused == 1


@pytest.mark.parametrize("option", [{"background_requests": 2}, {"max_queued_requests": 0}])
def test_a_queue_without_the_capacity_model_is_refused(option: dict) -> None:
    with pytest.raises(ConfigError) as e:
        SimConfig.from_flat({"instant": True, **option})
    assert "need the capacity model" in str(e.value)


def test_data_parallel_ranks_each_report_their_share() -> None:
    with simulator_in_thread(enable_metrics=True, dp_size=2, max_running_requests=4,
                             background_requests=7, background_max_tokens=FOREVER,
                             step_ms=20) as sim:  # fmt: skip
        wait_for(sim, lambda s: s["running"] == 4)
        samples = parse_page(sim.metrics_text()).samples
    per_rank = {s.labels["dp_rank"]: s.value for s in samples
                if s.name == "sglang:num_running_reqs"}  # fmt: skip
    assert per_rank == {"0": 2.0, "1": 2.0}
    load = read_load(samples, SGLANG.metrics, time.monotonic())
    assert (load.running, load.queued) == (4, 3)


def test_a_client_that_hangs_up_is_counted_as_aborted() -> None:
    async def hang_up(url: str) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as s:
            body = make_body(1, "moonshotai/Kimi-K2.5", 5000)
            async with s.post(url + "/chat/completions", data=body,
                              headers={"Content-Type": "application/json"}) as r:  # fmt: skip
                await r.content.readany()  # the first bytes, then close

    with simulator_in_thread(enable_metrics=True, step_ms=5) as sim:
        asyncio.run(hang_up(sim.url))
        wait_for(sim, lambda s: s["client_gone"] == 1)
        load = load_of(sim)
    assert load.aborted == 1
