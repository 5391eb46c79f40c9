"""Fakes for client tests: a scripted local HTTP server (tests/_scripted.py) that plays
SSE / JSON / failures to the client's real aiohttp transport."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from typing import Any

from _scripted import (
    Cut,
    Drop,
    Reply,
    ScriptedServer,
    Stall,
    json_reply,
    sse_reply,
)

from regen.client import ChatClient, RetryPolicy
from regen.manifest import Endpoint, Sampling

MODEL = "tiny-kimi"

__all__ = ["Cut", "Drop", "Reply", "ScriptedServer", "Stall"]


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


def stream_response(chunks: list[dict[str, Any]], *, done: bool = True) -> Reply:
    return sse_reply(chunks, done=done)


def cut_response(chunks: list[dict[str, Any]]) -> Cut:
    return Cut(sse(chunks, done=False))


def error_response(status: int, body: Any = None, headers: dict[str, str] | None = None) -> Reply:
    if body is None:
        body = {"object": "error", "message": f"status {status}", "type": "Error", "code": status}
    return json_reply(status, body, headers)


OK_CHUNKS = [
    chunk(role="assistant", content=""),
    chunk(content="Hello"),
    chunk(content=" world", finish="stop"),
    chunk(choices=False, usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}),
]


class FixedRandom:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


class SleepRecorder:
    """Records the backoff waits instead of sleeping."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def closed_port_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def make_client(
    url: str,
    *,
    sampling: Sampling | None = None,
    retry: RetryPolicy | None = None,
    endpoint: Endpoint | None = None,
    clock: Callable[[], float] | None = None,
    **kw: Any,
) -> ChatClient:
    extra: dict[str, Any] = {"clock": clock} if clock is not None else {}
    return ChatClient(
        endpoint or Endpoint(url=url),
        model=MODEL,
        sampling=sampling or Sampling(),
        retry=retry or RetryPolicy(max_attempts=1, sleep=SleepRecorder()),
        **extra,
        **kw,
    )


MESSAGES = [{"role": "user", "content": "Say hello"}]


def complete(
    script: ScriptedServer,
    tools: list[dict[str, Any]] | None = None,
    *,
    messages: list[dict[str, Any]] | None = None,
    on_failure: Any = None,
    **client_kw: Any,
) -> Any:
    """Start ``script``, run one ``ChatClient.complete`` against it, stop it."""
    with script.running():
        client = make_client(script.url, **client_kw)

        async def go() -> Any:
            try:
                return await client.complete(
                    messages or MESSAGES, tools, sample_id="s:1", on_failure=on_failure
                )
            finally:
                await client.aclose()

        return asyncio.run(go())
