"""The streaming fast path: ``POST {url}/chat/completions`` over aiohttp, SSE lines fed to a
:class:`regen.client.stream.StreamAccumulator` as bytes. Owns no files.

Why: through the OpenAI SDK and httpx2 every received piece of the body passes several layers
of async iterators, an anyio timeout scope and a text decoder; for a streamed answer of a few
hundred one-token chunks that cost more CPU than the rest of the request. Here the body is
read as it arrives (``iter_any``), split on newlines and each ``data:`` line is decoded with
one ``json.loads``. The request body is what the SDK would send (``extra_body`` merged at the
top level); the key goes in ``Authorization: Bearer``.

Used by :class:`regen.client.ChatClient` for streaming requests when no client factory is
injected (tests that inject an SDK client keep the SDK path). Errors map to the same regen
classes as the SDK path: HTTP status → :func:`regen.client.errors.status_error`; a connection
that fails before any chunk → ConnectError, after → StreamCutError; a read that stalls longer
than the timeout → RequestTimeoutError.
"""

from __future__ import annotations

import json
from typing import Any

from regen.client.errors import _body_message, status_error
from regen.client.stream import StreamAccumulator
from regen.errors import ConnectError, RequestTimeoutError, StreamCutError


class RawStreamer:
    """One aiohttp session per endpoint (created on first use, on the running loop)."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float) -> None:
        self.url = f"{base_url.rstrip('/')}/chat/completions"
        self.endpoint = base_url
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._session: Any = None

    def _ensure(self) -> Any:
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
    def body(kw: dict[str, Any]) -> bytes:
        """The JSON body of ``chat.completions.create(**kw)`` (extra_body merged)."""
        out = {k: v for k, v in kw.items() if k != "extra_body"}
        out.update(kw.get("extra_body") or {})
        return json.dumps(out, ensure_ascii=False).encode("utf-8")

    async def stream(self, kw: dict[str, Any], acc: StreamAccumulator) -> None:
        """Send one streaming request and feed every line to ``acc`` until [DONE] or the end."""
        import aiohttp

        session = self._ensure()
        try:
            async with session.post(self.url, data=self.body(kw)) as resp:
                if resp.status != 200:
                    raw = await resp.read()
                    try:
                        parsed: Any = json.loads(raw)
                    except ValueError:
                        parsed = raw.decode("utf-8", "replace")[:500]
                    raise status_error(
                        resp.status,
                        _body_message(parsed, resp.reason or ""),
                        endpoint=self.endpoint,
                        headers=resp.headers,
                        body=parsed,
                    )
                buf = b""
                feed = acc.feed_bytes
                async for piece in resp.content.iter_any():
                    buf += piece
                    if b"\n" not in piece:
                        continue
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        feed(line)
                    if acc.done:
                        return
                if buf:
                    feed(buf)
        except TimeoutError:
            raise RequestTimeoutError(
                f"request to {self.endpoint} timed out", endpoint=self.endpoint
            ) from None
        except aiohttp.ClientResponseError as e:
            raise status_error(e.status, e.message, endpoint=self.endpoint) from None
        except (aiohttp.ClientError, ConnectionError) as e:
            what = type(e).__name__
            if acc.chunks > 0:
                raise StreamCutError(
                    f"stream from {self.endpoint} cut mid-way ({what})", endpoint=self.endpoint
                ) from None
            raise ConnectError(
                f"cannot reach {self.endpoint} ({what})", endpoint=self.endpoint
            ) from None

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
