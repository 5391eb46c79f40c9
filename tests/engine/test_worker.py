"""SampleWorker against in-thread simulators: retries, failure classes, endpoint affinity."""

from __future__ import annotations

import asyncio

import pytest
from _worker_config import config_for

from regen.client import RetryPolicy
from regen.core.sample import Message, Sample
from regen.devkit.simulate.testing import simulator_in_thread
from regen.engine.worker import SampleWorker
from regen.manifest import parse_manifest


async def no_sleep(_s: float) -> None:
    return None


def manifest(*urls: str, max_attempts: int = 3):
    return parse_manifest({
        "name": "t",
        "target": {"model": "m", "tokenizer": "tok"},
        "sampling": {"max_tokens": 16, "seed": 0},
        "endpoints": [{"url": u} for u in urls],
        "engine": {"max_attempts": max_attempts, "endpoint_failure_threshold": 100},
        "sources": [{"name": "s", "adapter": "sharegpt", "path": "x.jsonl"}],
    })  # fmt: skip


def stub_rows(sample, turns):
    keys = ("endpoint", "content", "attempts", "finish_reason")
    return [{"sample_id": sample.id, "turn": t.turn, **{k: getattr(t.result, k) for k in keys}}
            for t in turns]  # fmt: skip


def three_turns(sid: str) -> Sample:
    msgs = []
    for i in range(3):
        msgs += [Message("user", f"question {i} of {sid}"), Message("assistant", f"old {i}")]
    return Sample(sid, "s", msgs)


def worker(m, concurrency: int = 4) -> SampleWorker:
    config = config_for(m, concurrency=concurrency)
    retry = RetryPolicy.of(config.retry, sleep=no_sleep)
    return SampleWorker(config, row_builder=stub_rows, retry=retry)


@pytest.fixture(scope="module")
def two_sims():
    with (
        simulator_in_thread(model_name="m", instant=True, mean_tokens=8) as a,
        simulator_in_thread(model_name="m", instant=True, mean_tokens=8) as b,
    ):
        yield a, b


def test_all_turns_of_a_sample_go_to_one_endpoint(two_sims) -> None:
    a, b = two_sims
    w = worker(manifest(a.url, b.url))

    async def go():
        outs = await asyncio.gather(*(w.process(three_turns(f"s:{i}")) for i in range(8)))
        await w.aclose()
        return outs

    outs = asyncio.run(go())
    for o in outs:
        assert o.status == "done"
        cut = [r["turn"] for r in o.rows if r["finish_reason"] == "length"]
        assert len(o.rows) == (cut[0] + 1 if cut else 3)  # a cut reply ends the conversation
    assert all(len({r["endpoint"] for r in o.rows}) == 1 for o in outs)
    assert {o.rows[0]["endpoint"] for o in outs} == {a.url, b.url}  # least outstanding spreads
    n = sum(len(o.rows) for o in outs)
    assert w.stats.sent == w.stats.ok == n and w.stats.in_flight == 0
    assert [o.requests for o in outs] == [len(o.rows) for o in outs]


def process(w: SampleWorker, sample: Sample):
    """``w.process(sample)`` on a loop of its own, the worker closed after (its sessions)."""

    async def go():
        try:
            return await w.process(sample)
        finally:
            await w.aclose()

    return asyncio.run(go())


def test_transient_errors_retried_then_exhausted() -> None:
    with simulator_in_thread(model_name="m", instant=True, mean_tokens=8,
                             fault_sequence="500,429,ok", retry_after=0) as sim:  # fmt: skip
        w = worker(manifest(sim.url, max_attempts=3))
        ok = process(w, Sample("s:ok", "s", [Message("user", "hi")]))
        assert ok.status == "done" and ok.rows[0]["attempts"] == 3
        assert w.stats.retried == 2 and w.stats.sent == 3
        assert set(w.stats.errors) == {"server_error", "rate_limited"}
    with simulator_in_thread(model_name="m", instant=True, mean_tokens=8,
                             fault_sequence="500,500,500,ok") as sim:  # fmt: skip
        w = worker(manifest(sim.url, max_attempts=3))
        out = process(w, Sample("s:t", "s", [Message("user", "hi")]))
        assert out.status == "transient" and out.rows == []
        assert out.kind == "server_error" and out.http_status == 500 and out.attempts == 3
        assert w.stats.failed == 1


def test_permanent_error_is_not_retried() -> None:
    with simulator_in_thread(model_name="m", instant=True, context_length=20) as sim:
        w = worker(manifest(sim.url))
        out = process(w, Sample("s:p", "s", [Message("user", "word " * 50)]))
        # SGLang (and the simulator) say "too long" in prose only; the client maps by status
        assert out.status == "permanent" and out.kind in ("permanent", "context_length")
        assert out.http_status == 400 and out.requests == 1 and out.rows == []


