"""Whether a prepared request is refused or admitted, and what is counted when it ends: the
drawn 500, 429 and 503, the scheduled 503 storm and a full queue (SGLang's and vLLM's rules)
refuse it before any token; an admitted request becomes a scheduler job (its prompt looked up
in the prefix cache and held there); a finished answer is counted in the request log, the
counters and the /metrics page, and one whose client hung up too. Owns no files.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from regen.devkit.simulate.answer import SimAnswer
from regen.devkit.simulate.faults import Fault
from regen.devkit.simulate.prefix_cache import (
    Segment,
    after_answer,
    answer_segment,
    salt_of,
    token_segments,
)
from regen.devkit.simulate.replies import SENT
from regen.devkit.simulate.scheduler import Job
from regen.devkit.simulate.state import SimState
from regen.devkit.simulate.streaming import stream_error
from regen.devkit.simulate.tokenized import TokenIds
from regen.devkit.simulate.tokens import GENERATION_PROMPT

#: the request log's fault of a request refused by the scheduled 503 storm (--overload-at-s)
OVERLOAD_WINDOW = "overload_window"


def queue_full(state: SimState) -> bool:
    """Whether a request arriving now is refused for a full queue: SGLang counts the
    waiting queue (``len(waiting_queue) + 1 > max_queued_requests``), vLLM every
    unfinished request (running and waiting, ``--max-num-queued-reqs``). Each of SGLang's
    data-parallel schedulers applies the flag to its own queue, so this one scheduler,
    which stands for all of them, holds ``dp_size`` times as many."""
    limit = state.config.max_queued_requests
    if limit is None or state.config.instant:
        return False
    held = state.scheduler.n_queued
    if state.dialect.queue_counts_running:
        held += state.scheduler.n_running
    else:
        limit *= state.config.dp_size
    return held + 1 > limit


async def refuse(
    state: SimState,
    request: web.Request,
    body: dict[str, Any],
    fault: Fault | None,
    storm: bool,
    n_prompt: int,
    record: Callable[..., None],
) -> web.StreamResponse | None:
    """The answer of a request refused before any token (a drawn 500, 429 or 503, the
    storm, a full queue); None when it is admitted."""
    counters = state.stats.counters
    if fault is Fault.FAIL:
        counters.failed[fault.value] += 1
        record(status=500, fault=fault.value)
        return state.error(500, "simulated internal server error", "InternalServerError")
    if fault is Fault.RATE_LIMIT:
        counters.failed[fault.value] += 1
        record(status=429, fault=fault.value)
        retry = f"{state.config.faults.retry_after:g}"
        return state.error(
            429,
            "simulated rate limit: too many requests",
            "RateLimitError",
            **{"Retry-After": retry},
        )
    full = fault is None and queue_full(state)
    if fault is not Fault.OVERLOAD and not full:
        return None
    if full:  # the queue is full, refused before any token
        counters.queue_full += 1
        label = "queue_full"
    else:
        label = OVERLOAD_WINDOW if storm else Fault.OVERLOAD.value
        counters.failed[label] += 1
    record(status=503, fault=label)
    state.metrics.refused()
    d = state.dialect
    if body.get("stream"):
        return await stream_error(state, request, body, d.queue_full, n_prompt)
    return state.error(503, d.queue_full, d.queue_full_type)  # SGLang: str(status)


def admit(
    state: SimState,
    body: dict[str, Any],
    ans: SimAnswer,
    n_prompt: int,
    received_at: float,
    segments: list[Segment] | None,
) -> Job:
    """The request's job, in the scheduler (or made whole at once with --instant): the
    prefix cache's hit is looked up, and the prompt held, as it arrives."""
    job = Job(total=ans.completion_tokens, prompt=n_prompt)
    cache = state.cache
    if cache is not None and segments is not None:
        job.cached = cache.match(segments, n_prompt)
        cache.insert(segments)
        state.metrics.admitted(n_prompt, job.cached)
    else:
        state.metrics.admitted(n_prompt)
    if state.config.prefill_us_per_token:
        job.prefill = max(1, n_prompt - job.cached)
    spec = state.spec
    if spec is not None:
        job.spec = spec.request(body)
        if state.config.instant:  # no step loop: its verify steps all at once
            spec.run_alone(job.spec, job.total)
    if state.config.instant:
        job.produced = job.total
        job.first_at = received_at
        state.scheduler.counters.tokens += job.total
        state.scheduler.tokens_total += job.total
    else:
        state.scheduler.submit(job)
    return job


def finished(
    state: SimState,
    *,
    ans: SimAnswer,
    job: Job,
    fault: Fault | None,
    usage: dict[str, Any],
    stream: bool,
    received_at: float,
    record: Callable[..., None],
    ids: TokenIds | None = None,
    segments: list[Segment] | None = None,
) -> None:
    """Count a full answer; called just before its last bytes are written, so a client
    that has read them finds it counted. The prefix cache now holds the prompt and the
    answer."""
    cache = state.cache
    if cache is not None and segments is not None:
        if ids is not None:
            cache.insert(token_segments(ids.prompt + ids.output, cache.block_size,
                                        salt_of(segments)))  # fmt: skip
        else:
            calls = [(c.name, c.arguments) for c in ans.tool_calls]
            tokens = usage["completion_tokens"] + GENERATION_PROMPT
            cache.insert(after_answer(segments, answer_segment(ans.content, calls, tokens)))
    c = state.stats.counters
    c.completed += 1
    c.stalled += fault is Fault.STALL
    c.prompt_tokens += usage["prompt_tokens"]
    c.completion_tokens += usage["completion_tokens"]
    record(
        status=200,
        fault=fault.value if fault else None,
        stream=stream,
        prompt_tokens=usage["prompt_tokens"],
        completion_tokens=usage["completion_tokens"],
        finish_reason=ans.finish_reason,
    )
    state.metrics.finished(
        stream=stream,
        prompt_tokens=usage["prompt_tokens"],
        completion_tokens=usage["completion_tokens"],
        finish_reason=ans.finish_reason,
        received_at=received_at,
        first_token_at=job.first_at,
        finished_at=time.monotonic(),
        cached_tokens=job.cached,
    )


def gone(state: SimState, request: web.Request, record: Callable[..., None]) -> None:
    """The client hung up before its answer ended: logged with the status its response
    had sent (200 once a stream's headers went out; null when nothing was sent)."""
    state.stats.counters.client_gone += 1
    state.metrics.aborted()
    record(status=request.get(SENT), fault=None, client_gone=True)
