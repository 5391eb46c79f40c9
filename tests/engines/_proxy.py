"""A recording pass-through proxy in front of a real server (loopback only).

``RecordingProxy(upstream_root)`` listens on a free 127.0.0.1 port in a thread of its own and
forwards every request unchanged to the upstream server, streaming the answer back as it
arrives. For each ``POST /v1/chat/completions`` it keeps an :class:`Exchange`: the request
body, the HTTP status and the exact bytes the server sent. The tests compare what regen stored
with those bytes: what the server returned, not what regen made of it.

``hold(after=n)`` lets the first ``n`` chat requests through and keeps every later one waiting
(unsent) until ``allow(k)`` lets ``k`` more through or ``release()`` lifts the hold: a crash
test then kills a run that cannot have finished, however fast the server is.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

from regen.devkit.servers.transformers import free_port

HOP = {"content-length", "transfer-encoding", "connection", "content-encoding"}


@dataclass(slots=True)
class Exchange:
    request: dict[str, Any]
    status: int = 0
    body: bytes = b""
    complete: bool = False

    def chunks(self) -> list[dict[str, Any]]:
        """The JSON of every ``data:`` line (streamed answers)."""
        out = []
        for line in self.body.decode("utf-8", "replace").splitlines():
            if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
                out.append(json.loads(line[5:]))
        return out

    def ids(self) -> tuple[list[int], list[int], str | None] | None:
        """(prompt ids, output ids, finish reason) of a finished answer, as the server sent
        them (vLLM's return_token_ids); None when it did not finish."""
        if self.status != 200:
            return None
        if self.request.get("stream"):
            chunks = self.chunks()
            if any("error" in c for c in chunks):
                return None
            prompt = next((c["prompt_token_ids"] for c in chunks if "prompt_token_ids" in c), None)
            out: list[int] = []
            finish = None
            for c in chunks:
                for ch in c.get("choices") or ():
                    out += ch.get("token_ids") or []
                    finish = ch.get("finish_reason") or finish
            return (prompt, out, finish) if prompt is not None and finish else None
        data = json.loads(self.body)
        choice = data["choices"][0]
        return data["prompt_token_ids"], choice["token_ids"], choice["finish_reason"]


@dataclass
class RecordingProxy:
    upstream: str  #: the upstream server's root, e.g. http://127.0.0.1:8000
    exchanges: list[Exchange] = field(default_factory=list)
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _limit: int | None = None
    _waiting: int = 0
    _gate: asyncio.Condition | None = None

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.root}/v1"

    def chat(self) -> list[Exchange]:
        with self._lock:
            return list(self.exchanges)

    @property
    def waiting(self) -> int:
        """Chat requests held back now."""
        return self._waiting

    def hold(self, after: int) -> None:
        """Forward the first ``after`` chat requests; hold every later one."""
        self._set_limit(after)

    def allow(self, more: int = 1) -> None:
        """Let ``more`` held (or future) chat requests through."""
        self._set_limit((self._limit or 0) + more)

    def release(self) -> None:
        """Lift the hold: every held request goes through."""
        self._set_limit(None)

    def _set_limit(self, limit: int | None) -> None:
        self._limit = limit
        if self._loop is not None and self._gate is not None:
            asyncio.run_coroutine_threadsafe(self._wake(), self._loop).result(30)

    async def _wake(self) -> None:
        assert self._gate is not None
        async with self._gate:
            self._gate.notify_all()

    async def _admit(self, index: int) -> None:
        assert self._gate is not None
        async with self._gate:
            self._waiting += 1
            try:
                await self._gate.wait_for(lambda: self._limit is None or index < self._limit)
            finally:
                self._waiting -= 1

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP | {"host"}}
        record = None
        if request.method == "POST" and request.path.endswith("/chat/completions"):
            record = Exchange(json.loads(raw))
            with self._lock:
                self.exchanges.append(record)
                index = len(self.exchanges) - 1
            await self._admit(index)
        async with (
            ClientSession(timeout=ClientTimeout(total=600)) as http,
            http.request(
                request.method, self.upstream + request.path_qs, data=raw, headers=headers
            ) as up,
        ):
            resp = web.StreamResponse(status=up.status, headers={
                k: v for k, v in up.headers.items() if k.lower() not in HOP})  # fmt: skip
            await resp.prepare(request)
            async for piece in up.content.iter_any():
                if record is not None:
                    record.body += piece
                await resp.write(piece)
            if record is not None:
                record.status = up.status
                record.complete = True
            await resp.write_eof()
            return resp

    def start(self) -> RecordingProxy:
        ready = threading.Event()
        self.port = free_port()

        async def main() -> None:
            self._gate = asyncio.Condition()
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
            ready.set()

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(main(), self._loop)
        if not ready.wait(30):
            raise RuntimeError("the recording proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(30)
        if self._thread is None or not self._thread.is_alive():
            self._loop.close()  # else a handler still holds it: the daemon thread ends with us
        self._loop = None

    def __enter__(self) -> RecordingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
