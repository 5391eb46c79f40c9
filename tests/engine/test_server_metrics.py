"""Scheduling by what the server says: a worker reads each endpoint's /metrics (in-thread
simulators speaking SGLang's page) and routes and limits by it; without a page it schedules
as before, and ``engine.concurrency`` stays a hard cap. Rounds of reading are driven by the
test (``poll`` + ``read_server``), so every assertion is on data, not on timing."""

from __future__ import annotations

import asyncio
import time

from regen.client import RetryPolicy
from regen.client.endpoints import EndpointInfo
from regen.engine.worker import SampleWorker
from regen.manifest import parse_manifest
from regen.sample import Message, Sample
from regen.simulate.testing import simulator_in_thread

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


def info(url: str, slots: int | None = SLOTS) -> EndpointInfo:
    return EndpointInfo(url=url, weight=1.0, models=("m",), max_running_requests=slots,
                        engine="sglang")  # fmt: skip


def stub_rows(sample, turns):
    return [{"sample_id": sample.id, "endpoint": t.result.endpoint} for t in turns]


def worker(
    urls: list[str], concurrency: int | None = None, max_tokens: int = 16, **kw
) -> SampleWorker:
    m = manifest(*urls, max_tokens=max_tokens)
    retry = RetryPolicy.from_engine(m.engine, sleep=no_sleep)
    return SampleWorker(m, [info(u) for u in urls], concurrency, row_builder=stub_rows,
                        retry=retry, metrics_interval_s=60.0, **kw)  # fmt: skip


def wait_running(sim, n: int) -> None:
    deadline = time.monotonic() + 30
    while sim.stats()["running"] < n and time.monotonic() < deadline:
        time.sleep(0.02)  # the scheduler admits them at its next step


async def read_all(w: SampleWorker) -> None:
    for url, poller in w.pollers.items():
        await poller.poll()
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
        start = {u: w.limits[u].current for u in (free.url, shared.url)}

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


