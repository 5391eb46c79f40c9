"""The HTTP GETs of regen's checks, as protocols: what the endpoint check, the engine profiles'
identity checks and the metrics pollers need of a client (an ``httpx2.AsyncClient``, the
pollers' aiohttp :class:`regen.client.server_load.PageClient`, or a test's fake). Owns no
files."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class TextReply(Protocol):
    """An answer: its status and its body as text."""

    @property
    def status_code(self) -> int: ...

    @property
    def text(self) -> str: ...


class JsonReply(TextReply, Protocol):
    """An answer whose body may be decoded as JSON (ValueError when it is not JSON)."""

    def json(self) -> object: ...


class TextGetter(Protocol):
    """``GET url`` with headers, answered as text."""

    async def get(self, url: str, *, headers: Mapping[str, str]) -> TextReply: ...


class JsonGetter(Protocol):
    """``GET url`` with headers, answered as JSON or text."""

    async def get(self, url: str, *, headers: Mapping[str, str]) -> JsonReply: ...


class JsonClient(JsonGetter, Protocol):
    """A :class:`JsonGetter` that is closed when done."""

    async def aclose(self) -> None: ...
