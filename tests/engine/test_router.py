"""EndpointRouter: least outstanding (weighted), affinity, limits, health, probes. Fake clock."""

from __future__ import annotations

import asyncio

import pytest
from _scripted import Reply, ScriptedServer

from regen.client import EndpointInfo, status_error
from regen.core.errors import (
    ConnectError,
    ContextLengthError,
    NoEndpointLeftError,
    RateLimitedError,
    ServerError,
)
from regen.engine.router import (
    DOWN,
    HALF_OPEN,
    OVERLOAD_COOL_MAX_S,
    OVERLOAD_COOL_S,
    REFUSED,
    UP,
    EndpointRouter,
    http_probe,
)
from regen.manifest import Endpoint

A, B, C = "http://a:1/v1", "http://b:1/v1", "http://c:1/v1"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def healthy(r: EndpointRouter) -> list[str]:
    """The endpoints in rotation, in the router's order."""
    return [u for u in r.urls if r.state(u) == UP]


def router(*eps, clock=None, **kw):
    return EndpointRouter(list(eps or (A, B)), clock=clock or Clock(), **kw)


def test_least_outstanding_spreads_new_samples():
    r = router(A, B, C)
    urls = [r.try_acquire(f"s{i}").url for i in range(6)]
    assert urls == [A, B, C, A, B, C]
    assert r.snapshot()[A]["in_flight"] == 2


def test_release_makes_an_endpoint_the_least_loaded_again():
    r = router(A, B)
    la, lb, la2 = r.try_acquire("s0"), r.try_acquire("s1"), r.try_acquire("s2")
    assert (la.url, lb.url, la2.url) == (A, B, A)
    r.release(lb)
    assert r.try_acquire("s3").url == B  # B has 0 in flight, A has 2


def test_weights_shift_traffic():
    r = EndpointRouter([Endpoint(url=A, weight=3.0), Endpoint(url=B, weight=1.0)], clock=Clock())
    urls = [r.try_acquire(f"s{i}").url for i in range(8)]
    assert urls.count(A) == 6 and urls.count(B) == 2


def test_a_server_busy_with_other_clients_gets_less():
    from regen.client.server_load import ServerLoad

    r = router(A, B)
    held = r.try_acquire("mine")  # one of ours on A
    assert held.url == A
    # B's server says 4 running + 2 queued, none of them ours; A's says only ours
    r.set_server_load(A, ServerLoad(at=0.0, running=1, queued=0))
    r.set_server_load(B, ServerLoad(at=0.0, running=4, queued=2, kv_usage=0.5))
    assert (r.others(A), r.others(B)) == (0, 6)
    urls = [r.try_acquire(f"s{i}").url for i in range(8)]
    assert urls == [A] * 6 + [B, A]  # B is chosen once A holds as much as B's others
    assert r.snapshot()[B]["server"]["queued"] == 2 and r.snapshot()[B]["server"]["kv_usage"]
    r.set_server_load(B, None)  # stale: regen's own count again
    assert r.others(B) == 0 and r.snapshot()[B]["server"] is None


def test_affinity_keeps_a_sample_on_its_endpoint():
    r = router(A, B)
    first = r.try_acquire("conv")
    r.release(first)
    others = [r.try_acquire(f"x{i}") for i in range(3)]  # load A more than B if same
    assert first.url == A and [o.url for o in others] == [A, B, A]
    again = r.try_acquire("conv")
    assert again.url == A  # A is busier, but the prefix cache is there
    r.forget("conv")
    assert r.affinity("conv") is None


def test_in_flight_limit_from_max_running_requests_and_knob():
    infos = [
        EndpointInfo(url=A, weight=1.0, models=("m",), max_running_requests=2),
        EndpointInfo(url=B, weight=1.0, models=("m",), max_running_requests=1),
    ]
    r = EndpointRouter(infos, clock=Clock())
    leases = [r.try_acquire(f"s{i}") for i in range(3)]
    assert [lease.url for lease in leases] == [A, B, A]
    assert r.try_acquire("s3") is None  # all full
    r.set_limit(B, 2)
    assert r.try_acquire("s3").url == B
    assert (r.limit(A), r.limit(B)) == (2, 2)
    with pytest.raises(ValueError):
        r.set_limit(A, 0)


