"""The adaptive in-flight limit's decisions on synthetic signals (the clock is the test's)."""

from __future__ import annotations

import asyncio
import contextlib

from _worker_config import config_for, resolved

from regen.engine.adaptive import (
    DEFAULT_CONCURRENCY,
    AdaptiveLimit,
    AdaptiveSettings,
    describe_limit,
    room,
    split,
    target_queue,
)
from regen.engine.lanes import Slots, worker_slots
from regen.engine.worker import SampleWorker
from regen.manifest import parse_manifest

S = AdaptiveSettings(window_s=1.0, min_requests=4)


def window(c: AdaptiveLimit, t: float, *, tokens: int, ttft: float, n: int = 8,
           demand: bool = True) -> int | None:  # fmt: skip
    """n completions spread over one second from ``t``, then the window closes at t + 1."""
    for i in range(n):
        c.record(t + i / n, tokens // n, ttft)
    if demand:
        c.note_demand()
    return c.update(t + 1.0)


def test_no_decision_before_the_window_is_full() -> None:
    c = AdaptiveLimit(start=64, maximum=128, settings=S)
    c.record(0.0, 100, 0.01)
    assert c.update(0.5) is None and c.update(5.0) is None  # 1 completion < min_requests
    assert c.current == 64 and not c.history


def test_grows_while_no_queueing_and_work_waits() -> None:
    c = AdaptiveLimit(start=64, maximum=128, settings=S)
    limits = [window(c, float(t), tokens=20_000 + 100 * t, ttft=0.004) for t in range(5)]
    assert limits == [67, 69, 72, 75, 78]  # step = max(1, 0.04 x limit), shown rounded
    assert [d.reason for d in c.history] == ["grow"] * 5


def test_holds_without_demand() -> None:
    c = AdaptiveLimit(start=64, maximum=128, settings=S)
    assert window(c, 0.0, tokens=20_000, ttft=0.004, demand=False) is None
    assert c.history[-1].reason == "hold" and c.current == 64


def test_queueing_without_gain_steps_down_but_not_below_the_start() -> None:
    c = AdaptiveLimit(start=64, maximum=128, settings=S)
    for t in range(3):
        window(c, float(t), tokens=20_000, ttft=0.004)  # grows to 72, baseline 4 ms
    assert c.current == 72
    window(c, 3.0, tokens=20_000, ttft=0.2)  # queued: TTFT 0.2 > 2 x 0.004 + 0.05, no gain
    assert c.history[-1].reason == "queueing" and c.current == 69
    for t in range(4, 10):
        window(c, float(t), tokens=20_000, ttft=0.2)
    assert c.current == 64  # the server's own slots are the floor


def test_queueing_that_still_buys_throughput_keeps_growing() -> None:
    c = AdaptiveLimit(start=64, maximum=128, settings=S)
    window(c, 0.0, tokens=10_000, ttft=0.004)
    assert window(c, 1.0, tokens=15_000, ttft=0.3) is not None
    assert c.history[-1].reason == "grow"


def test_429_cuts_at_once_and_lowers_the_floor() -> None:
    c = AdaptiveLimit(start=64, maximum=128, settings=S)
    c.record(0.0, 100, 0.004)
    c.record_throttled(0.1)
    assert c.update(0.2) == 45  # 64 x 0.7, without waiting for the window
    assert c.history[-1].reason == "throttled" and c.floor == c.limit
    for t in range(1, 4):
        window(c, float(t), tokens=20_000, ttft=0.004)
    assert c.current > 45  # grows back while the server keeps up


def test_503_cuts_to_the_servers_slots_and_429_below_them() -> None:
    """A 503 says the server's queue or memory is full: at its own batch slots the client
    cannot be the cause, so the cut stops there; a gateway's 429 asks for less, full stop."""
    c = AdaptiveLimit(start=72, maximum=144, settings=S, slots=64)
    for t in range(5):  # an overload in every window
        c.record(float(t), 100, 0.004)
        c.record_throttled(t + 0.1)
        c.update(t + 0.2)
    assert c.current == 64 and [d.reason for d in c.history] == ["throttled"] * 5
    c.record(10.0, 100, 0.004)
    c.record_throttled(10.1, rate_limited=True)
    assert c.update(10.2) == 45  # 64 x 0.7
    c.record_throttled(11.1)  # a 503 never lifts a limit already below the slots
    assert c.update(11.2) is None and c.current == 45
    blind = AdaptiveLimit(start=72, maximum=144, settings=S)  # no slots reported
    blind.record_throttled(0.1)
    assert blind.update(0.2) == 50  # 72 x 0.7


def test_maximum_caps_growth() -> None:
    c = AdaptiveLimit(start=4, maximum=6, settings=S)
    for t in range(10):
        window(c, float(t), tokens=1000 * (t + 1), ttft=0.004)
    assert c.current == 6


def test_split_over_workers() -> None:
    assert [split(64, 3, i) for i in range(3)] == [22, 21, 21]
    assert sum(split(65, 4, i) for i in range(4)) == 65
    assert split(1, 4, 3) == 1


def test_slots_resize_wakes_waiters_in_order() -> None:
    async def main() -> list[int]:
        slots = Slots(1)
        order: list[int] = []
        assert await slots.acquire() is False

        async def take(i: int) -> None:
            await slots.acquire()
            order.append(i)

        tasks = [asyncio.create_task(take(i)) for i in range(3)]
        await asyncio.sleep(0)
        assert slots.waiting == 3 and order == []
        slots.resize(3)  # two more slots: the first two waiters get them
        await asyncio.sleep(0)
        assert order == [0, 1] and slots.used == 3
        slots.release()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(main()) == [0, 1, 2]


def test_slots_waiter_cancelled_after_its_future_was_dropped() -> None:
    async def main() -> tuple[int, int]:
        slots = Slots(1)
        await slots.acquire()
        waiter = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)
        waiter.cancel()  # its future is cancelled now, the task resumes later
        slots.release()  # _wake drops the cancelled future before the task runs
        with contextlib.suppress(asyncio.CancelledError):
            await waiter  # CancelledError, not ValueError from the deque
        return slots.used, slots.waiting

    assert asyncio.run(main()) == (0, 0)


