"""The :class:`EngineProfile` interface (one subclass per engine; see the package docstring)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from regen.client.http import JsonGetter
from regen.client.server_load import MetricNames

if TYPE_CHECKING:
    from regen.client.stream import StreamAccumulator

#: where a row's ids came from, as run.json records it: SGLang's stream extension, SGLang's
#: non-streamed fields, vLLM's return_token_ids (streamed or not), or no server ids at all
TokenPath = Literal["sglext", "sglang_nonstream", "vllm_stream", "vllm_nonstream", "local"]

#: (prompt ids, output ids); either None when the server did not send it
Ids = tuple[list[int] | None, list[int] | None]


def id_list(value: object) -> list[int] | None:
    """``value`` when it is a list of ints, else None (a server's ids are never trusted blind)."""
    if isinstance(value, list) and all(
        isinstance(x, int) and not isinstance(x, bool) for x in value
    ):
        return list(value)
    return None


@dataclass(slots=True)
class Identity:
    """What a server said about itself at the endpoint check (its engine's own endpoints)."""

    engine: str  #: the profile's name
    version: str | None = None
    #: the batch slots the server reported and the field they came from (None: not reported)
    max_running_requests: int | None = None
    slots_source: str | None = None
    #: requests the server's waiting queue holds before it refuses with 503 (SGLang's
    #: ``--max-queued-requests``, over its data-parallel ranks; None: no limit reported)
    max_queued_requests: int | None = None
    #: whether a request's seed is honoured (SGLang: --enable-deterministic-inference)
    deterministic: bool | None = None
    #: the speculative settings the server exposes (names as the engine spells them)
    speculative: dict[str, object] = field(default_factory=dict)
    server_info: bool = False  #: SGLang's /server_info answered


async def get_json(http: JsonGetter, url: str, headers: dict[str, str]) -> object:
    """``GET url`` decoded as JSON; None when unreachable, not 200 or not JSON."""
    try:
        resp = await http.get(url, headers=headers)
    except Exception:  # unreachable or refused: this engine's endpoint is not there
        return None
    if resp.status_code != 200:
        return None
    try:
        return resp.json()
    except ValueError:
        return None


async def get_text(http: JsonGetter, url: str, headers: dict[str, str]) -> str | None:
    """``GET url`` as text; None when unreachable or not 200."""
    try:
        resp = await http.get(url, headers=headers)
    except Exception:  # unreachable or refused: this engine's endpoint is not there
        return None
    return resp.text if resp.status_code == 200 else None


class EngineProfile:
    """What one engine needs in a request and gives in an answer. Subclasses override."""

    #: the engine's name in run.json, rows and messages: "sglang", "vllm", "openai"
    name: str = "openai"
    #: the server can return the exact prompt and output ids
    gives_ids: bool = False
    #: the field a non-streamed message (and a streamed delta) carries reasoning in; regen
    #: reads either spelling from any server, this is what the engine writes
    reasoning_field: str = "reasoning_content"
    #: whether a request's ``seed`` is honoured without a server flag (SGLang needs
    #: --enable-deterministic-inference; vLLM seeds each request)
    seeds_requests: bool = False
    #: where its ``/metrics`` page says how loaded the server is (None: no page regen reads)
    metrics: MetricNames | None = None

    def ids_fields(self, streaming: bool) -> dict[str, object]:
        """The request fields that ask for the exact ids (``{}``: the engine has none)."""
        return {}

    def token_path(self, streaming: bool) -> TokenPath:
        """How a row's ids are obtained from this engine (recorded in run.json)."""
        return "local"

    def stream_ids(self, acc: StreamAccumulator) -> Ids:
        """The ids a finished stream carried (read from what the accumulator recorded)."""
        return None, None

    def whole_ids(self, data: Mapping[str, object], choice: Mapping[str, object]) -> Ids:
        """The ids of a non-streamed answer (``data``; ``choice`` is its first choice)."""
        return None, None

    async def identify(
        self, http: JsonGetter, root: str, headers: dict[str, str]
    ) -> Identity | None:
        """This engine's identity when the server at ``root`` is one (None: it is not)."""
        return None

    def __repr__(self) -> str:
        return f"<engine profile {self.name}>"

    def can_stream_ids(self) -> bool:
        """The ids can be had with streaming (else ``token_ids: stream`` goes non-streamed)."""
        return self.gives_ids