def test_503_overload_backs_the_limit_off_and_never_takes_the_endpoint_out(caplog) -> None:
    """SGLang answers a full queue with 503 (in-stream after 200 when streamed): a busy server,
    not a sick one. Eight overloads in a row (past the failure threshold of 3) lower the
    in-flight limit and leave the endpoint in rotation; /health_generate answers, so the
    health check after the streak keeps it there."""
    seq = ",".join(["503"] * 8) + ",ok"
    with simulator_in_thread(model_name="m", instant=True, mean_tokens=8,
                             fault_sequence=seq, max_running_requests=8) as sim:  # fmt: skip
        m = parse_manifest({
            "name": "t", "target": {"model": "m", "tokenizer": "tok"},
            "sampling": {"max_tokens": 16, "seed": 0},
            "endpoints": [{"url": sim.url}],
            "engine": {"max_attempts": 10, "endpoint_failure_threshold": 3},
            "sources": [{"name": "s", "adapter": "sharegpt", "path": "x.jsonl"}],
        })  # fmt: skip
        config = config_for(m)
        w = SampleWorker(config, row_builder=stub_rows, shares={sim.url: 8},
                         retry=RetryPolicy.of(config.retry, sleep=no_sleep))  # fmt: skip
        start = w.lanes[sim.url].limit.current

        async def go():
            out = await w.process(Sample("s:busy", "s", [Message("user", "hi")]))
            await asyncio.sleep(0.2)  # the background health check after the streak
            snap = w.router.snapshot()[sim.url]
            await w.aclose()
            return out, snap

        with caplog.at_level("WARNING", logger="regen.engine.router"):
            out, snap = asyncio.run(go())
    assert out.status == "done" and out.rows[0]["attempts"] == 9
    assert set(w.stats.errors) == {"overloaded"}
    assert (snap["state"], snap["failures"], snap["throttled"]) == ("up", 0, 8)
    assert "out of rotation" not in caplog.text
    assert w.lanes[sim.url].limit.current < start  # backed off (x0.7 per overload window)


# ---- endpoint-wide faults: never the sample's ----------------------------------------------


async def always_up(_url: str) -> bool:
    return True


def refusing_server(status: int = 403):
    from _scripted import ScriptedServer, json_reply

    body = {"object": "error", "message": "denied by the gateway", "code": status}
    return ScriptedServer(json_reply(status, body))


def test_a_refusing_endpoint_leaves_rotation_and_its_samples_go_elsewhere(two_sims) -> None:
    good = two_sims[0]
    with refusing_server(403).running() as bad:
        m = manifest(bad.url, good.url)
        config = config_for(m, concurrency=4)
        w = SampleWorker(config, row_builder=stub_rows, probe=always_up,
                         retry=RetryPolicy.of(config.retry, sleep=no_sleep))  # fmt: skip

        async def go():
            try:
                return await asyncio.gather(*(w.process(three_turns(f"s:{i}")) for i in range(6)))
            finally:
                await w.aclose()

        outs = asyncio.run(go())
        snap = w.router.snapshot()[bad.url]
    assert [o.status for o in outs] == ["done"] * 6
    assert {r["endpoint"] for o in outs for r in o.rows} == {good.url}
    # one refusal is enough: every request in flight on it when it came may see its own
    chats = [r for r in bad.requests if r.path.endswith("/chat/completions")]
    assert 1 <= len(chats) <= 4 and snap["state"] == "refused"
    assert all(r["attempts"] == 1 for o in outs for r in o.rows)  # a refusal is not a try
    assert w.stats.failed == 0 and set(w.stats.errors) == {"endpoint_fault"}


@pytest.mark.parametrize("status", [401, 403, 404])
def test_with_no_endpoint_left_the_sample_is_unsent_not_failed(status: int) -> None:
    with refusing_server(status).running() as bad:
        m = manifest(bad.url)
        config = config_for(m, concurrency=4)
        w = SampleWorker(config, row_builder=stub_rows, probe=always_up,
                         retry=RetryPolicy.of(config.retry, sleep=no_sleep))  # fmt: skip

        async def go():
            try:
                return await asyncio.gather(*(w.process(three_turns(f"s:{i}")) for i in range(3)))
            finally:
                await w.aclose()

        outs = asyncio.run(go())
    assert [o.status for o in outs] == ["unsent"] * 3
    assert {o.kind for o in outs} == {"no_endpoint_left"}
    assert f"{bad.url}: HTTP {status}" in outs[0].message
    assert "denied by the gateway" in outs[0].message
    chats = [r for r in bad.requests if r.path.endswith("/chat/completions")]  # not /metrics
    assert w.stats.failed == 0 and len(chats) <= 3
