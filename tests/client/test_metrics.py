"""Reading a server's /metrics: real pages from the simulator in SGLang's and vLLM's names,
how series combine over ranks, and every way a page can be missing or damaged (a scrape
reports it and never raises)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx2
import pytest
from aiohttp import web

from regen.client.profiles import SGLANG, VLLM
from regen.client.server_load import (
    MetricsPoller,
    Scrape,
    ServerLoad,
    parse_metrics,
    parse_page,
    read_load,
    scrape,
)
from regen.core.errors import MetricsPageError
from regen.devkit.simulate.testing import simulator_in_thread
from tests._loadgen import run_load


async def _scrape(root: str, names=SGLANG.metrics, **kw) -> Scrape:
    async with httpx2.AsyncClient(timeout=10) as http:
        return await scrape(http, root, names, **kw)


# ---- real pages --------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_real_page_is_read_as_the_servers_load(engine: str) -> None:
    names = (VLLM if engine == "vllm" else SGLANG).metrics
    with simulator_in_thread(engine=engine, enable_metrics=True, max_running_requests=3,
                             background_requests=5, background_max_tokens=1_000_000,
                             step_ms=10) as sim:  # fmt: skip
        deadline = time.monotonic() + 30
        while sim.stats()["running"] < 3 and time.monotonic() < deadline:
            time.sleep(0.02)  # the scheduler admits them at its next step
        got = asyncio.run(_scrape(sim.base, names))
    assert got.ok and got.status == 200 and got.error is None
    load = got.load
    assert load is not None and (load.running, load.queued) == (3, 2)
    assert load.kv_usage is not None and 0 < load.kv_usage < 1


def test_throughput_and_counters_follow_the_traffic_between_two_readings() -> None:
    async def two(sim) -> tuple[Scrape, Scrape]:
        async with httpx2.AsyncClient(timeout=10) as http:
            first = await scrape(http, sim.base, VLLM.metrics)
            await run_load(sim.url, requests=8, concurrency=4, max_tokens=30)
            second = await scrape(http, sim.base, VLLM.metrics, previous=first.load)
        return first, second

    with simulator_in_thread(engine="vllm", step_ms=1, mean_tokens=30) as sim:
        first, second = asyncio.run(two(sim))
        answered = sim.stats()["completion_tokens"]
    assert first.load is not None and second.load is not None
    assert first.load.gen_throughput is None  # vLLM has no gauge: a rate needs two readings
    assert second.load.generation_tokens == answered > 0
    dt = second.load.at - first.load.at
    assert second.load.gen_throughput == pytest.approx(answered / dt)


# ---- how series combine ------------------------------------------------------------------

SGLANG_RANKS = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="k",tp_rank="0"} 10.0
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="k",tp_rank="1"} 10.0
sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="k",tp_rank="8"} 7.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="k",priority="",tp_rank="0"} 5.0
sglang:num_queue_reqs{engine_type="unified",model_name="k",priority="0",tp_rank="0"} 3.0
sglang:num_queue_reqs{engine_type="unified",model_name="k",priority="1",tp_rank="0"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",engine_type="unified",model_name="k",tp_rank="0"} 0.5
sglang:token_usage{dp_rank="1",engine_type="unified",model_name="k",tp_rank="8"} 0.9
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{dp_rank="0",engine_type="unified",model_name="k",tp_rank="0"} 1000.0
sglang:gen_throughput{dp_rank="1",engine_type="unified",model_name="k",tp_rank="8"} 800.0
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{engine_type="unified",is_streaming="true",model_name="k"} 40.0
sglang:generation_tokens_total{engine_type="unified",is_streaming="false",model_name="k"} 2.0
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{dp_rank="0",engine_type="unified",model_name="k",tp_rank="0"} 2.4
"""


def test_ranks_add_up_and_priority_breakdowns_are_not_counted_twice() -> None:
    load = read_load(parse_page(SGLANG_RANKS).samples, SGLANG.metrics, at=1.0)
    assert load.running == 17  # DP ranks add; a second TP rank of rank 0 is the same batch
    assert load.queued == 5  # the total (priority=""), not 5 + 3 + 2
    assert load.kv_usage == 0.9  # the fullest rank
    assert load.gen_throughput == 1800
    assert load.generation_tokens == 42  # streamed and not
    assert load.spec_accept_length == 2.4
    assert load.aborted is None and load.refused is None  # not on this page


