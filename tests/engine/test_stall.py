"""The stall watch (regen.engine.stall) on its own: streams that stop, endpoints that hang."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import pytest

from regen.engine.stall import GAP_MULTIPLE, Beat, StallWatch
from regen.errors import StallError

A, B = "http://a/v1", "http://b/v1"


@dataclass
class Load:  # what the watch reads of a regen.client.metrics.ServerLoad
    at: float
    generation_tokens: float | None
    prompt_tokens: float | None = None


class Probe:
    def __init__(self, answer: bool | None) -> None:
        self.answer, self.asked = answer, 0

    async def __call__(self, url: str) -> bool:
        self.asked += 1
        if self.answer is None:  # a hung /health_generate: never answers
            await asyncio.sleep(3600)
        return bool(self.answer)


def make(probe: Probe, hung: list[tuple[str, str]], timeout_s: float | None = 0.3) -> StallWatch:
    def on_hung(url: str, why: str) -> bool:
        hung.append((url, why))
        return True

    return StallWatch([A, B], timeout_s=timeout_s, min_s=0.3, probe=probe, on_hung=on_hung)


async def stream(watch: StallWatch, url: str, pieces: int, *, gap_s: float = 0.0) -> int:
    """A request that receives ``pieces`` pieces, then nothing (hangs) unless pieces < 0."""
    async with watch.watch(url) as beat:
        for _ in range(max(0, pieces)):
            beat.n += 1
            await asyncio.sleep(gap_s)
        if pieces >= 0:
            await asyncio.sleep(3600)
        return beat.n


async def run_with(watch: StallWatch, *coros):
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    try:
        return await asyncio.wait_for(asyncio.gather(*coros, return_exceptions=True), 30)
    finally:
        stop.set()
        await task
        await watch.aclose()


@contextlib.asynccontextmanager
async def watching(watch: StallWatch, *coros):
    """The requests as tasks while the watch runs; what is left is cancelled at the end."""
    tasks = [asyncio.create_task(c) for c in coros]
    stop = asyncio.Event()
    runner = asyncio.create_task(watch.run(stop))
    try:
        yield tasks
    finally:
        stop.set()
        await runner
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await watch.aclose()


def test_a_stream_that_stops_is_cancelled_as_a_stall_and_a_failed_probe_takes_its_endpoint_out():
    hung: list[tuple[str, str]] = []
    probe = Probe(False)
    watch = make(probe, hung)

    async def main():
        # one stream sends 3 pieces then stops; one request on the same server never starts
        return await run_with(watch, stream(watch, A, 3), stream(watch, A, 0))

    stalled, queued = asyncio.run(main())
    assert isinstance(stalled, StallError) and "sent nothing" in str(stalled)
    assert isinstance(queued, StallError) and "stalled" in str(queued)  # cancelled with it
    assert [u for u, _ in hung] == [A] and "health probe failed" in hung[0][1]
    assert watch.stalls == 2 and probe.asked == 1


def test_a_probe_that_hangs_counts_as_failed_within_the_confirm_time():
    hung: list[tuple[str, str]] = []
    watch = make(Probe(None), hung)

    async def told() -> None:  # the check runs on after the stream's cancel
        for _ in range(200):
            if hung:
                return
            await asyncio.sleep(0.05)

    err, _ = asyncio.run(run_with(watch, stream(watch, A, 2), told()))
    assert isinstance(err, StallError)
    assert [u for u, _ in hung] == [A]


def test_a_stream_stall_on_a_generating_server_cancels_that_stream_only():
    hung: list[tuple[str, str]] = []
    watch = make(Probe(True), hung)

    async def main():
        slow = asyncio.create_task(stream(watch, A, 200, gap_s=0.02))  # keeps sending (4 s)
        res = await run_with(watch, stream(watch, A, 1))
        slow.cancel()
        return res

    (err,) = asyncio.run(main())
    assert isinstance(err, StallError)
    assert hung == []  # the probe says it generates: busy, not hung


def test_an_endpoint_whose_requests_never_start_is_checked_and_left_when_hung():
    hung: list[tuple[str, str]] = []
    watch = make(Probe(False), hung)
    errs = asyncio.run(run_with(watch, stream(watch, B, 0), stream(watch, B, 0)))
    assert all(isinstance(e, StallError) for e in errs)
    assert [u for u, _ in hung] == [B] and "no request made progress" in hung[0][1]


def test_queued_requests_on_a_busy_server_are_left_alone():
    """No byte yet, but the probe says the server generates: a queue, not a hang."""
    hung: list[tuple[str, str]] = []
    probe = Probe(True)
    watch = make(probe, hung)

    async def main():
        async with watching(watch, stream(watch, A, 0)) as (waiting,):
            await asyncio.sleep(1.5)  # five stall timeouts
            assert not waiting.done()

    asyncio.run(main())
    assert hung == [] and probe.asked >= 2 and watch.stalls == 0


FLAT = (100.0, 100.0, 100.0)


@pytest.mark.parametrize(
    ("tokens", "prompt", "expect_hung"),
    [(FLAT, FLAT, True), ((100.0, 150.0, 200.0), FLAT, False), (FLAT, (0.0, 5e3, 9e3), False)],
)
def test_the_servers_metrics_decide_before_any_probe(tokens, prompt, expect_hung):
    """Flat token counters over two readings: hung, no probe asked; generated tokens or
    prefilled ones (a long prompt) that moved since the requests stopped: busy."""
    hung: list[tuple[str, str]] = []
    probe = Probe(True)
    watch = make(probe, hung)

    async def main():
        async with watching(watch, stream(watch, A, 1)):
            loop = asyncio.get_running_loop()
            for t, p in zip(tokens, prompt, strict=True):
                await asyncio.sleep(0.15)
                watch.read_metrics(A, Load(at=loop.time(), generation_tokens=t, prompt_tokens=p))
            # a hang is waited for (the watch's ticks come late on a busy machine), at most 10 s
            deadline = loop.time() + (10.0 if expect_hung else 0.5)
            while not hung and loop.time() < deadline:
                await asyncio.sleep(0.05)

    asyncio.run(main())
    assert bool(hung) is expect_hung
    if expect_hung:
        assert "no generation" in hung[0][1] and probe.asked == 0


def test_the_derived_timeout_follows_the_longest_gap_and_never_goes_below_the_floor():
    """A stream whose pauses grow (0.2 s, under the 0.3 s floor, then 0.5 s), looked at on a
    clock of the test's own (the watch's ticks, at the times the test chooses): once the first
    gap is seen the timeout is 4 times it, so the longer pause is not a stall."""
    now = [0.0]
    watch = StallWatch([A, B], timeout_s=None, min_s=0.3, probe=Probe(True),
                       on_hung=lambda url, why: True, clock=lambda: now[0])  # fmt: skip
    assert watch.timeout_s(A) == 0.3  # nothing seen: the floor

    async def main() -> Beat:
        async with watch.watch(A) as beat:
            for t, pieces in ((0.0, 1), (0.2, 2), (0.4, 3), (0.7, 3), (0.9, 4), (0.95, 5)):
                now[0], beat.n = t, pieces
                watch.scan()
                assert beat.stalled is None, (t, beat.stalled)  # at 0.7 s: 0.3 s of silence
        return beat

    asyncio.run(main())
    assert [round(g, 3) for _, g in watch._eps[A].gaps] == [0.2, 0.2, 0.5, 0.05]
    assert watch.timeout_s(A) == pytest.approx(GAP_MULTIPLE * 0.5)
    assert watch.timeout_s(B) == 0.3
    assert watch.stalls == 0
