"""The one HTTP transport of chat requests: ``POST {url}/chat/completions`` over aiohttp.

Streaming and non-streaming requests both go through :class:`ChatTransport`; nothing else in
regen sends a chat request. A streamed body is read as it arrives (``iter_any``), split on
newlines, and each line is fed, undecoded, to a :class:`regen.client.stream.StreamAccumulator`
(text chunks of a shape it has seen take its fast path, every other ``data:`` line one
``json.loads``); a whole answer is read and decoded once. The key goes
in ``Authorization: Bearer`` and nowhere else. Owns no files.

Errors map to the regen taxonomy (:mod:`regen.client.errors`): an HTTP status →
``status_error`` (503 → OverloadedError, 429 → RateLimitedError, ...); a connection that fails
before any chunk → ConnectError, after → StreamCutError (so does a stream that ends inside its
last line); a read that stalls longer than the timeout → RequestTimeoutError; an ``error``
object inside a stream → ``stream_error`` (raised by
the accumulator). An answer that is not the protocol → ``NotProtocolError`` (an endpoint fault,
named with its content type and an excerpt): HTTP 200 to a streamed request whose body is no
server-sent event stream (an HTML page; the body decides, so a stream sent with another content
type still reads), or a non-streamed answer that is not a JSON object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from regen.client.errors import body_message, map_error, not_protocol, status_error, stream_error
from regen.client.stream import StreamAccumulator
from regen.core.errors import MalformedAnswerError, RegenError, StreamCutError
from regen.quality.loop import LoopWatch

if TYPE_CHECKING:
    from aiohttp import ClientResponse, ClientSession

#: bytes of an answer that is not the protocol read to name it
PROBE_BYTES = 4096
#: how the lines of a server-sent event stream start (anything else: not one)
SSE_FIELDS = (b"data:", b":", b"event:", b"id:", b"retry:")


class Pieces(Protocol):
    """What counts a stream's pieces as they arrive (a regen.engine.stall.Beat)."""

    n: int


#: a request's JSON body
Body = Mapping[str, object]


def _not_sse(head: bytes, *, whole: bool = False) -> bool:
    """Whether the first bytes of a body are not a server-sent event stream, judged on its
    first complete non-empty line (``whole``: ``head`` is the whole body, its last line too;
    else a line not yet ended may be cut mid-field and decides nothing)."""
    lines = head.split(b"\n")
    if not whole:
        lines = lines[:-1]
    first = next((line.strip() for line in lines if line.strip()), b"")
    return bool(first) and not first.startswith(SSE_FIELDS)


class ChatTransport:
    """One aiohttp session per endpoint (created on first use, on the running loop)."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float, *, shown: str) -> None:
        self.url = f"{base_url.rstrip('/')}/chat/completions"
        #: the URL errors name (never user:password)
        self.endpoint = shown
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._session: ClientSession | None = None

    def _ensure(self) -> ClientSession:
        if self._session is None or self._session.closed:
            import aiohttp

            timeout = aiohttp.ClientTimeout(
                total=None, connect=min(self.timeout_s, 30.0), sock_read=self.timeout_s
            )
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
            self._session = aiohttp.ClientSession(
                timeout=timeout, connector=connector, headers=self.headers
            )
        return self._session

    @staticmethod
    def encode(body: Body) -> bytes:
        return json.dumps(body, ensure_ascii=False).encode("utf-8")

    async def _refuse(self, resp: ClientResponse) -> None:
        """Raise the taxonomy error of a non-200 answer (its JSON body read when it has one)."""
        raw = await resp.read()
        parsed: object
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw.decode("utf-8", "replace")[:500]
        raise status_error(
            resp.status,
            body_message(parsed, resp.reason or ""),
            endpoint=self.endpoint,
            headers=resp.headers,
            body=parsed,
        )

    async def stream(
        self,
        body: Body,
        acc: StreamAccumulator,
        beat: Pieces | None = None,
        watch: LoopWatch | None = None,
    ) -> None:
        """Send one streaming request; feed every line to ``acc`` until [DONE] or the end.
        ``beat`` (a regen.engine.stall.Beat): its ``n`` counts the pieces received.
        ``watch``: looks at the answer every few tokens; when it loops the connection is
        closed (the server aborts the request) and ``acc.looped`` set."""
        session = self._ensure()
        headers = {"Accept": "text/event-stream"}
        try:
            async with session.post(self.url, data=self.encode(body), headers=headers) as resp:
                if resp.status != 200:
                    await self._refuse(resp)
                ctype = resp.headers.get("Content-Type", "")
                sse = ctype.lower().startswith("text/event-stream")
                buf = head = b""
                feed = acc.feed_bytes
                async for piece in resp.content.iter_any():
                    if beat is not None:
                        beat.n += 1
                    if len(head) < PROBE_BYTES:
                        head += piece[:PROBE_BYTES]
                        if not sse and _not_sse(head):  # not an event stream (its body decides)
                            await self._not_stream(resp, ctype, head)
                    buf += piece
                    if b"\n" not in piece:
                        continue
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        feed(line)
                        if acc.done:  # nothing after [DONE] is read
                            return
                    if (watch is not None and acc.finish_reason is None
                            and watch.due(n := acc.tokens()) and watch.loops(acc, n)):  # fmt: skip
                        acc.looped = True
                        resp.close()  # the connection goes: the server aborts the request
                        return
                if buf:  # the last line had no line break: whole, or cut with the stream
                    try:
                        feed(buf)
                    except MalformedAnswerError:
                        raise StreamCutError(f"stream from {self.endpoint} ended mid-line",
                                             endpoint=self.endpoint) from None  # fmt: skip
                if not acc.chunks and _not_sse(head, whole=len(head) < PROBE_BYTES):
                    await self._not_stream(resp, ctype, head)
        except RegenError:
            raise
        except Exception as e:
            raise map_error(e, endpoint=self.endpoint, received=acc.chunks > 0) from None

    async def _not_stream(self, resp: ClientResponse, ctype: str, head: bytes) -> None:
        """HTTP 200 to a streamed request, but the body (``head``: its start) is no event
        stream: an error object (some servers answer so) raises its error, anything else is
        not the protocol."""
        raw = head + await resp.content.read(PROBE_BYTES)
        parsed: object
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("error") is not None:
            raise stream_error(parsed["error"], endpoint=self.endpoint)
        raise not_protocol(self.endpoint, "HTTP 200 to a streamed request", ctype, raw)

    async def complete(self, body: Body) -> dict[str, object]:
        """Send one non-streaming request; return the decoded JSON answer."""
        session = self._ensure()
        try:
            async with session.post(self.url, data=self.encode(body)) as resp:
                if resp.status != 200:
                    await self._refuse(resp)
                raw = await resp.read()
                ctype = resp.headers.get("Content-Type", "")
        except RegenError:
            raise
        except Exception as e:
            raise map_error(e, endpoint=self.endpoint) from None
        data: object
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise not_protocol(self.endpoint, "HTTP 200 without a JSON object", ctype, raw)
        if data.get("error") is not None:  # an error object with HTTP 200
            raise stream_error(data["error"], endpoint=self.endpoint)
        return data

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