def test_a_restarted_server_gives_no_rate_rather_than_a_negative_one() -> None:
    before = ServerLoad(at=0.0, generation_tokens=5000.0)
    page = 'vllm:generation_tokens_total{engine="0",model_name="k"} 100.0\n'
    load = read_load(parse_page(page).samples, VLLM.metrics, at=5.0, previous=before)
    assert load.generation_tokens == 100 and load.gen_throughput is None


def test_vllm_acceptance_is_over_the_time_since_the_last_reading() -> None:
    def page(drafts: int, accepted: int) -> str:
        return (f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="k"}} {drafts}\n'
                f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="k"}} '
                f"{accepted}\n")  # fmt: skip

    first = read_load(parse_page(page(100, 100)).samples, VLLM.metrics, at=0.0)
    assert first.spec_accept_length == 2.0  # since start
    second = read_load(parse_page(page(200, 300)).samples, VLLM.metrics, 5.0, previous=first)
    assert second.spec_accept_length == 3.0  # 100 drafts, 200 accepted since the first
    idle = read_load(parse_page(page(200, 300)).samples, VLLM.metrics, 10.0, previous=second)
    assert idle.spec_accept_length == 3.0  # no draft since: the last value stands


# ---- damaged and missing pages -----------------------------------------------------------

GOOD = SGLANG_RANKS
PAGES = {
    "/cut/metrics": (200, GOOD[: GOOD.index('tp_rank="8"} 7.0') + 5]),  # cut mid-line
    "/html/metrics": (200, "<html><body><h1>502 Bad Gateway</h1></body></html>\n"),
    "/error/metrics": (500, "internal error"),
    "/other/metrics": (200, 'process_cpu_seconds_total 12.0\npython_info{version="3"} 1.0\n'),
    "/good/metrics": (200, GOOD),
}


