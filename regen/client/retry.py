"""Retry policy for one request: capped exponential backoff with jitter, honouring Retry-After.

Only :class:`regen.core.errors.TransientError` is retried. The wait before retry ``n`` (``n`` = the
number of the attempt that just failed, from 1) is::

    base = min(backoff_max_s, backoff_initial_s * 2 ** (n - 1))
    wait = base * (0.5 + 0.5 * rng.random())          # "equal jitter": in [base/2, base)
    wait = max(wait, error.retry_after)               # when the server sent Retry-After

so a server's Retry-After is always honoured, even above the cap. After ``max_attempts``
tries the last TransientError propagates with ``attempts`` set on it. Sleep and RNG are
injectable, so tests assert the exact sequence of waits without sleeping.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from regen.core.errors import TransientError

log = logging.getLogger(__name__)

T = TypeVar("T")


class RandomSource(Protocol):
    def random(self) -> float: ...


#: called after a transient failure, before sleeping: (error, attempt number, wait seconds)
FailureHook = Callable[[TransientError, int, float], None]


@dataclass(frozen=True, slots=True)
class RetrySettings:
    """A run's retry settings (the manifest's ``engine`` section, cut by regen.engine.inputs)."""

    max_attempts: int = 8
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0


@dataclass(slots=True)
class RetryPolicy:
    """How often and how long to retry one request."""

    max_attempts: int = 8
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    rng: RandomSource = field(default_factory=random.Random)

    @classmethod
    def of(
        cls,
        settings: RetrySettings,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: RandomSource | None = None,
    ) -> RetryPolicy:
        """The policy of ``settings`` (``sleep`` and ``rng`` injectable for tests)."""
        return cls(
            max_attempts=settings.max_attempts,
            backoff_initial_s=settings.backoff_initial_s,
            backoff_max_s=settings.backoff_max_s,
            sleep=sleep,
            rng=rng if rng is not None else random.Random(),
        )

    def backoff(self, attempt: int, error: BaseException | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        base: float = min(self.backoff_max_s, self.backoff_initial_s * 2 ** (attempt - 1))
        wait = base * (0.5 + 0.5 * self.rng.random())
        retry_after: float | None = getattr(error, "retry_after", None)
        if retry_after is not None:
            wait = max(wait, float(retry_after))
        return wait

    async def call(
        self,
        fn: Callable[[int], Awaitable[T]],
        *,
        on_failure: FailureHook | None = None,
    ) -> tuple[T, int]:
        """Run ``fn(attempt)`` until it succeeds; returns (result, attempts it took).

        A non-transient error propagates at once; the last TransientError propagates after
        ``max_attempts`` (both with ``attempts`` set on the exception).
        """

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            return self.backoff(state.attempt_number, exc)

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            delay = state.upcoming_sleep
            log.debug("attempt %d failed (%s); retrying in %.2fs", state.attempt_number, exc, delay)
            if on_failure is not None and isinstance(exc, TransientError):
                on_failure(exc, state.attempt_number, delay)

        retrying = AsyncRetrying(
            sleep=self.sleep,
            stop=stop_after_attempt(self.max_attempts),
            wait=wait,
            retry=retry_if_exception_type(TransientError),
            before_sleep=before_sleep,
            reraise=True,
        )
        attempt = 0
        try:
            async for try_ in retrying:
                with try_:
                    attempt = try_.retry_state.attempt_number
                    result = await fn(attempt)
        except TransientError as e:
            e.attempts = attempt  # type: ignore[attr-defined]
            if on_failure is not None:
                on_failure(e, attempt, 0.0)
            raise
        except Exception as e:
            e.attempts = attempt  # type: ignore[attr-defined]
            raise
        return result, attempt
