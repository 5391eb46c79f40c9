"""A scripted HTTP server on 127.0.0.1: answers request i with step i, for transport tests.

Where :mod:`regen.devkit.simulate.server` models SGLang, this one replays exactly what a test
scripts, byte for byte: a status with a JSON or SSE body (e.g. responses built and serialized
by SGLang's own models in tests/contract), a stream cut after some bytes, a stall before the
answer, or a connection dropped before any byte. Every request's path, headers and body are
recorded. It runs on an event loop in a daemon thread, so the client under test uses its
real aiohttp transport against a real socket. Owns no files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass(slots=True)
class Reply:
    """A whole answer: ``status``, raw ``body`` bytes, ``headers``."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})


@dataclass(slots=True)
class Cut:
    """HTTP 200, ``head`` written, then the connection is dropped mid-body."""

    head: bytes


@dataclass(slots=True)
class Stall:
    """Wait ``seconds`` before answering with ``then`` (a client with a shorter read timeout
    gives up first)."""

    seconds: float
    then: Reply = field(default_factory=Reply)


@dataclass(slots=True)
class Drop:
    """Close the connection before any byte of an answer."""


Step = Reply | Cut | Stall | Drop


def json_reply(status: int, body: Any, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, json.dumps(body).encode(), {"Content-Type": "application/json",
                                                     **(headers or {})})  # fmt: skip


def sse_reply(events: Sequence[str | dict[str, Any]], *, done: bool = True) -> Reply:
    """``data: {json}`` per event (a str is sent as is: the caller's own SSE text)."""
    parts = [e if isinstance(e, str) else f"data: {json.dumps(e)}\n\n" for e in events]
    if done:
        parts.append("data: [DONE]\n\n")
    return Reply(200, "".join(parts).encode(), dict(SSE_HEADERS))


@dataclass(slots=True)
class Recorded:
    """One request the server received."""

    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class ScriptedServer:
    """Plays ``steps`` in order (the last one repeats); ``url`` is the ``/v1`` base URL."""

    #: cancel a request's handler when its client hangs up (a proxy whose upstream hangs must
    #: let go of it; aiohttp's default lets the handler run on)
    cancel_on_disconnect = False

    def __init__(self, *steps: Step) -> None:
        self.steps: list[Step] = list(steps)
        self.requests: list[Recorded] = []
        self.base = ""

    @property
    def url(self) -> str:
        return f"{self.base}/v1"

    def bodies(self) -> list[Any]:
        return [r.json() for r in self.requests]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(Recorded(request.path, dict(request.headers), body))
        if not self.steps:
            return web.Response(status=500, text="no step scripted")
        step = self.steps[min(len(self.requests) - 1, len(self.steps) - 1)]
        if isinstance(step, Stall):
            await asyncio.sleep(step.seconds)
            step = step.then
        if isinstance(step, Drop):
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=200)
        if isinstance(step, Cut):
            resp = web.StreamResponse(headers=SSE_HEADERS)
            await resp.prepare(request)
            await resp.write(step.head)
            if request.transport is not None:
                request.transport.abort()
            return resp
        return web.Response(status=step.status, body=step.body, headers=step.headers)

    @contextlib.contextmanager
    def running(self, timeout_s: float = 10.0) -> Iterator[ScriptedServer]:
        """Serve on a free loopback port in a daemon thread until the block ends."""
        loop = asyncio.new_event_loop()
        started = threading.Event()
        stop: dict[str, asyncio.Event] = {}

        async def main() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                   handler_cancellation=self.cancel_on_disconnect)  # fmt: skip
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            self.base = f"http://{host}:{port}"
            stop["event"] = asyncio.Event()
            started.set()
            try:
                await stop["event"].wait()
            finally:
                await runner.cleanup()

        thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
        thread.start()
        try:
            if not started.wait(timeout_s):
                raise RuntimeError("scripted server did not start")
            yield self
        finally:
            if "event" in stop:
                loop.call_soon_threadsafe(stop["event"].set)
            thread.join(timeout=timeout_s)
            if not thread.is_alive():  # else a handler still holds it: the daemon thread ends
                loop.close()  # with the process