def test_affine_endpoint_full_means_wait_not_move():
    r = EndpointRouter([Endpoint(url=A), Endpoint(url=B)], clock=Clock())
    r.set_limit(A, 1)
    r.set_limit(B, 5)
    first = r.try_acquire("conv")
    assert first.url == A
    assert r.try_acquire("conv") is None  # A full: wait for it, B has no cache for this sample


def test_failure_threshold_takes_endpoint_out_and_affinity_moves():
    clock = Clock()
    r = router(A, B, clock=clock, failure_threshold=3, probe_interval_s=10.0)
    lease = r.try_acquire("conv")
    assert lease.url == A
    r.release(lease, ConnectError("refused"))
    for _ in range(2):
        r.release(r.try_acquire("conv"), ServerError("500"))
    assert r.state(A) == DOWN
    assert healthy(r) == [B]
    nxt = r.try_acquire("conv")
    assert nxt.url == B and r.affinity("conv") == B
    snap = r.snapshot()[A]
    assert snap["state"] == "down" and snap["failures"] == 3
    assert snap["consecutive_failures"] == 3 and snap["last_error"].startswith("ServerError")


def test_success_resets_the_consecutive_count():
    r = router(A, clock=Clock(), failure_threshold=2)
    r.release(r.try_acquire("s"), ConnectError("x"))
    r.release(r.try_acquire("s"))
    r.release(r.try_acquire("s"), ConnectError("x"))
    assert r.state(A) == UP


def test_429_and_permanent_errors_do_not_count_against_health():
    r = router(A, clock=Clock(), failure_threshold=1)
    r.release(r.try_acquire("s"), RateLimitedError("slow", retry_after=1))
    r.release(r.try_acquire("s"), ContextLengthError("too long", status=400))
    assert r.state(A) == UP
    snap = r.snapshot()[A]
    assert (snap["throttled"], snap["ok"], snap["failures"]) == (1, 1, 0)


def _overloaded() -> Exception:
    """What SGLang's overload (queue full, timeout abort, retraction) becomes in regen."""
    return status_error(503, "The request queue is full.", endpoint=A)


def test_503_overload_never_takes_a_busy_endpoint_out_of_rotation():
    r = router(A, clock=Clock(), failure_threshold=3)
    for _ in range(20):
        r.release(r.try_acquire("s"), _overloaded())
    assert r.state(A) == UP
    snap = r.snapshot()[A]
    assert (snap["throttled"], snap["failures"], snap["consecutive_failures"]) == (20, 0, 0)
    assert snap["consecutive_overloads"] == 20


def test_an_overload_streak_asks_the_probe_and_only_a_failed_probe_takes_it_out():
    answers = {A: True}
    probed = []

    async def probe(url: str) -> bool:
        probed.append(url)
        return answers[url]

    clock = Clock()
    r = router(A, B, clock=clock, failure_threshold=3, probe=probe)

    async def streak() -> None:
        for _ in range(3):
            clock.t += OVERLOAD_COOL_MAX_S  # past each cool-down: A is the least loaded again
            r.release(r.try_acquire("s"), _overloaded())
        await asyncio.sleep(0)  # the background health check runs
        await asyncio.sleep(0)

    async def go():
        await streak()
        assert probed == [A] and r.state(A) == UP  # busy, not sick: the streak starts over
        assert r.snapshot()[A]["consecutive_overloads"] == 0
        answers[A] = False
        await streak()
        assert probed == [A, A] and r.state(A) == DOWN

    asyncio.run(go())


def test_an_overloaded_endpoint_cools_while_another_is_up_then_takes_work_again():
    """A server refusing everything holds the fewest requests: without the cool-down it
    would draw every new one (least loaded)."""
    clock = Clock()
    r = router(A, B, clock=clock)
    r.release(r.try_acquire("s0"), _overloaded())
    assert r.in_flight(A) == 0 and r.in_flight(B) == 0
    held = [r.try_acquire(f"n{i}") for i in range(4)]
    assert [h.url for h in held] == [B] * 4  # A holds nothing, yet it gets nothing new
    assert r._next_change_in() == pytest.approx(OVERLOAD_COOL_S)  # a waiter wakes then
    clock.t += OVERLOAD_COOL_S
    assert r.try_acquire("late").url == A
    # each overload in a row doubles the cool-down, up to its cap; a success ends it
    for n in range(1, 8):
        clock.t += OVERLOAD_COOL_MAX_S
        r.release(r.try_acquire("x"), _overloaded())
        cool = min(OVERLOAD_COOL_MAX_S, OVERLOAD_COOL_S * 2**n)
        assert r._next_change_in() == pytest.approx(cool)
    clock.t += OVERLOAD_COOL_MAX_S
    r.release(r.try_acquire("x"))
    assert r.snapshot()[A]["consecutive_overloads"] == 0
    assert r.try_acquire("y").url == A


