"""Retry policy: the exact backoff sequence, Retry-After, what is retried. No backoff sleeps
for real (the waits are recorded); the faults come through the real transport from a scripted
local server."""

from __future__ import annotations

import asyncio
import email.utils

import pytest
from _chat_fakes import (
    MESSAGES,
    OK_CHUNKS,
    Drop,
    FixedRandom,
    ScriptedServer,
    SleepRecorder,
    Stall,
    error_response,
    make_client,
    stream_response,
)

from regen.client import RetryPolicy, RetrySettings, parse_retry_after
from regen.core.errors import (
    ConnectError,
    OverloadedError,
    PermanentError,
    RateLimitedError,
    ServerError,
)


def policy(sleep, *, rng=0.5, **kw):
    return RetryPolicy(sleep=sleep, rng=FixedRandom(rng), **kw)


def run_client(script, retry, on_failure=None, **kw):
    with script.running():
        client = make_client(script.url, retry=retry, **kw)

        async def go():
            try:
                return await client.complete(MESSAGES, None, sample_id="s:1", on_failure=on_failure)
            finally:
                await client.aclose()

        return asyncio.run(go())


def test_timeout_disconnect_429_503_500_then_success_exact_waits():
    sleep = SleepRecorder()
    script = ScriptedServer(
        Stall(2.0, stream_response(OK_CHUNKS)),  # the client's read timeout (0.3 s) fires first
        Drop(),
        error_response(429, headers={"Retry-After": "7"}),
        error_response(503),  # SGLang's overload: no Retry-After
        error_response(500),
        stream_response(OK_CHUNKS),
    )
    retry = policy(sleep, max_attempts=8, backoff_initial_s=1.0, backoff_max_s=60.0)
    failures = []
    result = run_client(
        script, retry, on_failure=lambda e, n, w: failures.append(type(e).__name__), timeout_s=0.3
    )
    # base 1, 2, 4, 8, 16 times the jitter factor 0.5 + 0.5 * 0.5 = 0.75; Retry-After 7 wins
    assert sleep.waits == [0.75, 1.5, 7.0, 6.0, 12.0]
    assert failures == [
        "RequestTimeoutError",
        "ConnectError",
        "RateLimitedError",
        "OverloadedError",
        "ServerError",
    ]
    assert result.attempts == 6
    assert result.content == "Hello world"
    assert len(script.requests) == 6


def test_backoff_is_capped_and_jitter_comes_from_the_rng():
    sleep = SleepRecorder()
    script = ScriptedServer(*[error_response(503)] * 6, stream_response(OK_CHUNKS))
    retry = policy(sleep, rng=0.0, max_attempts=10, backoff_initial_s=0.5, backoff_max_s=3.0)
    assert run_client(script, retry).attempts == 7
    # factor 0.5: bases 0.5, 1, 2, 3 (cap), 3, 3
    assert sleep.waits == [0.25, 0.5, 1.0, 1.5, 1.5, 1.5]


def test_after_max_attempts_the_last_transient_error_propagates():
    sleep = SleepRecorder()
    script = ScriptedServer(Drop(), error_response(502))
    failures = []
    retry = policy(sleep, max_attempts=3, backoff_initial_s=1.0)
    with pytest.raises(ServerError) as info:
        run_client(script, retry, on_failure=lambda e, n, w: failures.append((n, w)))
    assert info.value.status == 502
    assert info.value.attempts == 3
    assert len(script.requests) == 3
    assert sleep.waits == [0.75, 1.5]
    assert failures == [(1, 0.75), (2, 1.5), (3, 0.0)]


def test_permanent_errors_are_not_retried():
    sleep = SleepRecorder()
    script = ScriptedServer(error_response(400), stream_response(OK_CHUNKS))
    with pytest.raises(PermanentError) as info:
        run_client(script, policy(sleep, max_attempts=5))
    assert len(script.requests) == 1 and sleep.waits == []
    assert info.value.attempts == 1


def test_retry_after_http_date_and_header_variants():
    now = 1_800_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after({"Retry-After": date}, now=now) == pytest.approx(30.0)
    assert parse_retry_after({"retry-after": "12"}) == 12.0
    assert parse_retry_after({"Retry-After": "1.5"}) == 1.5
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert parse_retry_after({"Retry-After": "soon"}) is None
    assert parse_retry_after({"Retry-After": email.utils.formatdate(now - 5)}, now=now) == 0.0
    assert parse_retry_after({}) is None


def test_retry_after_date_reaches_the_error_and_the_wait():
    sleep = SleepRecorder()
    date = email.utils.formatdate(4_000_000_000, usegmt=True)  # far in the future
    script = ScriptedServer(
        error_response(429, headers={"Retry-After": date}), stream_response(OK_CHUNKS)
    )
    run_client(script, policy(sleep, max_attempts=2))
    assert len(sleep.waits) == 1 and sleep.waits[0] > 1_000_000


def test_rate_limited_error_carries_retry_after():
    script = ScriptedServer(error_response(429, headers={"Retry-After": "7"}))
    with pytest.raises(RateLimitedError) as info:
        run_client(script, policy(SleepRecorder(), max_attempts=1))
    assert info.value.retry_after == 7.0 and info.value.status == 429
    assert isinstance(info.value, OverloadedError)  # a back-off signal, like SGLang's 503


def test_overload_503_is_retried_with_plain_backoff():
    sleep = SleepRecorder()
    script = ScriptedServer(error_response(503), error_response(503), stream_response(OK_CHUNKS))
    result = run_client(script, policy(sleep, max_attempts=4, backoff_initial_s=1.0))
    assert result.attempts == 3 and sleep.waits == [0.75, 1.5]


def test_policy_of_settings_and_direct_call():
    sleep = SleepRecorder()
    retry = RetryPolicy.of(
        RetrySettings(max_attempts=3, backoff_initial_s=2.0, backoff_max_s=5.0),
        sleep=sleep,
        rng=FixedRandom(0.0),
    )
    calls = []

    async def flaky(n: int) -> str:
        calls.append(n)
        if n < 3:
            raise ConnectError("down")
        return "ok"

    assert asyncio.run(retry.call(flaky)) == ("ok", 3)
    assert calls == [1, 2, 3]
    assert sleep.waits == [1.0, 2.0]