# ---- the user's limit is a limit ---------------------------------------------------------


def info(url: str, slots: int | None):
    return resolved(url, slots=slots, slots_source="internal_states" if slots else None)


def sample_worker(endpoints, concurrency, clock):
    source = {"name": "s", "adapter": "sharegpt", "path": "x.jsonl"}
    m = parse_manifest({"name": "t", "target": {"model": "m", "tokenizer": "tok"},
                        "endpoints": [{"url": e.url} for e in endpoints],
                        "sources": [source]})  # fmt: skip
    return SampleWorker(config_for(m, endpoints, concurrency=concurrency),
                        row_builder=lambda s, t: [], probe=lambda url: None,
                        clock=clock)  # fmt: skip


def grow(w, clock, windows: int = 200) -> None:
    """Windows of full demand, rising throughput and no queueing: every limit wants to grow."""
    for n in range(windows):
        for url, lane in w.lanes.items():
            ctl = lane.limit
            ctl.note_demand()
            for _ in range(8):
                ctl.record(clock.t, 100 * (n + 1), 0.01)
            clock.t += 2.5
            w._adapt(url)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_concurrency_caps_a_worker_below_the_servers_slots() -> None:
    clock = FakeClock()
    w = sample_worker([info("http://a/v1", 64)], 4, clock)
    assert w.slots.capacity == 4 and w.lanes["http://a/v1"].limit.maximum == 4
    grow(w, clock)
    assert w.slots.capacity == 4 and w.router.limit("http://a/v1") <= 4


def test_concurrency_is_one_bound_over_all_endpoints() -> None:
    clock = FakeClock()
    w = sample_worker([info("http://a/v1", 64), info("http://b/v1", None)], 6, clock)
    assert w.slots.capacity == 6
    grow(w, clock)
    assert w.slots.capacity == 6
    assert all(lane.limit.maximum <= 6 for lane in w.lanes.values())


