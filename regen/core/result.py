"""What one request to an endpoint produced: passed from the client to the row builder."""

from __future__ import annotations

from dataclasses import dataclass

from regen.core.sample import ToolCall


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

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"
