"""A streamed answer (``"stream": true``) as SGLang (or vLLM) sends it: the role chunk, one chunk
per scheduler step as the tokens are made, the tool calls, the finish chunk, SGLang's sglext
chunk, usage and ``[DONE]``; or what a fault makes of it half-way (a cut, a stall, a 503 as an
error event, a graceful abort), and the error event of a stream refused before its first token.
Owns no files.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from regen.devkit.simulate.answer import SimAnswer
from regen.devkit.simulate.complete import sglext
from regen.devkit.simulate.faults import Fault
from regen.devkit.simulate.replies import (
    IM_END_ID,
    RETRACTED,
    SENT,
    SSE_HEADERS,
    ClientGone,
    drop,
    dumps,
    text_json,
    zero_usage,
)
from regen.devkit.simulate.scheduler import Job
from regen.devkit.simulate.state import SimState
from regen.devkit.simulate.tokenized import TokenIds

#: the faults that strike half-way through an answer
HALFWAY = (Fault.DISCONNECT, Fault.STALL, Fault.RETRACT, Fault.ABORT)
DONE = b"data: [DONE]\n\n"


def chunk_base(state: SimState, cid: str) -> bytes:
    """``data: {"id":..,"object":..,"created":..,"model":..`` of every chunk."""
    created = int(time.time())
    prefix = f'data: {{"id":"{cid}","object":"chat.completion.chunk","created":{created},'
    return prefix.encode() + b'"model":' + state.model_json


def usage_event(state: SimState, usage: dict[str, Any]) -> bytes:
    cid = f"chatcmpl-{os.urandom(8).hex()}"
    return chunk_base(state, cid) + b',"choices":[],"usage":' + dumps(usage) + b"}\n\n"


def _wants_usage(body: Mapping[str, Any]) -> bool:
    return bool((body.get("stream_options") or {}).get("include_usage"))


async def stream_error(
    state: SimState,
    request: web.Request,
    body: Mapping[str, Any],
    message: str,
    n_prompt: int,
) -> web.StreamResponse:
    """A streamed request SGLang aborts with 503 before its first token: HTTP 200, the error
    event, usage (when asked), [DONE]."""
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    out = [state.dialect.stream_error(message)]
    if _wants_usage(body):
        out.append(usage_event(state, zero_usage(n_prompt)))
    out.append(DONE)
    with contextlib.suppress(ConnectionError):
        await resp.write(b"".join(out))
        await resp.write_eof()
    return resp


class AnswerStream:
    """One streamed answer, written as its job makes tokens (:meth:`send`)."""

    def __init__(
        self,
        state: SimState,
        request: web.Request,
        body: Mapping[str, Any],
        ans: SimAnswer,
        ids: TokenIds | None,
        job: Job,
        fault: Fault | None,
        usage: dict[str, Any],
    ) -> None:
        self.state, self.request, self.body, self.ans = state, request, body, ans
        self.ids, self.job, self.fault, self.usage = ids, job, fault, usage
        self.base = chunk_base(state, f"chatcmpl-{os.urandom(8).hex()}")
        d = state.dialect
        # vLLM's return_token_ids: each chunk carries the ids of its tokens
        vllm_ids = ids if d.vllm_ids and d.asks_ids(body, True)[1] else None
        separate = bool(body.get("separate_reasoning", True))
        self.chunks = Chunker(self.base, d.reasoning_key, separate, ans, vllm_ids, job.total)
        # one chunk per step: K tokens, or what a speculative step can keep
        spec = state.spec
        self.k = state.config.tokens_per_step if spec is None else spec.max_step_tokens
        self.resp = web.StreamResponse(headers=SSE_HEADERS)

    async def open(self) -> None:
        """SGLang sends the status and headers with the first chunk, once the first token is
        made (serving_chat.py _handle_streaming_request awaits the generator's first item);
        vLLM returns its StreamingResponse at once, and Starlette sends the headers first."""
        job = self.job
        while self.state.dialect.status_with_first_token and job.produced == 0 and not job.done:
            await job.progress()
        await self.state.hang.wait_resumed()
        await self.resp.prepare(self.request)
        self.request[SENT] = 200

    async def write(self, data: bytes) -> None:
        hang = self.state.hang
        if hang.hung:  # a hung server sends nothing more: the stream just stops
            await hang.wait_resumed()
        try:
            await self.resp.write(data)
        except ConnectionError:
            raise ClientGone(self.resp) from None

    async def end(self, data: bytes) -> web.StreamResponse:
        """Write the last events and end the stream."""
        await self.write(data)
        with contextlib.suppress(ConnectionError):
            await self.resp.write_eof()
        return self.resp

    async def send(self, done: Callable[[], None]) -> web.StreamResponse:
        """The whole stream (``done`` counts the answer just before its last events)."""
        await self.open()
        job, ans, chunks = self.job, self.ans, self.chunks
        parts = chunks.role()
        sent = 0
        cut_at = job.total // 2 if self.fault in HALFWAY else -1
        while True:
            produced = job.produced
            if cut_at >= 0 and produced >= cut_at:
                produced = max(sent, cut_at)
            if produced > sent:
                parts += chunks.text(sent, produced, self.k)
                if produced >= job.total and ans.tool_calls:
                    parts += tool_chunks(chunks.head, chunks.tail, ans)
                sent = produced
            if parts:
                await self.write(b"".join(parts))
                parts = []
            if sent == cut_at:
                cut_at = -1
                if self.fault is not Fault.STALL:
                    return await self.halfway(sent)
                await asyncio.sleep(self.state.config.faults.stall_s)
                continue
            if sent >= job.total:
                break
            await job.progress()
        done()
        return await self.end(self.last(chunks.rest()))

    async def halfway(self, sent: int) -> web.StreamResponse:
        """The fault that strikes when half the answer was sent (a stall aside): the
        connection dropped, or the stream ended as SGLang ends one it aborted."""
        self.job.cancelled = True
        if self.fault is Fault.DISCONNECT:
            drop(self.request)
            return self.resp
        return await self.end(self.aborted(sent))

    def last(self, rest_ids: list[int] | None) -> bytes:
        """A finished stream's last events: the finish chunk (vLLM's with the rest of the ids,
        ``rest_ids``: the tool section, <|im_end|>), SGLang's sglext chunk, usage when asked,
        [DONE]."""
        ans, base, usage = self.ans, self.base, self.usage
        finish: dict[str, Any] = {
            "index": 0,
            "delta": {},
            "logprobs": None,
            "finish_reason": ans.finish_reason,
            "matched_stop": IM_END_ID if ans.finish_reason == "stop" else None,
        }
        if rest_ids is not None:
            del finish["matched_stop"]
            finish["stop_reason"] = None
            finish["token_ids"] = rest_ids
        last = b',"choices":[' + dumps(finish) + b"]"
        shape = self.state.config.usage_shape
        if shape == "finish":
            last += b',"usage":' + dumps(usage)
        out = [base, last, b"}\n\n"]
        ext = sglext(self.state, self.body, self.job, self.ids, usage)
        if ext:  # SGLang: one chunk with choices [] after the finish chunk, before usage
            out += [base, b',"choices":[],"usage":null,"sglext":', dumps(ext), b"}\n\n"]
        if shape == "sglang" and _wants_usage(self.body):
            out += [base, b',"choices":[],"usage":', dumps(usage), b"}\n\n"]
        out.append(DONE)
        return b"".join(out)

    def aborted(self, sent: int) -> bytes:
        """How SGLang ends a stream it aborted half-way: a retraction (503) as an error event,
        a graceful abort as a finish chunk with ``abort``; then usage (when asked), [DONE]."""
        if self.fault is Fault.RETRACT:
            out = [self.state.dialect.stream_error(RETRACTED)]
        else:
            finish = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "abort",
                      "matched_stop": None}  # fmt: skip
            out = [self.base, b',"choices":[', dumps(finish), b"]}\n\n"]
        if _wants_usage(self.body):
            usage = self.usage
            part = {
                **usage,
                "completion_tokens": sent,
                "total_tokens": usage["prompt_tokens"] + sent,
            }
            out.append(usage_event(self.state, part))
        out.append(DONE)
        return b"".join(out)


class Chunker:
    """The text chunks of one streamed answer: one per step (K tokens) and channel, the
    reasoning under the dialect's key (or, not separated, as content closed by ``</think>``).
    With vLLM's ``return_token_ids`` (``ids``) each text chunk carries a proportional share of
    the answer's ids and the role chunk the prompt's; :meth:`rest` is what the finish chunk
    carries."""

    __slots__ = ("given", "head", "ids", "nr", "pieces", "r_key", "separate", "tail", "total")

    def __init__(
        self,
        base: bytes,
        reasoning_key: str,
        separate: bool,
        ans: SimAnswer,
        ids: TokenIds | None,
        total: int,
    ) -> None:
        self.head = base + b',"choices":[{"index":0,"delta":'
        self.tail = b',"logprobs":null,"finish_reason":null}]}\n\n'
        self.separate = separate
        self.r_key = f'{{"{reasoning_key}":'.encode() if separate else b'{"content":'
        self.pieces = ans.reasoning_pieces + ans.content_pieces
        self.nr = len(ans.reasoning_pieces)
        self.ids, self.total, self.given = ids, total, 0

    def role(self) -> list[bytes]:
        """The first chunk: the assistant's role (and vLLM's prompt ids)."""
        if self.ids is None:
            return [self.head, b'{"role":"assistant","content":""}', self.tail]
        return [self.head, b'{"role":"assistant","content":""}',
                b',"logprobs":null,"finish_reason":null}],"prompt_token_ids":',
                dumps(self.ids.prompt), b"}\n\n"]  # fmt: skip

    def text(self, a: int, produced: int, k: int) -> list[bytes]:
        """The chunks of tokens ``a`` up to ``produced``, ``k`` per chunk."""
        out: list[bytes] = []
        pieces, nr, head = self.pieces, self.nr, self.head
        end = min(produced, len(pieces))
        while a < end:
            b = min(a + k, end)
            if a < nr:
                m = min(b, nr)
                text = pieces[a] if m - a == 1 else "".join(pieces[a:m])
                if not self.separate and m == nr:
                    text += "</think>"
                out += (head, self.r_key, text_json(text), b"}", self._tail(m))
                a = m
            if b > a:
                text = pieces[a] if b - a == 1 else "".join(pieces[a:b])
                out += (head, b'{"content":', text_json(text), b"}", self._tail(b))
            a = b
        return out

    def _tail(self, upto: int) -> bytes:
        if self.ids is None:
            return self.tail
        end = len(self.ids.output) * upto // max(1, self.total)
        part, self.given = self.ids.output[self.given : end], max(self.given, end)
        return b',"logprobs":null,"finish_reason":null,"token_ids":' + dumps(part) + b"}]}\n\n"

    def rest(self) -> list[int] | None:
        """The answer's ids no chunk carried yet (vLLM: the finish chunk's)."""
        return None if self.ids is None else self.ids.output[self.given :]


def tool_chunks(head: bytes, tail: bytes, ans: SimAnswer) -> list[bytes]:
    """The stream chunks of the answer's tool calls: each opens (id, name), then its
    arguments."""
    out: list[bytes] = []
    for i, call in enumerate(ans.tool_calls):
        opening = {"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                   "function": {"name": call.name, "arguments": ""}}]}  # fmt: skip
        args = {"tool_calls": [{"index": i, "function": {"arguments": call.arguments}}]}
        out += (head, dumps(opening), tail, head, dumps(args), tail)
    return out