def test_without_a_user_limit_the_servers_slots_decide_and_may_grow() -> None:
    clock = FakeClock()
    w = sample_worker([info("http://a/v1", 64)], None, clock)
    assert w.slots.capacity == 72  # 64 + 1/8
    grow(w, clock)
    assert 72 < w.slots.capacity <= w.lanes["http://a/v1"].limit.maximum


def test_a_user_limit_above_the_slots_does_not_raise_the_start() -> None:
    assert worker_slots([info("http://a/v1", 16)], 500) == 18  # 16 + 1/8, under the cap 500
    assert worker_slots([info("http://a/v1", None)], None) == DEFAULT_CONCURRENCY
    assert worker_slots([info("http://a/v1", None)], 3) == 3


def test_the_start_up_line_says_which_limit_won() -> None:
    """Issue 31, item 9: one flat phrase (no brackets in brackets)."""
    assert describe_limit(4, 72, True) == (
        "capped by engine.concurrency / --concurrency = 4, below the servers' batch slots + "
        "1/8 = 72"
    )
    assert describe_limit(500, 18, True) == (
        "set by the servers' batch slots + 1/8 = 18, under the cap engine.concurrency / "
        "--concurrency = 500"
    )
    assert describe_limit(None, 72, True) == (
        "set by the servers' batch slots + 1/8 = 72; engine.concurrency / --concurrency would "
        "cap it"
    )
    assert describe_limit(None, 64, False).startswith(
        "set by the default 64, as no server reports its batch slots"
    )
    for phrase in (describe_limit(c, 36, r) for c in (None, 8, 99) for r in (True, False)):
        assert "(" not in phrase


# ---- following the server's own queue (its /metrics readings) -------------------------------


def test_a_long_queue_lowers_the_limit_by_this_workers_share_of_the_excess() -> None:
    c = AdaptiveLimit(start=18, maximum=36, settings=S, slots=16)
    # the server's batch is full and it queues 10 (others' too), aiming at 2: 8 too many;
    # this worker holds half the slots
    assert c.follow(0.0, room=room(10, 16, 16, 2), in_flight=18, share=0.5) == 14
    assert c.history[-1].reason == "server" and c.server_led
    # requests still draining towards 14: the excess they make is already counted
    assert c.follow(1.0, room=room(6, 16, 16, 2), in_flight=18, share=0.5) is None
    assert c.current == 14


def test_a_quarter_share_still_moves_a_limit_that_rounds_up() -> None:
    # one of four workers: its limit 5.5 shows as 6, all 6 in flight, the server 2 over target
    c = AdaptiveLimit(start=5, maximum=20, settings=S, slots=4)
    c.limit = 5.5
    assert c.current == 6
    assert c.follow(0.0, room=-2, in_flight=6, share=0.25) == 5  # 5.5 - 0.25 x (2 - 0.5)
    # what it sheds drains: at the next reading those requests are room already made
    assert c.follow(1.0, room=-1, in_flight=6, share=0.25) is None


def test_more_room_raises_the_limit_only_while_it_holds_work_back() -> None:
    c = AdaptiveLimit(start=10, maximum=20, settings=S, slots=16)
    # 6 in flight under a limit of 10 on a full batch: the limit comes down to 6 + 2 queued
    assert c.follow(0.0, room=room(0, 16, 16, 2), in_flight=6, share=1.0) == 8
    assert c.follow(1.0, room=room(0, 16, 16, 2), in_flight=8, share=1.0) == 10
    assert c.follow(2.0, room=room(0, 16, 16, 2), in_flight=6, share=1.0, waiting=True) == 12
    assert c.follow(3.0, room=room(2, 16, 16, 2), in_flight=12, share=1.0) is None  # on target
    # free batch slots are room too: 10 running of 16, nothing queued
    assert c.follow(4.0, room=room(0, 10, 16, 2), in_flight=12, share=1.0) == 20  # the maximum


