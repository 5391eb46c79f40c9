"""Scheduling by what the server says: a worker reads each endpoint's /metrics (in-thread
simulators speaking SGLang's page) and routes and limits by it; without a page it schedules
as before, and ``engine.concurrency`` stays a hard cap. Rounds of reading are driven by the
test (``poll`` + ``read_server``), so every assertion is on data, not on timing."""

from __future__ import annotations

import asyncio
import contextlib
import time

from _worker_config import config_for, resolved

from regen.client import ResolvedEndpoint, RetryPolicy
from regen.core.sample import Message, Sample
from regen.devkit.simulate.testing import simulator_in_thread
from regen.engine.worker import SampleWorker
from regen.manifest import parse_manifest

SLOTS = 8
#: a server of SLOTS slots whose other client holds half of them for the whole test
SHARED = {"background_requests": SLOTS // 2, "background_max_tokens": 10_000_000}


async def no_sleep(_s: float) -> None:
    return None


def manifest(*urls: str, max_tokens: int = 16):
    return parse_manifest({
        "name": "t",
        "target": {"model": "m", "tokenizer": "tok"},
        "sampling": {"max_tokens": max_tokens, "seed": 0},
        "endpoints": [{"url": u} for u in urls],
        "engine": {"max_attempts": 3, "endpoint_failure_threshold": 100},
        "sources": [{"name": "s", "adapter": "sharegpt", "path": "x.jsonl"}],
    })  # fmt: skip


def info(url: str, slots: int | None = SLOTS) -> ResolvedEndpoint:
    return resolved(url, slots=slots)


def stub_rows(sample, turns):
    return [{"sample_id": sample.id, "endpoint": t.result.endpoint} for t in turns]


def worker(
    urls: list[str],
    concurrency: int | None = None,
    max_tokens: int = 16,
    server_metrics: bool = True,
    **kw,
) -> SampleWorker:
    m = manifest(*urls, max_tokens=max_tokens)
    config = config_for(m, [info(u) for u in urls], concurrency=concurrency,
                        server_metrics=server_metrics)  # fmt: skip
    retry = RetryPolicy.of(config.retry, sleep=no_sleep)
    return SampleWorker(config, row_builder=stub_rows, retry=retry, metrics_interval_s=60.0,
                        **kw)  # fmt: skip


def wait_running(sim, n: int) -> None:
    deadline = time.monotonic() + 30
    while sim.stats()["running"] < n and time.monotonic() < deadline:
        time.sleep(0.02)  # the scheduler admits them at its next step


async def read_all(w: SampleWorker) -> None:
    for url, lane in w.lanes.items():
        if lane.page is not None:
            await lane.page.poller.poll()
            w.read_server(url)


def test_a_server_busy_with_another_client_gets_less_of_regens_work() -> None:
    with (
        simulator_in_thread(model_name="m", enable_metrics=True, max_running_requests=SLOTS,
                            step_ms=20) as free,
        simulator_in_thread(model_name="m", enable_metrics=True, max_running_requests=SLOTS,
                            step_ms=20, **SHARED) as shared,
    ):  # fmt: skip
        wait_running(shared, SLOTS // 2)
        w = worker([free.url, shared.url])
        start = {u: w.lanes[u].limit.current for u in (free.url, shared.url)}

        async def go():
            await read_all(w)  # nothing of regen's in flight: the other client's 4
            others = {u: w.router.others(u) for u in (free.url, shared.url)}
            leases = [w.router.try_acquire(f"s:{i}") for i in range(12)]
            chosen = [lease.url for lease in leases if lease is not None]
            for lease in leases:
                if lease is not None:
                    w.router.abandon(lease)
            await w.aclose()
            return others, chosen

        others, chosen = asyncio.run(go())
    assert others == {free.url: 0, shared.url: SLOTS // 2}
    # least loaded counting the other client: the free server first, until it holds 4 more
    assert chosen[:5] == [free.url] * 5
    assert chosen.count(free.url) == 8 and chosen.count(shared.url) == 4
    assert start == {free.url: SLOTS + 1, shared.url: SLOTS + 1}  # slots + 1/8


async def other_client(url: str, n: int) -> tuple[list[asyncio.Task], asyncio.Task]:
    """``n`` long requests of another client (answers that outlast the test), sent now; and
    the task that closes its session once they are done or cancelled."""
    import aiohttp

    session = aiohttp.ClientSession()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 100_000}  # fmt: skip

    async def one() -> None:
        async with session.post(f"{url}/chat/completions", json=body) as resp:
            await resp.read()

    async def close_after(tasks: list[asyncio.Task]) -> None:
        with contextlib.suppress(BaseException):
            await asyncio.gather(*tasks)
        await session.close()

    tasks = [asyncio.create_task(one()) for _ in range(n)]
    return tasks, asyncio.create_task(close_after(list(tasks)))


def test_the_limit_follows_the_servers_queue_with_others_in_it() -> None:
    """The first reading comes before regen's first request: the shared server's limit starts
    at the room the other client leaves (4 free slots and a queue of 1), the free server's at
    its slots + 1/8. When a third client arrives and queues 4 more, the next reading lowers
    regen's limit there by that excess, and leaves the free server's, whose queue is on
    target, where it serves."""
    with (
        simulator_in_thread(model_name="m", enable_metrics=True, max_running_requests=SLOTS,
                            step_ms=20, mean_tokens=100_000, length_sigma=0.0) as free,
        simulator_in_thread(model_name="m", enable_metrics=True, max_running_requests=SLOTS,
                            step_ms=20, mean_tokens=100_000, length_sigma=0.0,
                            **SHARED) as shared,
    ):  # fmt: skip
        wait_running(shared, SLOTS // 2)
        w = worker([free.url, shared.url], max_tokens=100_000)  # long answers: they stay in
        urls = (free.url, shared.url)

        async def until(cond) -> None:
            deadline = time.monotonic() + 30
            while not cond() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)

        async def go():
            tasks = [asyncio.create_task(w.process(Sample(f"s:{i}", "s", [Message("user", "hi")])))
                     for i in range(40)]  # fmt: skip
            await until(
                lambda: all(w.router.in_flight(u) >= w.lanes[u].limit.current for u in urls)
            )
            full = {u: w.router.in_flight(u) for u in urls}
            await until(lambda: shared.stats()["running"] == SLOTS)
            queued_start = shared.stats()["queued"]
            others, closed = await other_client(shared.url, 4)
            await until(lambda: shared.stats()["queued"] >= queued_start + 4)
            queued = shared.stats()["queued"]
            await read_all(w)
            limits = {u: w.lanes[u].limit.current for u in urls}
            for t in [*tasks, *others]:
                t.cancel()
            await asyncio.gather(*tasks, *others, closed, return_exceptions=True)
            await w.aclose()
            return full, queued_start, queued, limits

        full, queued_start, queued, limits = asyncio.run(go())
    # the shared server: 4 free slots + the target queue of 1; the free one: 8 + 1
    assert full == {free.url: SLOTS + 1, shared.url: SLOTS // 2 + 1}
    assert queued_start == 1  # the target: regen's requests did not crowd the other client
    assert queued == 5  # the third client's 4 wait too
    # the worker holds all of the server's slots (share 1): in flight 5, less the excess 4
    assert limits == {free.url: SLOTS + 1, shared.url: 1}


def test_the_start_fills_the_slots_in_bursts_the_servers_queue_takes() -> None:
    """An idle server of 8 slots that queues at most 2 (SGLang refuses what arrives past
    that, slots free or not): the first requests go out 2 at a time, each burst after a
    reading shows the last one admitted, until the limit of 9 is full: no 503 at all."""
    with simulator_in_thread(model_name="m", enable_metrics=True, max_running_requests=SLOTS,
                             max_queued_requests=2, step_ms=20, mean_tokens=100_000,
                             length_sigma=0.0) as sim:  # fmt: skip
        m = manifest(sim.url, max_tokens=100_000)
        found = resolved(sim.url, slots=SLOTS, queued=2)
        config = config_for(m, [found])
        w = SampleWorker(config, row_builder=stub_rows,
                         retry=RetryPolicy.of(config.retry, sleep=no_sleep),
                         metrics_interval_s=60.0)  # fmt: skip

        async def go():
            tasks = [asyncio.create_task(w.process(Sample(f"s:{i}", "s", [Message("user", "hi")])))
                     for i in range(20)]  # fmt: skip
            seen = []
            deadline = time.monotonic() + 30
            while not w.lanes[sim.url].page.poller.scrapes and time.monotonic() < deadline:
                await asyncio.sleep(0.01)  # the first reading, before any request
            while w.router.in_flight(sim.url) < SLOTS + 1 and time.monotonic() < deadline:
                seen.append(w.lanes[sim.url].limit.current)
                await asyncio.sleep(0.01)
            scrapes = w.lanes[sim.url].page.poller.scrapes
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await w.aclose()
            return seen, scrapes

        seen, scrapes = asyncio.run(go())
        refused = sim.stats()["queue_full"]
    assert refused == 0
    assert seen[0] == 2 and max(seen) <= SLOTS + 1  # the first burst: what the queue takes
    assert len(set(seen)) >= 3  # grown in bursts, each after a reading
    assert scrapes >= 4  # read again soon, not after the 60 s interval


def test_a_paced_limit_asks_for_the_next_reading_soon_and_backs_off_without_progress() -> None:
    w = worker(["http://127.0.0.1:9/v1"])
    page = w.lanes["http://127.0.0.1:9/v1"].page
    assert page is not None
    assert page.pace(False, grew=False) is None  # not paced: the interval
    assert page.pace(True, grew=True) == 0.1
    assert [page.pace(True, grew=False) for _ in range(3)] == [0.2, 0.4, 0.8]
    assert page.pace(True, grew=True) == 0.1  # it grew again: soon again
    assert page.pace(False, grew=False) is None
    assert page.pace(True, grew=False) == 0.1  # a new pacing starts soon
    # a page that took 0.3 s to answer: requests take about as long to arrive
    page.poller.took_s = 0.3
    assert page.pace(True, grew=True) == 0.6


def test_without_a_page_the_worker_schedules_as_before_and_says_so_once(caplog) -> None:
    with simulator_in_thread(model_name="m", max_running_requests=SLOTS, step_ms=5) as sim:
        w = worker([sim.url])

        async def go():
            with caplog.at_level("INFO", logger="regen.client.server_load"):
                for _ in range(3):
                    await read_all(w)
                    w.lanes[sim.url].page.poller.absent_every = 1  # ask every round: still 404
            outs = await asyncio.gather(*(w.process(Sample(f"s:{i}", "s",
                                                           [Message("user", "hi")]))
                                          for i in range(6)))  # fmt: skip
            await w.aclose()
            return outs

        outs = asyncio.run(go())
    assert all(o.status == "done" for o in outs)
    said = [r.getMessage() for r in caplog.records if "no metrics page" in r.getMessage()]
    assert len(said) == 1 and "scheduling without it" in said[0]
    assert w.router.others(sim.url) == 0 and not w.lanes[sim.url].limit.server_led
    assert w.router.snapshot()[sim.url]["server"] is None


def test_server_metrics_off_reads_no_page(caplog) -> None:
    with simulator_in_thread(model_name="m", enable_metrics=True, instant=True) as sim:
        with caplog.at_level("INFO", logger="regen.engine.pages"):
            w = worker([sim.url], server_metrics=False)
            on = worker([sim.url])  # the manifest's default: read it
            m = manifest(sim.url)
            off = m.model_copy(update={"engine": m.engine.model_copy(
                update={"server_metrics": False})})  # fmt: skip
            by_manifest = SampleWorker(config_for(off, [info(sim.url)]), row_builder=stub_rows)
        for x in (w, on, by_manifest):
            asyncio.run(x.aclose())

    def read(x: SampleWorker) -> list[str]:
        return [url for url, lane in x.lanes.items() if lane.page is not None]

    assert read(w) == read(by_manifest) == [] and read(on) == [sim.url]
    assert "no server metrics read (engine.server_metrics: false)" in caplog.text


def test_concurrency_stays_a_hard_cap_whatever_the_server_says() -> None:
    """An idle server with a short queue asks for more; the user's cap of 3 holds."""
    with simulator_in_thread(model_name="m", enable_metrics=True, max_running_requests=SLOTS,
                             step_ms=20, mean_tokens=100_000, length_sigma=0.0) as sim:  # fmt: skip
        w = worker([sim.url], concurrency=3, max_tokens=100_000)

        async def go():
            tasks = [asyncio.create_task(w.process(Sample(f"s:{i}", "s", [Message("user", "hi")])))
                     for i in range(10)]  # fmt: skip
            seen = []
            for _ in range(5):
                await asyncio.sleep(0.1)
                await read_all(w)
                seen.append((w.lanes[sim.url].limit.current, w.router.in_flight(sim.url),
                             w.slots.capacity))  # fmt: skip
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await w.aclose()
            return seen

        seen = asyncio.run(go())
    assert all(limit <= 3 and n <= 3 and cap <= 3 for limit, n, cap in seen)
    assert w.lanes[sim.url].limit.server_led


def test_the_servers_side_reaches_the_progress_file(tmp_path) -> None:
    """A worker's reading of a shared server goes through its snapshot and the driver's
    tracker to progress.json, which the dashboard reads (tests/monitor draws it)."""
    from regen.engine.tracker import ProgressTracker
    from regen.store import RunDir, layout

    with simulator_in_thread(model_name="m", enable_metrics=True, max_running_requests=SLOTS,
                             step_ms=20, **SHARED) as shared:  # fmt: skip
        wait_running(shared, SLOTS // 2)
        w = worker([shared.url])

        async def go():
            await read_all(w)
            snap = w.snapshot()
            await w.aclose()
            return snap

        snap = asyncio.run(go())
    rd = RunDir.open(tmp_path / "r")
    t = ProgressTracker(rd, name="n", model="m", session="S", run_started_at=1.0,
                        endpoints=[shared.url])  # fmt: skip
    t.workers([snap, snap])  # two workers read the same page: one reading, not two
    t.write("running")
    (ep,) = layout.PROGRESS_FILE.read(rd).endpoints
    assert (ep.server_running, ep.server_queued) == (SLOTS // 2, 0)
    assert ep.server_kv_usage is not None and 0 < ep.server_kv_usage < 1


def test_a_short_queue_raises_the_limit_once_per_reading() -> None:
    """This worker holds half of a 16-slot server (the driver's share: 8, so 9 with the
    1/8 headroom) and has more work: the server runs its 9 and queues nothing, room for 7
    more slots and a queue of 2, so the limit grows by this worker's half of that; a round
    whose scrape failed leaves the last reading in place, and it is not followed twice."""
    with simulator_in_thread(model_name="m", enable_metrics=True, max_running_requests=16,
                             step_ms=20, mean_tokens=100_000, length_sigma=0.0) as sim:  # fmt: skip
        m = manifest(sim.url, max_tokens=100_000)
        config = config_for(m, [info(sim.url, slots=16)])
        w = SampleWorker(config, row_builder=stub_rows,
                         retry=RetryPolicy.of(config.retry, sleep=no_sleep),
                         shares={sim.url: 8}, metrics_interval_s=60.0)  # fmt: skip

        async def go():
            tasks = [asyncio.create_task(w.process(Sample(f"s:{i}", "s", [Message("user", "hi")])))
                     for i in range(20)]  # fmt: skip
            for _ in range(500):  # until the limit is full (bounded)
                if w.router.in_flight(sim.url) >= w.lanes[sim.url].limit.current:
                    break
                await asyncio.sleep(0.02)
            deadline = time.monotonic() + 30
            while (sim.stats()["running"] < w.router.in_flight(sim.url)
                   and time.monotonic() < deadline):  # fmt: skip
                await asyncio.sleep(0.02)  # admitted: nothing waits in the server
            assert w.lanes[sim.url].page.poller.scrapes == 1  # the first round, before any request
            start = w.lanes[sim.url].limit.current
            await read_all(w)
            grown = w.lanes[sim.url].limit.current
            w.read_server(sim.url)  # the same reading again (a failed round)
            again = w.lanes[sim.url].limit.current
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await w.aclose()
            return start, grown, again

        start, grown, again = asyncio.run(go())
    # the first reading (an idle server: room for 18) left the share of 9; this one adds half
    # of the room for 9, once
    assert (start, grown, again) == (9, 14, 14)
