"""Faults as the client sees them: 429 + Retry-After, 500, a cut stream, a stall; counted."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from _sim_common import MODEL

from regen.devkit.simulate import AnswerConfig, answer, conversation_key, request_key
from regen.devkit.simulate.faults import Fault, FaultConfig
from regen.devkit.simulate.testing import RunningSimulator, running_simulator

pytestmark = pytest.mark.timeout(60)

STALL_S = 0.4


@pytest.fixture(scope="module")
def log_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sim-faults") / "requests.jsonl"


@pytest.fixture(scope="module")
def faulty(log_path: Path) -> Iterator[RunningSimulator]:
    with running_simulator(
        fault_sequence="429,500,disconnect,stall",
        retry_after=0.25,
        stall_s=STALL_S,
        step_ms=1,
        tokens_per_step=2,
        mean_tokens=60,
        length_sigma=0,
        request_log=log_path,
    ) as s:
        yield s


def body(tag: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"fault {tag}"}],
        "max_tokens": 256,
        **extra,
    }


async def post(url: str, b: dict[str, Any]) -> tuple[int, dict[str, str], bytes, str | None]:
    """Status, headers, the bytes read, and the error that ended the read (None if clean)."""
    timeout = aiohttp.ClientTimeout(total=20)
    async with (
        aiohttp.ClientSession(timeout=timeout) as s,
        s.post(f"{url}/chat/completions", json=b) as r,
    ):
        data, error = b"", None
        try:
            async for chunk in r.content.iter_any():
                data += chunk
        except aiohttp.ClientError as e:
            error = type(e).__name__
        return r.status, dict(r.headers), data, error


def stream_text(data: bytes) -> tuple[str, bool]:
    """Reasoning + content streamed, and whether [DONE] arrived."""
    text = ""
    for line in data.decode().split("\n\n"):
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                d = choice["delta"]
                text += d.get("reasoning_content") or d.get("content") or ""
    return text, data.endswith(b"data: [DONE]\n\n")


def test_sequence_on_a_stream_then_success_with_the_same_answer(faulty, log_path):
    b = body("stream", stream=True)
    ans = answer(b, AnswerConfig(mean_tokens=60, length_sigma=0))
    full = ans.reasoning + ans.content

    async def go() -> list[tuple[int, dict[str, str], bytes, str | None, float]]:
        out = []
        for _ in range(5):
            t0 = time.monotonic()
            res = await post(faulty.url, b)
            out.append((*res, time.monotonic() - t0))
        return out

    (s429, h429, b429, _, _), (s500, _, b500, _, _), cut, stall, ok = asyncio.run(go())
    assert s429 == 429 and h429["Retry-After"] == "0.25"
    assert json.loads(b429)["code"] == 429
    assert s500 == 500 and json.loads(b500)["object"] == "error"
    status, _, data, _error, _ = cut
    text, done = stream_text(data)
    assert status == 200 and not done
    assert 0 < len(text) < len(full) and full.startswith(text)
    status, _, data, error, took = stall
    assert status == 200 and error is None and took >= STALL_S
    assert stream_text(data) == (full, True)
    status, _, data, error, took = ok
    assert stream_text(data) == (full, True)  # and no stall: the log below says which faulted

    lines = [json.loads(x) for x in log_path.read_text().splitlines()]
    mine = [x for x in lines if x["key"] == request_key(b)]
    assert [(x["attempt"], x["fault"]) for x in mine] == [
        (0, "rate_limit"),
        (1, "fail"),
        (2, "disconnect"),
        (3, "stall"),
        (4, None),
    ]
    assert mine[-1]["completion_tokens"] == ans.completion_tokens
    assert {x["conversation"] for x in mine} == {conversation_key(b)}


def test_non_streaming_cut_is_an_incomplete_body(faulty):
    b = body("plain")

    async def go() -> list[tuple[int, dict[str, str], bytes, str | None]]:
        return [await post(faulty.url, b) for _ in range(5)]

    statuses = asyncio.run(go())
    assert [s[0] for s in statuses] == [429, 500, 200, 200, 200]
    assert statuses[2][3] is not None  # the read failed: the connection was cut
    expected = answer(b, AnswerConfig(mean_tokens=60, length_sigma=0))
    for _, _, data, _ in statuses[3:]:
        assert json.loads(data)["choices"][0]["message"]["content"] == expected.content
    st = faulty.stats()
    assert st["failed"] == {"rate_limit": 2, "fail": 2, "disconnect": 2}
    assert st["stalled"] == 2 and st["completed"] == 4


def test_fault_rates_on_the_server_match_the_seeded_draws():
    opts = {"fail_rate": 0.2, "rate_limit_rate": 0.2, "fault_seed": 7}
    cfg = FaultConfig(fail_rate=0.2, rate_limit_rate=0.2, fault_seed=7)
    bodies = [body(f"rate {i}") for i in range(150)]
    with running_simulator(instant=True, mean_tokens=8, **opts) as s:

        async def go() -> list[int]:
            return [(await post(s.url, b))[0] for b in bodies]

        statuses = asyncio.run(go())
        st = s.stats()
    want = {None: 200, Fault.FAIL: 500, Fault.RATE_LIMIT: 429}
    assert statuses == [want[cfg.decide(request_key(b), 0)] for b in bodies]
    assert 15 <= statuses.count(500) <= 45 and 15 <= statuses.count(429) <= 45
    assert st["failed"] == {"fail": statuses.count(500), "rate_limit": statuses.count(429)}


def test_a_client_that_hangs_up_frees_its_slot():
    with running_simulator(step_ms=5, mean_tokens=2000, length_sigma=0) as s:

        async def go() -> str:
            timeout = aiohttp.ClientTimeout(total=0.3)
            try:
                async with (
                    aiohttp.ClientSession(timeout=timeout) as sess,
                    sess.post(f"{s.url}/chat/completions", json=body("hang up")) as r,
                ):
                    await r.read()
            except TimeoutError:
                return "timeout"
            return "answered"

        assert asyncio.run(go()) == "timeout"
        deadline = time.monotonic() + 5
        while s.stats()["client_gone"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        st = s.stats()
    assert st["client_gone"] == 1 and st["running"] == 0 and st["completed"] == 0
    assert st["tokens_generated"] < 2000