def test_the_limit_follows_the_servers_queue_with_others_in_it() -> None:
    """A full limit on the shared server queues what the other client holds; the reading
    lowers regen's limit there to keep the queue at its target (1 of 8 slots), and leaves
    the free server's, whose queue is short, where it serves."""
    with (
        simulator_in_thread(model_name="m", enable_metrics=True, max_running_requests=SLOTS,
                            step_ms=20, mean_tokens=100_000, length_sigma=0.0) as free,
        simulator_in_thread(model_name="m", enable_metrics=True, max_running_requests=SLOTS,
                            step_ms=20, mean_tokens=100_000, length_sigma=0.0,
                            **SHARED) as shared,
    ):  # fmt: skip
        wait_running(shared, SLOTS // 2)
        w = worker([free.url, shared.url], max_tokens=100_000)  # long answers: they stay in

        async def go():
            tasks = [asyncio.create_task(w.process(Sample(f"s:{i}", "s", [Message("user", "hi")])))
                     for i in range(40)]  # fmt: skip
            for _ in range(500):  # until both limits are full (bounded)
                if all(w.router.in_flight(u) >= w.limits[u].current
                       for u in (free.url, shared.url)):  # fmt: skip
                    break
                await asyncio.sleep(0.02)
            full = {u: w.router.in_flight(u) for u in (free.url, shared.url)}
            deadline = time.monotonic() + 30
            while (shared.stats()["queued"] < full[shared.url] - SLOTS // 2
                   and time.monotonic() < deadline):  # fmt: skip
                await asyncio.sleep(0.02)
            queued = shared.stats()["queued"]
            await read_all(w)
            limits = {u: w.limits[u].current for u in (free.url, shared.url)}
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await w.aclose()
            return full, queued, limits

        full, queued, limits = asyncio.run(go())
    assert full == {free.url: SLOTS + 1, shared.url: SLOTS + 1}
    assert queued == SLOTS + 1 + SLOTS // 2 - SLOTS  # 5 wait behind the other client
    # the worker holds all of the server's slots (share 1): in flight 9, minus the excess 4
    assert limits[shared.url] == SLOTS + 1 - (queued - 1)
    assert limits[free.url] == SLOTS + 1  # its queue is the target: held


def test_without_a_page_the_worker_schedules_as_before_and_says_so_once(caplog) -> None:
    with simulator_in_thread(model_name="m", max_running_requests=SLOTS, step_ms=5) as sim:
        w = worker([sim.url])

        async def go():
            with caplog.at_level("INFO", logger="regen.client.metrics"):
                for _ in range(3):
                    await read_all(w)
                    w.pollers[sim.url].absent_every = 1  # ask every round: still 404
            outs = await asyncio.gather(*(w.process(Sample(f"s:{i}", "s",
                                                           [Message("user", "hi")]))
                                          for i in range(6)))  # fmt: skip
            await w.aclose()
            return outs

        outs = asyncio.run(go())
    assert all(o.status == "done" for o in outs)
    said = [r.getMessage() for r in caplog.records if "no metrics page" in r.getMessage()]
    assert len(said) == 1 and "scheduling without it" in said[0]
    assert w.router.others(sim.url) == 0 and not w.limits[sim.url].server_led
    assert w.router.snapshot()[sim.url]["server"] is None


def test_server_metrics_off_reads_no_page(caplog) -> None:
    with simulator_in_thread(model_name="m", enable_metrics=True, instant=True) as sim:
        with caplog.at_level("INFO", logger="regen.engine.worker"):
            w = worker([sim.url], server_metrics=False)
        asyncio.run(w.aclose())
    assert w.pollers == {}
    assert "no server metrics read (off)" in caplog.text


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
                seen.append((w.limits[sim.url].current, w.router.in_flight(sim.url),
                             w.slots.capacity))  # fmt: skip
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await w.aclose()
            return seen

        seen = asyncio.run(go())
    assert all(limit <= 3 and n <= 3 and cap <= 3 for limit, n, cap in seen)
    assert w.limits[sim.url].server_led


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
    1/8 headroom) and has more work: the server's queue is empty, short of its target of 2,
    so the limit grows by this worker's half of the gap; a round whose scrape failed leaves
    the last reading in place, and it is not followed twice."""
    with simulator_in_thread(model_name="m", enable_metrics=True, max_running_requests=16,
                             step_ms=20, mean_tokens=100_000, length_sigma=0.0) as sim:  # fmt: skip
        m = manifest(sim.url, max_tokens=100_000)
        w = SampleWorker(m, [info(sim.url, slots=16)], None, row_builder=stub_rows,
                         retry=RetryPolicy.from_engine(m.engine, sleep=no_sleep),
                         shares={sim.url: 8}, metrics_interval_s=60.0)  # fmt: skip

        async def go():
            tasks = [asyncio.create_task(w.process(Sample(f"s:{i}", "s", [Message("user", "hi")])))
                     for i in range(20)]  # fmt: skip
            for _ in range(500):  # until the limit is full (bounded)
                if w.router.in_flight(sim.url) >= w.limits[sim.url].current:
                    break
                await asyncio.sleep(0.02)
            deadline = time.monotonic() + 30
            while (sim.stats()["running"] < w.router.in_flight(sim.url)
                   and time.monotonic() < deadline):  # fmt: skip
                await asyncio.sleep(0.02)  # admitted: nothing waits in the server
            while w.pollers[sim.url].scrapes < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)  # the poller's own first round (at the first sample)
            start = w.limits[sim.url].current
            await read_all(w)
            grown = w.limits[sim.url].current
            w.read_server(sim.url)  # the same reading again (a failed round)
            again = w.limits[sim.url].current
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await w.aclose()
            return start, grown, again

        start, grown, again = asyncio.run(go())
    # 9 at the start, or 10 when the poller's own first round (at the first sample) already
    # found the queue short; this reading adds half the gap of 2 once
    assert start in (9, 10) and (grown, again) == (start + 1, start + 1)