def test_a_sample_bound_to_a_cooling_endpoint_goes_elsewhere_and_one_up_endpoint_still_serves():
    clock = Clock()
    r = router(A, B, clock=clock)
    first = r.try_acquire("s")
    assert first.url == A
    r.release(first)  # turn one done on A: the sample is bound to it
    r.release(r.try_acquire("other"), _overloaded())  # then A refuses another sample
    assert r.try_acquire("s").url == B  # turn two does not wait out A's refusal
    # with B out of rotation, the cooling endpoint is the only one: it still serves
    r2 = router(A, B, clock=clock, failure_threshold=1)
    r2.release(r2.try_acquire("a"), _overloaded())
    lease_b = r2.try_acquire("b")
    assert lease_b.url == B
    r2.release(lease_b, ConnectionError("refused"))
    assert r2.state(B) == DOWN
    assert r2.try_acquire("c").url == A


def test_a_refused_samples_retry_avoids_that_endpoint():
    clock = Clock()
    r = router(A, B, clock=clock)
    lease = r.try_acquire("s")
    r.release(lease, _overloaded())
    r.avoid("s", lease.url)  # what the worker does with an OverloadedError
    clock.t += OVERLOAD_COOL_MAX_S  # A's cool-down is over
    assert r.try_acquire("pad").url == A  # A takes new samples again ...
    assert r.try_acquire("pad2").url == B  # 1 and 1: a tie goes to A, the first
    assert r.try_acquire("s").url == B  # ... but not the sample it refused
    assert r.try_acquire("fresh").url == A


def test_http_probe_asks_health_generate_then_models_when_it_does_not_exist():
    ok = ScriptedServer(Reply(200, b""))
    with ok.running():
        assert asyncio.run(http_probe(ok.url)) is True
    assert [q.path for q in ok.requests] == ["/health_generate"]
    sick = ScriptedServer(Reply(503, b""))
    with sick.running():
        assert asyncio.run(http_probe(sick.url)) is False
    assert [q.path for q in sick.requests] == ["/health_generate"]
    other = ScriptedServer(Reply(404, b""), Reply(200, b"{}"))
    with other.running():
        key = {"Authorization": "Bearer k"}
        assert asyncio.run(http_probe(other.url, headers=key)) is True
    assert [q.path for q in other.requests] == ["/health_generate", "/v1/models"]
    assert "Authorization" not in other.requests[0].headers  # /health* is open in SGLang
    assert other.requests[1].headers["Authorization"] == "Bearer k"


def test_half_open_trial_brings_it_back_after_the_interval():
    clock = Clock()
    r = router(A, B, clock=clock, failure_threshold=1, probe_interval_s=15.0)
    r.release(r.try_acquire("s0"), ConnectError("down"))
    assert r.state(A) == DOWN
    clock.t += 14.9
    assert r.try_acquire("s1").url == B
    clock.t += 0.2
    assert r.state(A) == HALF_OPEN
    trial = r.try_acquire("s2")
    assert trial.url == A and trial.trial
    assert r.try_acquire("s3").url == B  # one trial at a time
    r.release(trial, ConnectError("still down"))
    assert r.state(A) == DOWN
    clock.t += 15.0
    trial = r.try_acquire("s4")
    assert trial.url == A and trial.trial
    r.release(trial)
    assert r.state(A) == UP and healthy(r) == [A, B]


def test_probe_brings_it_back():
    clock = Clock()
    answers = {A: False}
    probed = []

    async def probe(url: str) -> bool:
        probed.append(url)
        return answers[url]

    r = router(A, B, clock=clock, failure_threshold=1, probe_interval_s=5.0, probe=probe)

    async def go():
        r.release(r.try_acquire("s"), ConnectError("down"))
        assert await r.probe_once() == []  # not due yet
        clock.t += 5.0
        assert r.state(A) == DOWN  # with a probe there is no half-open trial
        assert await r.probe_once() == []
        clock.t += 5.0
        answers[A] = True
        assert await r.probe_once() == [A]

    asyncio.run(go())
    assert probed == [A, A]
    assert r.state(A) == UP