def test_a_server_busy_with_others_lowers_an_unused_limit_before_the_first_request() -> None:
    # the first reading, nothing sent yet: another client runs 8 of the 16 slots
    c = AdaptiveLimit(start=18, maximum=36, settings=S, slots=16)
    assert c.follow(0.0, room=room(0, 8, 16, 2), in_flight=0, share=1.0) == 10
    # an idle server leaves the starting limit as it is (18 <= 0 + 18)
    idle = AdaptiveLimit(start=18, maximum=36, settings=S, slots=16)
    assert idle.follow(0.0, room=room(0, 0, 16, 2), in_flight=0, share=1.0) is None


def test_growth_is_paced_by_what_the_servers_queue_takes_at_once() -> None:
    # an idle 16-slot server queueing at most 6: the start's limit of 18 comes down to 6
    c = AdaptiveLimit(start=18, maximum=36, settings=S, slots=16)
    assert c.follow(0.0, room=room(0, 0, 16, 2), in_flight=0, share=1.0, queue_room=6) == 6
    assert c.paced
    # the 6 were admitted (running 6, nothing queued): 6 more at once, then the rest
    assert c.follow(0.1, room=room(0, 6, 16, 2), in_flight=6, share=1.0, queue_room=6) == 12
    assert c.paced
    assert c.follow(0.2, room=room(0, 12, 16, 2), in_flight=12, share=1.0, queue_room=6) == 18
    assert not c.paced
    # still queued at the next reading: nothing more is sent until the server admits them
    d = AdaptiveLimit(start=18, maximum=36, settings=S, slots=16)
    d.follow(0.0, room=room(0, 0, 16, 2), in_flight=0, share=1.0, queue_room=6)
    assert d.follow(0.1, room=room(6, 0, 16, 2), in_flight=6, share=1.0, queue_room=0) is None
    assert d.paced and d.current == 6
    # a worker with half the slots takes half of what the queue takes
    h = AdaptiveLimit(start=9, maximum=18, settings=S, slots=8)
    assert h.follow(0.0, room=room(0, 0, 16, 2), in_flight=0, share=0.5, queue_room=6) == 3


def test_without_the_servers_slots_a_short_queue_leaves_an_unused_limit_alone() -> None:
    # vLLM reports no batch slots: a queue of 0 against a target of 2 says nothing of how many
    # more it would run, so the starting limit of 12 stays (it is cut only by a long queue)
    c = AdaptiveLimit(start=12, maximum=12, settings=S)
    assert c.follow(0.0, room=room(0, None, None, 2), in_flight=0, share=1.0,
                    free_known=False) is None  # fmt: skip
    assert c.follow(1.0, room=room(6, None, None, 2), in_flight=12, share=1.0,
                    free_known=False) == 8  # fmt: skip


def test_following_stays_within_one_and_the_maximum() -> None:
    c = AdaptiveLimit(start=8, maximum=9, settings=S)
    assert c.follow(0.0, room=50, in_flight=8, share=1.0) == 9  # the hard cap
    assert c.follow(1.0, room=room(500, None, None, 1), in_flight=9, share=1.0) == 1  # never 0


def test_while_the_server_leads_the_window_only_cuts() -> None:
    c = AdaptiveLimit(start=16, maximum=32, settings=S, slots=16)
    c.follow(0.0, room=0, in_flight=16, share=1.0)
    assert window(c, 0.0, tokens=20_000, ttft=0.004) is None  # no "grow" on demand
    assert c.history[-1].reason == "hold" and c.current == 16
    c.record_throttled(1.5, rate_limited=True)  # a 429 still cuts
    assert c.update(1.6) == 11
    c.unfollow()  # the reading went stale: the window decides again
    assert window(c, 2.0, tokens=20_000, ttft=0.004) == 12


def test_the_target_queue_and_the_room_a_server_has() -> None:
    assert target_queue(16, 99) == 2 and target_queue(4, 99) == 1 and target_queue(None, 64) == 8
    # 9 queued on a server running 4 of 8, aiming at a queue of 1: 4 too many
    assert room(9, 4, 8, 1) == -4
    assert room(0, 8, 8, 1) == 1 and room(3, 2, 8, 1) == 4
    # without the slots or the running count: the target less the queue
    assert room(3, None, 8, 1) == -2 and room(3, 2, None, 1) == -2
