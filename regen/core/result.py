"""What one request to an endpoint produced: passed from the client to the row builder.

A turn ends as the server ended it (``stop``, ``tool_calls``, ``length``: cut by
``max_tokens``) or as regen ended it: :data:`LOOP`, the stream closed because the answer was
looping (regen.quality.loop). :data:`UNFINISHED` are the reasons of a turn the model did not
finish: no end-of-turn token is added to its row and its conversation goes no further."""

from __future__ import annotations

from dataclasses import dataclass

from regen.core.sample import ToolCall

#: finish reason of a turn whose stream regen closed because it looped (regen.quality.loop)
LOOP = "loop"
#: finish reasons of a turn the model did not finish
UNFINISHED = frozenset({"length", LOOP})


@dataclass(slots=True)
class TurnResult:
    """One regenerated assistant turn, as the server returned it."""

    content: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str  #: "stop", "length", "tool_calls", ...
    model: str  #: model name the server reported
    endpoint: str  #: base URL of the endpoint that answered
    prompt_tokens: int | None = None  #: server-reported usage
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None
    prompt_token_ids: list[int] | None = None  #: when the server returned them
    output_token_ids: list[int] | None = None
    latency_s: float = 0.0  #: request start to last byte
    ttft_s: float | None = None  #: request start to first token (streaming)
    attempts: int = 1  #: tries it took, including this one
    engine: str | None = None  #: the engine profile that answered ("sglang", "vllm", "openai")
    engine_version: str | None = None  #: the version the server reported (None: none)
    #: a :data:`LOOP` turn: the tokens the cut spared the server (``max_tokens`` less those
    #: streamed: a loop runs to the cap); None for every other turn
    cut_saved: int | None = None

    @property
    def truncated(self) -> bool:
        """Cut by ``max_tokens``."""
        return self.finish_reason == "length"

    @property
    def unfinished(self) -> bool:
        """The model did not finish it (:data:`UNFINISHED`)."""
        return self.finish_reason in UNFINISHED