@contextlib.contextmanager
def broken_server() -> Iterator[str]:
    """A local server whose /metrics pages are damaged in each way (plus one that never
    answers): roots ``{base}/cut``, ``/html``, ``/error``, ``/other``, ``/slow``, ``/good``."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    got: dict[str, object] = {}

    async def page(request: web.Request) -> web.Response:
        status, text = PAGES[request.path]
        return web.Response(status=status, text=text)

    async def slow(_request: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        return web.Response(text=GOOD)

    async def main() -> None:
        app = web.Application()
        for path in PAGES:
            app.router.add_get(path, page)
        app.router.add_get("/slow/metrics", slow)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        got["base"] = f"http://127.0.0.1:{runner.addresses[0][1]}"
        stop = asyncio.Event()
        got["stop"] = stop
        started.set()
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    assert started.wait(30)
    try:
        yield str(got["base"])
    finally:
        loop.call_soon_threadsafe(got["stop"].set)  # type: ignore[attr-defined]
        thread.join(timeout=10)
        loop.close()


@pytest.fixture(scope="module")
def broken() -> Iterator[str]:
    with broken_server() as base:
        yield base


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_good_page_from_the_same_server_reads(broken: str) -> None:
    got = asyncio.run(_scrape(f"{broken}/good"))
    assert got.ok and got.load is not None and got.load.running == 17


@pytest.mark.parametrize(
    ("root", "status", "error"),
    [
        ("cut", 200, "damaged page"),
        ("html", 200, "damaged page"),
        ("error", 500, "HTTP 500"),
        ("other", 200, "no sglang: series"),
    ],
)
def test_a_damaged_page_is_reported_not_raised(broken: str, root, status, error) -> None:
    got = asyncio.run(_scrape(f"{broken}/{root}"))
    assert not got.ok and got.load is None and not got.absent
    assert got.status == status and got.error is not None and got.error.startswith(error)


def test_a_server_that_does_not_answer_is_given_up_on(broken: str) -> None:
    got = asyncio.run(_scrape(f"{broken}/slow", timeout_s=0.2))
    assert not got.ok and got.status is None and got.error == "no answer in 0.2 s"


def test_an_unreachable_server_is_reported() -> None:
    got = asyncio.run(_scrape(f"http://127.0.0.1:{free_port()}"))
    assert not got.ok and got.status is None and got.error.startswith("unreachable: ")


def test_sglang_without_enable_metrics_is_absent() -> None:
    with simulator_in_thread(instant=True) as sim:
        got = asyncio.run(_scrape(sim.base))
    assert got.absent and not got.ok and got.error == "HTTP 404"


def test_parse_page_refuses_what_parse_metrics_tolerates() -> None:
    cut = PAGES["/cut/metrics"][1]
    with pytest.raises(MetricsPageError):
        parse_page(cut)
    samples = parse_metrics(cut)  # the lines that parse, for identity checks
    assert {s.name for s in samples} == {"sglang:num_running_reqs"} and len(samples) == 2
    assert parse_metrics("<html>nope</html>") == []


# ---- the poller --------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_poller_says_each_change_once_and_forgets_stale_readings(broken: str) -> None:
    said: list[str] = []
    clock = Clock()

    async def rounds() -> MetricsPoller:
        async with httpx2.AsyncClient(timeout=10) as http:
            p = MetricsPoller(http, f"{broken}/good", SGLANG.metrics, interval_s=5.0,
                              clock=clock, on_change=lambda _r, m: said.append(m))  # fmt: skip
            await p.poll()
            await p.poll()
            assert p.latest is not None and p.latest.running == 17
            clock.t += 16.0  # older than three intervals
            assert p.latest is None
            p.root = f"{broken}/html"
            await p.poll()
            await p.poll()
            p.root = f"{broken}/good"
            await p.poll()
            return p

    p = asyncio.run(rounds())
    assert (p.scrapes, p.failures) == (5, 2)
    assert len(said) == 3 and said[0].startswith("reading") and "damaged page" in said[1]
    assert said[2].startswith("reading")


def test_an_absent_page_is_said_once_and_asked_again_now_and_then() -> None:
    said: list[str] = []

    async def rounds(root: str) -> MetricsPoller:
        async with httpx2.AsyncClient(timeout=10) as http:
            p = MetricsPoller(http, root, SGLANG.metrics, absent_every=3,
                              on_change=lambda _r, m: said.append(m))  # fmt: skip
            for _ in range(7):
                await p.poll()
            return p

    with simulator_in_thread(instant=True) as sim:
        p = asyncio.run(rounds(sim.base))
    assert p.absent and p.latest is None
    assert p.scrapes == 3  # rounds 1, 3 and 6 ask; the others are skipped
    assert len(said) == 1 and "no metrics page (HTTP 404)" in said[0]


def test_what_the_poller_says_never_carries_the_urls_user_and_password() -> None:
    said: list[str] = []

    async def rounds(root: str) -> None:
        async with httpx2.AsyncClient(timeout=10) as http:
            p = MetricsPoller(http, root, SGLANG.metrics, on_change=lambda _r, m: said.append(m))
            await p.poll()

    with simulator_in_thread(instant=True) as sim:
        asyncio.run(rounds(sim.base.replace("http://", "http://regen:pass-word-7@")))
        public = sim.base
    assert len(said) == 1 and said[0].startswith(f"{public}/metrics: no metrics page"), said
    assert "pass-word-7" not in said[0]


def test_the_poller_comes_back_when_its_consumer_asks_and_else_waits_its_interval(
    broken: str,
) -> None:
    asked = [0.01, 0.01, 0.01]  # three rounds soon, then the interval (60 s)

    async def run() -> MetricsPoller:
        async with httpx2.AsyncClient(timeout=10) as http:
            p = MetricsPoller(http, f"{broken}/good", SGLANG.metrics, interval_s=60.0)
            task = asyncio.create_task(p.run(lambda: asked.pop(0) if asked else None))
            deadline = time.monotonic() + 30
            while p.scrapes < 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # well inside the 60 s: no fifth round
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return p

    p = asyncio.run(run())
    assert p.scrapes == 4 and not asked
