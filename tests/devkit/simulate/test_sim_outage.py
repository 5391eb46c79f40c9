"""A hung server and a scheduled 503 storm, against a real simulated server on 127.0.0.1.

A hang is SGLang 0.5.23 with its scheduler stuck (docs/simulate.md, "Outages"): streams stop
without an error, new requests get no status, /health* answer 503 after the health-check
timeout, /metrics and /v1/models answer with the scheduler's gauges frozen, /server_info
waits for the scheduler. Every wait here is bounded in time and count.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from _sim_common import MODEL
from prometheus_client.parser import text_string_to_metric_families

from regen.devkit.simulate import AnswerConfig, answer, request_key
from regen.devkit.simulate.testing import RunningSimulator, running_simulator, simulator_in_thread

pytestmark = pytest.mark.timeout(90)

#: a short health-check timeout, so a failing check takes half a second
HEALTH_S = 0.5


def body(tag: str, stream: bool, max_tokens: int = 256, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": f"outage {tag}"}],
            "max_tokens": max_tokens, "stream": stream, **extra}  # fmt: skip


def text_of(data: bytes) -> tuple[str, bool]:
    """Reasoning + content of an SSE body, and whether it ended with [DONE]."""
    text = ""
    for event in data.decode().split("\n\n"):
        if event.startswith("data: {"):
            for choice in json.loads(event[6:]).get("choices", []):
                d = choice["delta"]
                text += d.get("reasoning_content") or d.get("content") or ""
    return text, data.endswith(b"data: [DONE]\n\n")


def status_of(req: str | urllib.request.Request, timeout: float = 10.0) -> int:
    """The status of a request (an HTTP error's too)."""
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.close()  # its response holds the connection
        return e.code


def get(url: str, timeout: float = 10.0) -> int:
    """The status of a GET."""
    return status_of(url, timeout)


def post(url: str, payload: dict[str, Any], timeout: float = 10.0) -> int:
    """The status of a chat completion's POST to ``url`` (an OpenAI base URL)."""
    req = urllib.request.Request(f"{url}/chat/completions", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    return status_of(req, timeout)


def timed_get(url: str, timeout: float) -> tuple[int | None, float]:
    """(status or None when nothing came in ``timeout`` s, seconds taken)."""
    t0 = time.monotonic()
    try:
        status: int | None = get(url, timeout)
    except (TimeoutError, urllib.error.URLError):
        status = None
    return status, time.monotonic() - t0


def wait_stats(sim: RunningSimulator, pred: Any, timeout_s: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        st = sim.stats()
        if pred(st):
            return st
        assert time.monotonic() < deadline, st
        time.sleep(0.02)


def metric(page: str, name: str) -> float:
    """The sum of a family's samples named ``name`` on a Prometheus page."""
    return sum(
        s.value
        for fam in text_string_to_metric_families(page)
        for s in fam.samples
        if s.name == name
    )


class Reader:
    """A chat request in flight: when its headers came, and each piece of body with its time."""

    def __init__(self, session: aiohttp.ClientSession, url: str, b: dict[str, Any]) -> None:
        self.sent = time.monotonic()
        self.status: int | None = None
        self.headers_at: float | None = None
        self.chunks: list[tuple[float, bytes]] = []
        self.task = asyncio.ensure_future(self._read(session, url, b))

    async def _read(self, session: aiohttp.ClientSession, url: str, b: dict[str, Any]) -> None:
        async with session.post(f"{url}/chat/completions", json=b) as r:
            self.status, self.headers_at = r.status, time.monotonic()
            async for piece in r.content.iter_any():
                self.chunks.append((time.monotonic(), piece))

    @property
    def data(self) -> bytes:
        return b"".join(piece for _, piece in self.chunks)

    def received_between(self, a: float, b: float) -> int:
        return sum(len(piece) for t, piece in self.chunks if a <= t <= b)


def log_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


# ---- a hang that ends ----------------------------------------------------------------------


def test_a_hang_stops_streams_and_holds_requests_then_everything_carries_on(tmp_path: Path):
    """The 2nd request hangs the server for hang_s: the running stream stops (no byte, no
    error), the new one gets no headers; then both finish with the answers they would have
    given."""
    hang_s, log_path = 1.0, tmp_path / "requests.jsonl"
    answers = AnswerConfig(mean_tokens=150, length_sigma=0)
    first, second = body("running", True), body("held", True)
    with running_simulator(step_ms=10, mean_tokens=150, length_sigma=0, hang_after=2,
                           hang_for_s=hang_s, request_log=log_path) as sim:  # fmt: skip

        async def go() -> tuple[Reader, Reader, float]:
            timeout = aiohttp.ClientTimeout(total=30)
            async with aiohttp.ClientSession(timeout=timeout) as s:
                running = Reader(s, sim.url, first)
                for _ in range(500):  # until the stream is under way
                    if running.chunks:
                        break
                    await asyncio.sleep(0.01)
                assert running.chunks and not running.task.done()
                held = Reader(s, sim.url, second)
                for _ in range(1000):
                    st = await asyncio.to_thread(sim.stats)
                    if st["hung"]:
                        break
                    await asyncio.sleep(0.01)
                hung_seen = time.monotonic()
                assert st["hung"] and st["hangs"] == 1
                await asyncio.wait_for(asyncio.gather(running.task, held.task), 30)
                return running, held, hung_seen

        running, held, hung_seen = asyncio.run(go())
        st = sim.stats()
    # the hang began after the 2nd request was sent and lasted hang_s: nothing of the running
    # stream arrived inside it (0.2 s for bytes already on the wire when it began)
    assert running.received_between(hung_seen + 0.2, held.sent + hang_s - 0.05) == 0
    assert running.chunks[-1][0] > held.sent + hang_s - 0.05  # it carried on after the hang
    # SGLang sends a stream's status with its first chunk: none before the hang ended
    assert held.status == 200 and held.headers_at is not None
    assert held.headers_at - held.sent >= hang_s - 0.05
    for reader, b in ((running, first), (held, second)):
        ans = answer(b, answers)
        assert text_of(reader.data) == (ans.reasoning + ans.content, True)
    assert st["completed"] == 2 and st["client_gone"] == 0 and not st["hung"]
    lines = {x["key"]: x for x in log_lines(log_path)}
    for b in (first, second):
        line = lines[request_key(b)]
        want = (200, True, answer(b, answers).finish_reason)
        assert (line["status"], line["hung"], line["finish_reason"]) == want


# ---- a hang that does not end --------------------------------------------------------------


def test_while_hung_requests_get_nothing_health_fails_metrics_stay_flat(tmp_path: Path):
    log_path = tmp_path / "requests.jsonl"
    with running_simulator(step_ms=10, mean_tokens=400, length_sigma=0, hang_after=3,
                           health_check_timeout_s=HEALTH_S, enable_metrics=True,
                           request_log=log_path) as sim:  # fmt: skip

        async def go() -> list[int | None]:
            timeout = aiohttp.ClientTimeout(total=30)
            async with aiohttp.ClientSession(timeout=timeout) as s:
                done = Reader(s, sim.url, body("done", False, max_tokens=5))  # request 1
                await asyncio.wait_for(done.task, 20)
                running = Reader(s, sim.url, body("running", True))  # request 2
                for _ in range(500):
                    if running.chunks:
                        break
                    await asyncio.sleep(0.01)
                assert done.status == 200 and running.chunks
                # request 3 hangs the server; it and a 4th, streamed or not, get no status
                out: list[int | None] = []
                for i, stream in enumerate((False, True)):
                    try:
                        async with s.post(
                            f"{sim.url}/chat/completions",
                            json=body(f"new {i}", stream),
                            timeout=aiohttp.ClientTimeout(total=0.5),
                        ) as r:
                            out.append(r.status)  # fmt: skip
                    except TimeoutError:
                        out.append(None)
                return out

        statuses = asyncio.run(go())
        assert statuses == [None, None]
        st = wait_stats(sim, lambda s: s["client_gone"] >= 3)  # the three clients gave up
        assert st["hung"] and st["completed"] == 1
        # /health_generate and /health (the same handler in SGLang 0.5.23) fail after the
        # timeout with 503; /v1/models and /model_info answer; /server_info waits
        for path in ("/health_generate", "/health"):
            status, took = timed_get(sim.base + path, 30)
            assert status == 503 and took >= HEALTH_S - 0.05, (path, took)
        assert get(sim.base + "/v1/models", 5) == 200 and get(sim.base + "/model_info", 5) == 200
        assert timed_get(sim.base + "/server_info", 0.5)[0] is None
        # a body the HTTP layer refuses is still refused (it never reaches the scheduler)
        req = urllib.request.Request(sim.url + "/chat/completions",
                                     data=json.dumps(body("x", False, model="nope")).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
        e.value.close()  # its response holds the connection
        assert e.value.code == 404
        # /metrics answers; the generation counter and the scheduler's gauges do not move
        pages = [sim.metrics_text()]
        time.sleep(0.5)
        pages.append(sim.metrics_text())
        gen = [metric(p, "sglang:generation_tokens_total") for p in pages]
        running_reqs = [metric(p, "sglang:num_running_reqs") for p in pages]
        assert gen[0] == gen[1] == 5
        # the running stream's client gave up during the hang, but SGLang's stuck scheduler
        # never learns it: the gauge keeps what it had when the hang began
        assert running_reqs == [1, 1]
        tput = [metric(p, "sglang:gen_throughput") for p in pages]
        assert tput[0] == tput[1] > 0  # frozen at its last value, as a stuck scheduler leaves it
    lines = log_lines(log_path)
    by_key = {x["key"]: x for x in lines}
    assert by_key[request_key(body("done", False, max_tokens=5))].get("hung") is None
    gone = [x for x in lines if x.get("client_gone")]
    assert len(gone) == 3 and all(x["hung"] for x in gone)
    # the stream had sent its status; the held requests had sent nothing
    assert sorted(x["status"] or 0 for x in gone) == [0, 0, 200]


def test_health_without_generation_answers_while_hung():
    with simulator_in_thread(instant=True, hang_after=1, health_endpoint_generation=False,
                             health_check_timeout_s=HEALTH_S) as sim:  # fmt: skip
        status, _ = timed_get_post(sim.url, body("h", False), 0.5)
        assert status is None and sim.stats()["hung"]
        assert get(sim.base + "/health", 5) == 200
        assert timed_get(sim.base + "/health_generate", 30)[0] == 503


def timed_get_post(url: str, b: dict[str, Any], timeout: float) -> tuple[int | None, float]:
    """POST a chat request; (status or None when nothing came in ``timeout`` s, seconds)."""
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(b).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            status: int | None = r.status
    except urllib.error.HTTPError as e:
        e.close()
        status = e.code
    except (TimeoutError, urllib.error.URLError):
        status = None
    return status, time.monotonic() - t0


# ---- what starts a hang --------------------------------------------------------------------


def test_hang_after_counts_requests():
    with simulator_in_thread(step_ms=1, mean_tokens=8, hang_after=3) as sim:
        for i in range(2):
            assert timed_get_post(sim.url, body(f"n{i}", i == 1), 10)[0] == 200
        assert not sim.stats()["hung"]
        assert timed_get_post(sim.url, body("n2", False), 0.5)[0] is None
        st = sim.stats()
        assert st["hung"] and st["hangs"] == 1 and st["received"] == 3
        assert st["completed"] == 2


def test_hang_at_s_counts_time_and_hang_for_s_ends_it():
    at_s, for_s = 1.0, 0.5
    with simulator_in_thread(step_ms=1, mean_tokens=8, hang_at_s=at_s, hang_for_s=for_s,
                             health_check_timeout_s=HEALTH_S) as sim:  # fmt: skip
        # the clock starts when the server listens (after /stats' uptime clock)
        st = sim.stats()
        if st["uptime_s"] < at_s - 0.3:
            assert not st["hung"] and timed_get_post(sim.url, body("a", False), 10)[0] == 200
        st = wait_stats(sim, lambda s: s["hung"])
        assert st["uptime_s"] >= at_s and st["hangs"] == 1
        st = wait_stats(sim, lambda s: not s["hung"])
        assert st["hangs"] == 1 and st["uptime_s"] >= at_s + for_s
        assert timed_get_post(sim.url, body("b", True), 10)[0] == 200
        assert get(sim.base + "/health_generate", 10) == 200
        assert sim.get("/server_info")["simulator"]["outages"]["hangs"] == 1


# ---- the 503 storm -------------------------------------------------------------------------


def test_overload_window_refuses_new_requests_as_a_full_queue(tmp_path: Path):
    """Before the window: answers; inside: SGLang's full-queue 503 (streamed: HTTP 200 and an
    error event); after: answers again. A stream under way when it opens is not touched."""
    at_s, for_s, log_path = 1.5, 1.0, tmp_path / "requests.jsonl"
    long_body = body("long", True, max_tokens=300)
    with simulator_in_thread(step_ms=10, mean_tokens=400, length_sigma=0, overload_at_s=at_s,
                             overload_for_s=for_s, request_log=log_path) as sim:  # fmt: skip

        async def go() -> tuple[list[tuple[int, bool, bytes]], Reader]:
            timeout = aiohttp.ClientTimeout(total=30)
            out: list[tuple[int, bool, bytes]] = []
            async with aiohttp.ClientSession(timeout=timeout) as s:
                long = Reader(s, sim.url, long_body)
                deadline = time.monotonic() + at_s + for_s + 1.0
                i = 0
                while time.monotonic() < deadline and len(out) < 400:
                    stream = i % 2 == 1
                    b = body(f"poll {i}", stream, max_tokens=2)
                    async with s.post(f"{sim.url}/chat/completions", json=b) as r:
                        out.append((r.status, stream, await r.read()))
                    i += 1
                    await asyncio.sleep(0.02)
                await asyncio.wait_for(long.task, 30)
                return out, long

        out, long = asyncio.run(go())
        st = sim.stats()
    refused = [(b'"code":503' in data) if stream else status == 503 for status, stream, data in out]
    # one window: answered, refused, answered again
    first, last = refused.index(True), len(refused) - 1 - refused[::-1].index(True)
    assert first > 0 and last < len(out) - 1 and all(refused[first : last + 1])
    assert not any(refused[:first]) and not any(refused[last + 1 :])
    for status, stream, data in (out[k] for k in range(first, last + 1)):
        if stream:  # SGLang: HTTP 200, the error event, [DONE]
            assert status == 200 and data.endswith(b"data: [DONE]\n\n")
            (event,) = [e for e in data.decode().split("\n\n") if '"error"' in e]
            assert json.loads(event[6:])["error"]["message"] == "The request queue is full."
        else:
            err = json.loads(data)
            assert (err["object"], err["code"]) == ("error", 503)
            assert err["message"] == "The request queue is full."
    ans = answer(long_body, AnswerConfig(mean_tokens=400, length_sigma=0))
    assert text_of(long.data) == (ans.reasoning + ans.content, True)
    assert st["failed"] == {"overload_window": last + 1 - first}
    faults = {x["fault"] for x in log_lines(log_path) if x["status"] in (200, 503)}
    assert "overload_window" in faults


def test_outage_options_need_their_start():
    from regen.core.errors import ConfigError
    from regen.devkit.simulate.config import SimConfig

    with pytest.raises(ConfigError, match="--hang-for-s needs"):
        SimConfig.from_flat({"hang_for_s": 1.0})
    with pytest.raises(ConfigError, match="--overload-for-s needs"):
        SimConfig.from_flat({"overload_for_s": 5.0})
    assert SimConfig.from_flat({"overload_at_s": 5}).overload_for_s == 30.0
    assert SimConfig.from_flat({"overload_after": 3, "overload_for_s": 2}).overload_after == 3


def test_overload_after_n_requests_starts_the_storm_at_the_nth():
    """--overload-after N: requests 1..N-1 are answered, the N-th and those after it are refused
    until the window ends; /stats tells the storm and when it started."""
    with simulator_in_thread(instant=True, overload_after=4, overload_for_s=1.0) as sim:
        before = sim.stats()
        statuses = [post(sim.url, body(f"q{i}", False, max_tokens=2)) for i in range(6)]
        during = sim.stats()
        deadline = time.monotonic() + 10
        while sim.stats()["overloaded"] and time.monotonic() < deadline:
            time.sleep(0.05)
        last = post(sim.url, body("after", False, max_tokens=2))
        after = sim.stats()
    assert (before["overloaded"], before["overload_started_s"]) == (False, None)
    assert statuses == [200, 200, 200, 503, 503, 503]
    assert during["overloaded"] is True and during["overload_started_s"] >= 0
    assert during["failed"] == {"overload_window": 3}
    assert last == 200 and after["overloaded"] is False and after["completed"] == 4


def test_health_timeout_is_sglangs_variable_unless_given(monkeypatch: pytest.MonkeyPatch):
    from regen.core.errors import ConfigError
    from regen.devkit.simulate.config import SimConfig

    monkeypatch.delenv("SGLANG_HEALTH_CHECK_TIMEOUT", raising=False)
    assert SimConfig().health_timeout_s == 20.0
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "7")
    assert SimConfig().health_timeout_s == 7.0
    assert SimConfig(health_check_timeout_s=2.5).health_timeout_s == 2.5
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="SGLANG_HEALTH_CHECK_TIMEOUT"):
        _ = SimConfig().health_timeout_s