def test_run_probes_loop_is_bounded_by_stop():
    clock = Clock()
    r = router(A, clock=clock, failure_threshold=1, probe_interval_s=1.0, probe=None)
    ticks = []

    async def go():
        stop = asyncio.Event()

        async def sleep(s: float) -> None:
            ticks.append(s)
            if len(ticks) == 3:
                stop.set()

        await r.run_probes(stop, sleep=sleep)

    asyncio.run(go())
    assert ticks == [1.0, 1.0, 1.0]


def test_acquire_waits_for_a_release():
    r = EndpointRouter([Endpoint(url=A)], clock=Clock())
    r.set_limit(A, 1)

    async def go():
        held = await r.acquire("s0")
        waiter = asyncio.create_task(r.acquire("s1"))
        await asyncio.sleep(0)
        assert not waiter.done()
        r.release(held)
        got = await asyncio.wait_for(waiter, timeout=5)
        return got

    assert asyncio.run(go()).url == A


def test_lease_context_manager_records_outcomes():
    r = router(A, clock=Clock(), failure_threshold=5)

    async def go():
        async with r.lease("s0") as lease:
            assert r.in_flight(lease.url) == 1
        with pytest.raises(ServerError):
            async with r.lease("s1"):
                raise ServerError("boom")

    asyncio.run(go())
    snap = r.snapshot()[A]
    assert (snap["in_flight"], snap["ok"], snap["failures"], snap["requests"]) == (0, 1, 1, 2)


def test_latency_stats_and_the_health_settings():
    clock = Clock()
    r = EndpointRouter([A], failure_threshold=2, probe_interval_s=3.0, clock=clock)
    assert (r.failure_threshold, r.probe_interval_s) == (2, 3.0)
    lease = r.try_acquire("s")
    clock.t += 2.0
    r.release(lease)
    r.release(r.try_acquire("s"), latency_s=4.0)
    snap = r.snapshot()[A]
    assert snap["latency_avg_s"] == 3.0
    assert snap["latency_ewma_s"] == pytest.approx(0.8 * 2.0 + 0.2 * 4.0)


# ---- endpoint-wide faults: out at once, for the session ------------------------------------


def refusal(url: str, status: int = 403) -> Exception:
    return status_error(status, "blocked by policy", endpoint=url)


def test_a_refusal_takes_the_endpoint_out_at_once_with_one_line(caplog):
    r = router(A, B)
    lease = r.try_acquire("s0")
    with caplog.at_level("WARNING", logger="regen.engine.router"):
        r.release(lease, refusal(A))
    assert r.state(A) == REFUSED and healthy(r) == [B]
    lines = [rec.getMessage() for rec in caplog.records]
    assert len(lines) == 1
    assert A in lines[0] and "HTTP 403" in lines[0] and "blocked by policy" in lines[0]
    assert "fix:" in lines[0]
    assert r.try_acquire("s0").url == B  # the sample is rebound elsewhere
    assert r.snapshot()[A]["refusal"].startswith(f"HTTP 403 from {A}")


def test_a_refused_endpoint_stays_out_whatever_succeeds_or_probes():
    clock = Clock()
    probed: list[str] = []

    async def probe(url: str) -> bool:
        probed.append(url)
        return True  # a gateway that refuses chat may well pass health checks

    r = router(A, clock=clock, probe=probe)
    before, refused = r.try_acquire("old"), r.try_acquire("new")
    r.release(refused, refusal(A, 401))
    r.release(before)  # a request sent before the refusal finishes fine
    clock.t += 3600
    asyncio.run(r.probe_once())
    assert r.state(A) == REFUSED and probed == [] and r.try_acquire("s") is None


def test_no_endpoint_left_raises_naming_each_endpoint_and_the_fix():
    r = router(A, B)

    async def go():
        for url, status in ((A, 403), (B, 404)):
            lease = r.try_acquire(f"on-{url}")
            assert lease.url == url
            r.release(lease, refusal(url, status))
        return await asyncio.wait_for(r.acquire("next"), timeout=5)

    with pytest.raises(NoEndpointLeftError) as info:
        asyncio.run(go())
    text = str(info.value)
    assert f"{A}: HTTP 403" in text and f"{B}: HTTP 404" in text
    assert "run the same command again" in text and "fix:" in text


