"""Fakes for client tests: an httpx2 MockTransport that plays scripted SSE / JSON / failures,
handed to the real AsyncOpenAI through ChatClient's client factory."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx2
import openai

from regen.client import ChatClient, RetryPolicy
from regen.manifest import Endpoint, Sampling

URL = "http://127.0.0.1:9/v1"
MODEL = "tiny-kimi"


def chunk(
    *,
    content: str | None = None,
    reasoning: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
    choices: bool = True,
    role: str | None = None,
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    out: dict[str, Any] = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if choices else [],
    }
    if usage is not None:
        out["usage"] = usage
    return out


def sse(chunks: list[dict[str, Any]], *, done: bool = True) -> bytes:
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return (text + ("data: [DONE]\n\n" if done else "")).encode()


def stream_response(chunks: list[dict[str, Any]], *, done: bool = True) -> httpx2.Response:
    return httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, content=sse(chunks, done=done)
    )


class _CutStream(httpx2.AsyncByteStream):
    """Sends some SSE bytes, then the connection drops."""

    def __init__(self, head: bytes) -> None:
        self.head = head

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.head
        raise httpx2.RemoteProtocolError("peer closed connection without sending complete body")


def cut_response(chunks: list[dict[str, Any]]) -> httpx2.Response:
    head = sse(chunks, done=False)
    return httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, stream=_CutStream(head)
    )


def error_response(
    status: int, body: Any = None, headers: dict[str, str] | None = None
) -> httpx2.Response:
    if body is None:
        body = {"object": "error", "message": f"status {status}", "type": "Error", "code": status}
    return httpx2.Response(status, headers=headers or {}, json=body)


OK_CHUNKS = [
    chunk(role="assistant", content=""),
    chunk(content="Hello"),
    chunk(content=" world", finish="stop"),
    chunk(choices=False, usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}),
]

Step = Callable[[httpx2.Request], httpx2.Response] | httpx2.Response | BaseException


class Script:
    """A MockTransport handler that answers request i with step i (the last step repeats)."""

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        step = self.steps[min(len(self.requests) - 1, len(self.steps) - 1)]
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, httpx2.Response):
            return step
        return step(request)

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests]

    def factory(self) -> Callable[[str, str, float], Any]:
        def make(base_url: str, api_key: str, timeout_s: float) -> Any:
            return openai.AsyncOpenAI(
                base_url=base_url,
                api_key=api_key,
                max_retries=0,
                http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(self)),
            )

        return make


class FixedRandom:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


class SleepRecorder:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def make_client(
    script: Script,
    *,
    sampling: Sampling | None = None,
    retry: RetryPolicy | None = None,
    endpoint: Endpoint | None = None,
    clock: Callable[[], float] | None = None,
    **kw: Any,
) -> ChatClient:
    extra: dict[str, Any] = {"clock": clock} if clock is not None else {}
    return ChatClient(
        endpoint or Endpoint(url=URL),
        model=MODEL,
        sampling=sampling or Sampling(),
        retry=retry or RetryPolicy(max_attempts=1, sleep=SleepRecorder()),
        client_factory=script.factory(),
        **extra,
        **kw,
    )


MESSAGES = [{"role": "user", "content": "Say hello"}]
