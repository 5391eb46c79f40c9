"""One load level against one server: N streamed requests, ``concurrency`` of them in flight.

Each request goes through the client's one transport (:class:`regen.client.transport.ChatTransport`:
aiohttp, SSE lines, the regen error taxonomy) with the body the chat client builds
(:meth:`regen.client.ChatClient.request_body`, plus ``return_spec_tokens_details``). What
a request records (:class:`RequestRecord`): time to its first token (reasoning, content or a
tool call), its latency, the server-counted usage from the stream's usage chunk, and SGLang's
``sglext.spec_tokens_details`` when the server sends it (a ``choices: []`` chunk before the
usage chunk, SGLang 0.5.23 ``serving_chat.py``), and a digest of its answer (:func:`answer_digest`:
its token ids when the server streamed them, vLLM's ``return_token_ids``, else its text) to
compare the two servers' greedy answers. Nothing is retried: a failed request is recorded with
its error class (a retry would distort the latencies).

A level is a closed loop: ``concurrency`` workers, each sending its next request when the last
one ends, until the level's requests are all sent. ``full_s`` is how long all ``concurrency``
were in flight: from the start to the moment the first worker finds nothing left to send.
After it the batch drains (the tail), so the level's throughput is measured inside it
(:func:`regen.bench.stats.level_stats`). Owns no files.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from regen.client.stream import StreamAccumulator
from regen.client.transport import ChatTransport
from regen.core.errors import RequestError, StreamCutError

#: each level cycles through the prompts until at least this many × concurrency requests went
#: out, so the batch stays full for most of the level
MIN_ROUNDS = 2


@dataclass(slots=True)
class BenchRequest:
    """One prompt, ready to send: its source and the JSON body of the request."""

    source: str
    sample_id: str
    body: dict[str, object]


@dataclass(slots=True)
class RequestRecord:
    """What one request did."""

    role: str  #: "baseline" or "speculative"
    concurrency: int
    source: str
    sample_id: str
    ok: bool = False
    error: str | None = None  #: regen error kind when it failed
    status: int | None = None  #: HTTP status of a failure, when there was one
    ttft_s: float | None = None
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    verify_ct: int | None = None  #: spec_tokens_details.spec_verify_ct
    accept_length: float | None = None  #: spec_tokens_details.spec_accept_length
    sent_s: float | None = None  #: when it was sent, seconds after its level started
    #: the answer's digest (:func:`answer_digest`), "ids:..." or "text:..."
    answer: str | None = None

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first one, per second after the first one."""
        if not self.ok or self.completion_tokens is None or self.completion_tokens < 2:
            return None
        if self.ttft_s is None or self.latency_s is None or self.latency_s <= self.ttft_s:
            return None
        return (self.completion_tokens - 1) / (self.latency_s - self.ttft_s)


@dataclass(slots=True)
class LevelRun:
    """One server at one level: its records and its wall time."""

    role: str
    concurrency: int
    wall_s: float
    records: list[RequestRecord] = field(default_factory=list)
    #: seconds from the start during which all ``concurrency`` requests were in flight (None:
    #: not known, e.g. a level built by hand)
    full_s: float | None = None


#: (role, concurrency, finished, total) after every finished request
ProgressHook = Callable[[str, int, int, int], None]


def level_size(prompts: int, concurrency: int) -> int:
    """Requests one level sends: every prompt once, cycled to ``MIN_ROUNDS × concurrency``."""
    return max(prompts, MIN_ROUNDS * concurrency)


async def send_one(
    transport: ChatTransport,
    req: BenchRequest,
    *,
    role: str,
    concurrency: int,
    clock: Callable[[], float] = time.perf_counter,
) -> RequestRecord:
    """Send one streamed request and record it (failures are recorded, not raised)."""
    rec = RequestRecord(
        role=role, concurrency=concurrency, source=req.source, sample_id=req.sample_id
    )
    acc = StreamAccumulator(endpoint=transport.endpoint, clock=clock)
    start = clock()
    try:
        await transport.stream(req.body, acc)
        if acc.finish_reason is None:
            raise StreamCutError(
                f"stream from {transport.endpoint} ended without finish_reason",
                endpoint=transport.endpoint,
            )
    except RequestError as e:
        rec.error = e.kind
        rec.status = e.status
        rec.latency_s = clock() - start
        return rec
    rec.latency_s = clock() - start
    rec.ttft_s = None if acc.first_token_at is None else acc.first_token_at - start
    usage = acc.usage_fields()
    rec.prompt_tokens = usage.get("prompt_tokens")
    rec.completion_tokens = usage.get("completion_tokens")
    rec.finish_reason = acc.finish_reason
    if rec.completion_tokens is None:
        rec.error = "no_usage"
        return rec
    rec.ok = True
    rec.answer = answer_digest(acc)
    details = acc.spec
    if details is not None:
        vc = details.get("spec_verify_ct")
        rec.verify_ct = int(vc) if isinstance(vc, int | float) else None
        al = details.get("spec_accept_length")
        rec.accept_length = float(al) if isinstance(al, int | float) else None
    return rec


def answer_digest(acc: StreamAccumulator) -> str:
    """What the answer was, in 16 hex digits: ``ids:`` its output token ids when the server
    streamed them, else ``text:`` its reasoning, content and tool calls. Two answers of one
    method are the same answer when their digests are equal."""
    if acc.choice_ids is not None:
        method, payload = "ids", json.dumps(acc.choice_ids)
    else:
        calls = [(c.name, c.arguments) for c in acc.tool_calls()]
        method = "text"
        payload = json.dumps(["".join(acc.reasoning), "".join(acc.content), calls])
    return f"{method}:{hashlib.sha256(payload.encode()).hexdigest()[:16]}"


async def run_level(
    transport: ChatTransport,
    requests: Sequence[BenchRequest],
    *,
    role: str,
    concurrency: int,
    progress: ProgressHook | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> LevelRun:
    """Send ``level_size`` requests (cycling ``requests`` in order), ``concurrency`` at a time."""
    if not requests:
        raise ValueError("no requests to send")
    total = level_size(len(requests), concurrency)
    records: list[RequestRecord | None] = [None] * total
    next_index = 0
    finished = 0
    full_until: float | None = None

    async def worker() -> None:
        nonlocal next_index, finished, full_until
        while next_index < total:
            i = next_index
            next_index += 1
            req = requests[i % len(requests)]
            sent = clock()
            rec = await send_one(transport, req, role=role, concurrency=concurrency, clock=clock)
            rec.sent_s = sent - start
            records[i] = rec
            finished += 1
            if progress is not None:
                progress(role, concurrency, finished, total)
        if full_until is None:  # the first worker out of work: the batch starts to drain
            full_until = clock()

    start = clock()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, total))))
    wall = clock() - start
    return LevelRun(
        role=role,
        concurrency=concurrency,
        wall_s=wall,
        records=[r for r in records if r is not None],
        full_s=None if full_until is None else full_until - start,
    )