def test_a_waiting_sample_is_told_when_the_last_endpoint_is_refused():
    r = router(A)
    r.set_limit(A, 1)

    async def go():
        held = r.try_acquire("busy")
        waiter = asyncio.ensure_future(r.acquire("waiting"))
        await asyncio.sleep(0)
        r.release(held, refusal(A))
        return await asyncio.wait_for(waiter, timeout=5)

    with pytest.raises(NoEndpointLeftError):
        asyncio.run(go())


def test_a_permanent_error_is_not_a_refusal():
    r = router(A)
    lease = r.try_acquire("s")
    r.release(lease, status_error(400, "bad request", endpoint=A))
    assert r.state(A) == UP


# ---- stalls (regen.engine.stall cancels; the router keeps the sample away, and counts) -------


def test_a_stalled_samples_retry_goes_elsewhere_and_never_back_while_another_is_up():
    from regen.core.errors import StallError

    r = router(A, B)
    first = r.try_acquire("s")
    assert first.url == A
    r.release(first, StallError("a stream sent nothing", endpoint=A))
    r.avoid("s", A)
    for _ in range(3):  # A is the least loaded every time, and still not chosen
        lease = r.try_acquire("s")
        assert lease.url == B
        r.release(lease)
        r.forget("x")  # another sample's end does not clear it
    r.avoid("s", B)  # both avoided, both still up: it may go anywhere rather than wait forever
    assert r.try_acquire("s") is not None
    r.forget("s")
    assert r.try_acquire("s").url in (A, B)


def test_an_avoided_endpoint_serves_the_sample_when_no_other_is_up():
    from regen.core.errors import StallError

    r = router(A, B, failure_threshold=1)
    r.avoid("s", A)
    la, lb = r.try_acquire("o1"), r.try_acquire("o2")
    assert (la.url, lb.url) == (A, B)
    r.release(la)
    r.release(lb, ConnectError("refused", endpoint=B))  # B leaves rotation
    assert r.state(B) == DOWN
    assert r.try_acquire("s").url == A
    assert StallError.kind == "stall"


def test_two_stalls_in_a_row_take_an_endpoint_out_as_stalled_and_a_probe_brings_it_back():
    from regen.core.errors import StallError
    from regen.engine.router import STALL_STREAK, STALLED

    clock = Clock()
    ok = {"answer": False}

    async def probe(url: str) -> bool:
        return ok["answer"]

    r = router(A, B, clock=clock, probe=probe, probe_interval_s=10)
    for i in range(STALL_STREAK):
        lease = r.try_acquire(f"s{i}")  # affinity-free: spread, so force A
        while lease.url != A:
            r.release(lease)
            lease = r.try_acquire(f"s{i}-again")
        assert r.state(A) == UP
        r.release(lease, StallError("a stream sent nothing", endpoint=A))
    assert r.state(A) == STALLED
    snap = r.snapshot()[A]
    assert snap["state"] == "stalled" and snap["stalls"] == STALL_STREAK
    assert all(r.try_acquire(f"n{i}").url == B for i in range(5))
    clock.t += 11
    assert asyncio.run(r.probe_once()) == []  # a hung server fails its probe: still out
    assert r.state(A) == STALLED
    ok["answer"] = True
    clock.t += 11
    assert asyncio.run(r.probe_once()) == [A]
    assert r.state(A) == UP


def test_a_success_between_stalls_keeps_the_endpoint_in():
    from regen.core.errors import StallError

    r = router(A)
    r.release(r.try_acquire("s0"), StallError("x", endpoint=A))
    r.release(r.try_acquire("s1"))
    r.release(r.try_acquire("s2"), StallError("x", endpoint=A))
    assert r.state(A) == UP


def test_the_worst_state_is_what_a_view_of_several_workers_shows():
    from regen.engine.router import worse

    assert worse(None, "up") == "up"
    assert worse("up", "stalled") == "stalled"
    assert worse("stalled", "down") == "stalled"
    assert worse("refused", "stalled") == "refused"
