"""The dispatch loop without Ray: tests/engine/_local_pool.py's LocalWorkerPool over real
SampleWorkers (against an in-thread simulator) and over scripted workers: every sample once, a
dead worker's samples requeued and a replacement started, the respawn budget, a start that
fails twice with the same error, stop.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest
from _local_pool import LocalWorkerPool
from _worker_config import config_for

from regen.client import RetryPolicy
from regen.core.errors import ConfigError, NoEndpointLeftError, RegenError, RunIncompleteError
from regen.core.sample import Message, Sample
from regen.devkit.simulate.testing import simulator_in_thread
from regen.engine.dispatch import Dispatcher
from regen.engine.schedule import WorkQueue
from regen.engine.worker import SampleOutcome, SampleWorker
from regen.manifest import parse_manifest


def samples(n: int) -> list[Sample]:
    return [Sample(f"s:{i}", "s", [Message("user", f"question {i} " * (1 + i % 5))])
            for i in range(n)]  # fmt: skip


class Recorder:
    """Collects what the loop reports; ``on_done`` runs after each completion."""

    def __init__(self, on_done=None) -> None:
        self.done: list[str] = []
        self.failures: list[str] = []
        self.lost: list[str] = []
        self.ticks = 0
        self.on_done = on_done

    def completed(self, out: SampleOutcome, sample: Any) -> None:
        self.done.append(out.sample_id)
        if self.on_done is not None:
            self.on_done(len(self.done))

    def failed(self, out: SampleOutcome) -> None:
        self.failures.append(out.sample_id)

    def worker_lost(self, error: str) -> None:
        self.lost.append(error)

    def tick(self, snapshots) -> None:
        self.ticks += 1
        snapshots()

    def holding(self) -> bool:
        return False


class Scripted:
    """A worker that answers after ``delay_s`` (on the pool's event loop)."""

    def __init__(self, delay_s: float = 0.01, capacity: int = 2) -> None:
        self.delay_s = delay_s
        self.slots = type("S", (), {"capacity": capacity})()
        self.seen: list[str] = []

    async def process(self, sample: Any) -> SampleOutcome:
        self.seen.append(sample.id)
        await asyncio.sleep(self.delay_s)
        return SampleOutcome(sample.id, sample.source, rows=[{"turn": 0}], slots=2)

    def snapshot(self) -> dict[str, Any]:
        return {"seen": len(self.seen)}

    async def aclose(self) -> None:
        return None


def run_pool(factory, n_samples: int, n_workers: int = 2, *, on_done=None, **kw):
    pool = LocalWorkerPool(factory)
    try:
        d = Dispatcher(pool, n_workers, prefetch=1, **kw)
        rec = Recorder(on_done=on_done(pool, d) if on_done else None)
        state = d.run(WorkQueue(samples(n_samples)), rec)
        return state, rec, d
    finally:
        pool.close()


def test_every_sample_once_over_two_workers() -> None:
    made: list[Scripted] = []

    def factory(i: int, gen: int) -> Scripted:
        made.append(Scripted())
        return made[-1]

    state, rec, d = run_pool(factory, 40)
    assert state == "finished"
    assert sorted(rec.done) == sorted(s.id for s in samples(40))
    assert all(len(w.seen) > 5 for w in made)  # both were fed
    assert d.deaths == 0 and rec.ticks > 0


def test_a_dead_worker_is_requeued_and_replaced() -> None:
    def kill_first_after_5(pool, d):
        def cb(n: int) -> None:
            if n == 5:
                pool.kill(d.workers[0])

        return cb

    state, rec, d = run_pool(lambda i, g: Scripted(delay_s=0.02), 40,
                             on_done=kill_first_after_5)  # fmt: skip
    assert state == "finished"
    counts = Counter(rec.done)
    assert set(counts) == {s.id for s in samples(40)} and max(counts.values()) == 1
    assert d.deaths == 1 and d.respawned == 1 and rec.lost == ["killed"]
    assert d.workers[0].name.endswith("-2")  # the replacement took slot 0


def test_no_budget_and_no_survivor_is_one_error() -> None:
    def kill_it(pool, d):
        return lambda n: pool.kill(d.workers[0]) if n == 3 else None

    with pytest.raises(RegenError, match="all workers died"):
        run_pool(lambda i, g: Scripted(), 20, n_workers=1, max_respawns=0, on_done=kill_it)


def test_a_start_failing_twice_with_the_same_error_is_a_configuration_error() -> None:
    def factory(i: int, gen: int) -> Scripted:
        raise FileNotFoundError(2, "No such file or directory", "/models/missing")

    with pytest.raises(ConfigError, match=r"workers cannot start: FileNotFoundError.*missing"):
        run_pool(factory, 10, n_workers=1, max_respawns=5)


def test_a_start_failing_once_is_replaced() -> None:
    def factory(i: int, gen: int) -> Scripted:
        if gen == 0:
            raise OSError("flaky node")
        return Scripted()

    state, rec, d = run_pool(factory, 10, n_workers=2)
    assert state == "finished" and sorted(rec.done) == sorted(s.id for s in samples(10))
    assert d.deaths == 1 and rec.lost == ["OSError: flaky node"]


def test_stop_interrupts() -> None:
    stop = threading.Event()

    def stop_after_3(pool, d):
        return lambda n: stop.set() if n == 3 else None

    state, rec, _ = run_pool(lambda i, g: Scripted(delay_s=0.05), 30, stop=stop,
                             on_done=stop_after_3)  # fmt: skip
    assert state == "interrupted" and 3 <= len(rec.done) < 30


def test_real_sample_workers_against_a_simulator() -> None:
    with simulator_in_thread(model_name="m", instant=True, mean_tokens=8) as sim:
        m = parse_manifest({
            "name": "t", "target": {"model": "m", "tokenizer": "tok"},
            "sampling": {"max_tokens": 16, "seed": 0}, "endpoints": [{"url": sim.url}],
            "sources": [{"name": "s", "adapter": "sharegpt", "path": "x.jsonl"}],
        })  # fmt: skip

        async def instant(_s: float) -> None:
            return None

        def factory(i: int, gen: int) -> SampleWorker:
            rows = lambda s, turns: [{"sample_id": s.id, "turn": t.turn,  # noqa: E731
                                      "completion_tokens": t.result.completion_tokens}
                                     for t in turns]  # fmt: skip
            config = config_for(m, concurrency=4)
            return SampleWorker(config, row_builder=rows,
                                retry=RetryPolicy.of(config.retry, sleep=instant))  # fmt: skip

        state, rec, _ = run_pool(factory, 30)
        assert state == "finished"
        assert sorted(rec.done) == sorted(s.id for s in samples(30))
        assert sim.stats()["received"] == 30


class NoEndpoint(Scripted):
    """A worker whose endpoints all refused: after ``ok`` samples, every sample is unsent."""

    def __init__(self, ok: int) -> None:
        super().__init__(delay_s=0.01)
        self.ok = ok

    async def process(self, sample: Any) -> SampleOutcome:
        self.seen.append(sample.id)
        await asyncio.sleep(self.delay_s)
        if len(self.seen) <= self.ok:
            return SampleOutcome(sample.id, sample.source, rows=[{"turn": 0}], slots=2)
        why = "no endpoint left: http://gw/v1: HTTP 403"
        return SampleOutcome(sample.id, sample.source, status="unsent", kind="no_endpoint_left",
                             message=why, slots=2)  # fmt: skip


def test_no_endpoint_left_stops_the_loop_and_fails_no_sample() -> None:
    pool = LocalWorkerPool(lambda i, g: NoEndpoint(ok=3))
    rec = Recorder()
    try:
        d = Dispatcher(pool, 1, prefetch=1)
        with pytest.raises(NoEndpointLeftError) as info:
            d.run(WorkQueue(samples(40)), rec)
    finally:
        pool.close()
    assert "http://gw/v1: HTTP 403" in str(info.value)
    assert len(rec.done) == 3 and rec.failures == [] and rec.lost == []
    assert isinstance(info.value, RunIncompleteError)


class SlowFirst(Scripted):
    """The first sample is an answer still streaming when the endpoint refused (done after a
    while); every other sample is unsent at once."""

    def __init__(self) -> None:
        super().__init__(delay_s=0.0, capacity=8)

    async def process(self, sample: Any) -> SampleOutcome:
        self.seen.append(sample.id)
        if len(self.seen) == 1:
            await asyncio.sleep(0.3)
            return SampleOutcome(sample.id, sample.source, rows=[{"turn": 0}], slots=8)
        await asyncio.sleep(0.01)
        return SampleOutcome(sample.id, sample.source, status="unsent", kind="no_endpoint_left",
                             message="no endpoint left", slots=8)  # fmt: skip


def drain(clock) -> Recorder:
    pool = LocalWorkerPool(lambda i, g: SlowFirst())
    rec = Recorder()
    try:
        d = Dispatcher(pool, 1, prefetch=1, clock=clock)
        with pytest.raises(NoEndpointLeftError):
            d.run(WorkQueue(samples(20)), rec)
    finally:
        pool.close()
    return rec


def test_what_the_workers_still_finish_is_kept_before_the_stop() -> None:
    rec = drain(lambda: 0.0)  # a clock that never moves: the drain waits for every answer
    assert len(rec.done) == 1 and rec.failures == []


def test_past_the_drain_time_what_is_in_flight_is_cancelled() -> None:
    ticks = iter(range(0, 10**6, 1000))  # every look at the clock: 1000 s later
    rec = drain(lambda: float(next(ticks)))
    assert rec.done == [] and rec.failures == []


class Holding(Recorder):
    """A recorder whose disk is full from the 5th answer until 6 ticks later: it holds as many
    answers as it may (regen.engine.diskfull), so no new sample may be fed meanwhile."""

    def __init__(self, queue: WorkQueue) -> None:
        super().__init__()
        self.queue = queue
        self.popped = 0
        self.held_ticks = 0
        self.fed_while_held: list[int] = []  #: samples taken from the queue, at each held look
        pop = queue.pop

        def counting_pop():
            self.popped += 1
            return pop()

        queue.pop = counting_pop  # type: ignore[method-assign]

    def holding(self) -> bool:
        held = len(self.done) >= 5 and self.held_ticks < 6
        if held:
            self.fed_while_held.append(self.popped)
        return held

    def tick(self, snapshots) -> None:
        super().tick(snapshots)
        if len(self.done) >= 5 and self.held_ticks < 6:
            self.held_ticks += 1


def test_a_recorder_holding_answers_stops_the_feed_not_the_loop() -> None:
    pool = LocalWorkerPool(lambda i, g: Scripted(delay_s=0.0))
    queue = WorkQueue(samples(40))
    rec = Holding(queue)
    try:
        state = Dispatcher(pool, 2, prefetch=1).run(queue, rec)
    finally:
        pool.close()
    assert state == "finished"  # the loop waited with samples queued instead of ending
    assert Counter(rec.done) == Counter(s.id for s in samples(40))
    assert rec.held_ticks == 6 and len(set(rec.fed_while_held)) == 1  # nothing fed meanwhile
    assert rec.fed_while_held[0] < 40
