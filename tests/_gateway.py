"""A loopback gateway in front of a server, for the endpoint-fault tests: it passes every
request through (streams too) until told to refuse chat completions, the way a gateway whose
policy changed, whose key was rotated or which serves its own error page does; the model list,
``/server_info`` and the health routes keep passing through (so the start-up check passes).
It also counts the chat requests it holds at once (``peak``), which is what a server sharing
its slots with regen sees, and keeps each chat request's arrival time and body
(``received``). Served like tests/_scripted.py's loopback server (a daemon
thread, a free 127.0.0.1 port).
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass

import aiohttp
from _scripted import ScriptedServer
from aiohttp import web

#: headers passed through to the server (the key included: a gateway forwards it)
FORWARDED = ("Authorization", "Content-Type", "Accept")


@dataclass(slots=True)
class Refusal:
    """What the gateway answers a refused chat request."""

    status: int = 403
    body: bytes = b'{"error": {"message": "blocked by gateway policy", "code": 403}}'
    content_type: str = "application/json"


HTML_PAGE = Refusal(
    200,
    b"<!DOCTYPE html>\n<html><head><title>Sign in - Corp Gateway</title></head>"
    b"<body>Please sign in to continue.</body></html>\n",
    "text/html; charset=utf-8",
)


class Gateway(ScriptedServer):
    """``refuse_after``: chat requests passed through before it refuses every later one (None:
    none refused); ``refusal``: how it refuses. ``url`` is the ``/v1`` base URL; ``running()``
    serves it (tests/_scripted.py's loopback server, with this handler)."""

    cancel_on_disconnect = True  #: regen cancelling a stream lets the server know

    def __init__(self, upstream: str) -> None:
        super().__init__()
        self.upstream = upstream.rstrip("/")
        self.refuse_after: int | None = None
        self.refusal = Refusal()
        self.chat = 0  #: chat requests received
        self.refused = 0  #: chat requests refused
        self.in_flight = 0
        self.peak = 0  #: most chat requests passed through at once
        #: every chat request received: (time.monotonic(), its request body)
        self.received: list[tuple[float, dict]] = []

    def heal(self) -> None:
        self.refuse_after = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        chat = request.path.endswith("/chat/completions")
        if chat:
            self.chat += 1
            self.received.append((time.monotonic(), json.loads(body)))
            if self.refuse_after is not None and self.chat > self.refuse_after:
                self.refused += 1
                r = self.refusal
                return web.Response(status=r.status, body=r.body,
                                    headers={"Content-Type": r.content_type})  # fmt: skip
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        done = [not chat]  # the answer is over once [DONE] is on its way: a client may reuse
        try:  # its slot as soon as it reads it, before this handler returns
            return await self._forward(request, body, done)
        finally:
            if not done[0]:
                self.in_flight -= 1

    async def _forward(
        self, request: web.Request, body: bytes, done: list[bool]
    ) -> web.StreamResponse:
        headers = {k: request.headers[k] for k in FORWARDED if k in request.headers}
        url = f"{self.upstream}{request.path_qs}"
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http,
            http.request(request.method, url, data=body, headers=headers) as up,
        ):
            ctype = up.headers.get("Content-Type", "application/octet-stream")
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": ctype})
            await resp.prepare(request)
            with contextlib.suppress(ConnectionError):  # the client went away (cancelled)
                async for piece in up.content.iter_any():
                    if not done[0] and b"[DONE]" in piece:
                        done[0] = True
                        self.in_flight -= 1
                    await resp.write(piece)
                await resp.write_eof()
            return resp
