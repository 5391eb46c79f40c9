"""Assemble one streamed chat completion from its SSE lines, on plain dicts.

The SDK's typed chunk objects cost ~20 µs of model construction per token; a ~400-token answer
would spend more CPU there than anywhere else, so the stream is read as raw lines and each
``data:`` line is decoded with ``json.loads``. One ``data:`` line is one event (every
OpenAI-compatible server writes one JSON object per line); ``data: [DONE]`` ends the stream;
comments, ``event:`` and ``id:`` lines are ignored. A chunk carrying ``error`` raises the
matching regen error (see :func:`regen.client.errors.stream_error`).

Usage is taken from whichever chunk carries it: SGLang's last chunk with ``choices: []`` or the
``finish_reason`` chunk (``transformers serve``). Reasoning is ``delta.reasoning_content``
(SGLang) or ``delta.reasoning``. Tool calls are assembled by ``index`` from their deltas.

SGLang's extension object ``sglext`` arrives in a chunk of its own (``choices: []``) after the
finish chunk and before usage: ``input_ids`` (the prompt ids, asked with
``return_input_ids_in_sglext``), ``output_ids`` (one list per choice, asked with
``return_output_ids_in_sglext``: the ids the model produced, before any reasoning or tool-call
parsing) and ``spec_tokens_details`` (``return_spec_tokens_details``). Servers that frame the
ids as ``event: sglext_ids`` (header ``x-sglext-ids-framed``) still send them as a ``data:``
line, which is all that is read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from regen.client.errors import stream_error
from regen.sample import ToolCall


@dataclass(slots=True)
class _ToolCallParts:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class StreamAccumulator:
    """State of one streamed answer; feed it lines with :meth:`feed_line`."""

    endpoint: str | None = None
    clock: Callable[[], float] = time.monotonic  #: read once, at the first token
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tools: dict[int, _ToolCallParts] = field(default_factory=dict)
    finish_reason: str | None = None
    model: str = ""
    usage: dict[str, Any] | None = None
    first_token_at: float | None = None
    chunks: int = 0
    done: bool = False
    prompt_ids: list[int] | None = None  #: sglext.input_ids
    output_ids: list[int] | None = None  #: sglext.output_ids[0]
    spec: dict[str, Any] | None = None  #: sglext.spec_tokens_details

    def feed_line(self, line: str) -> None:
        """One line of the SSE body."""
        if line.startswith("data:"):
            self._payload(line[5:].strip(), "[DONE]")

    def feed_bytes(self, line: bytes) -> None:
        """One line of the SSE body, undecoded (:mod:`regen.client.transport` feeds these)."""
        if line.startswith(b"data:"):
            self._payload(line[5:].strip(), b"[DONE]")

    def _payload(self, payload: str | bytes, done_marker: str | bytes) -> None:
        """The data of one SSE event: the end marker, an error object, or a chunk."""
        if not payload:
            return
        if payload == done_marker:
            self.done = True
            return
        data = json.loads(payload)  # str or bytes alike
        if not isinstance(data, dict):
            return
        if data.get("error") is not None:
            raise stream_error(data["error"], endpoint=self.endpoint)
        self.add(data)

    def add(self, data: dict[str, Any]) -> None:
        """One decoded chunk."""
        self.chunks += 1
        model = data.get("model")
        if model:
            self.model = model
        usage = data.get("usage")
        if usage:
            self.usage = usage
        ext = data.get("sglext")
        if ext:
            self._sglext(ext)
        for choice in data.get("choices") or ():
            if choice.get("index", 0) not in (0, None):
                continue
            delta = choice.get("delta") or {}
            got = False
            text = delta.get("content")
            if text:
                self.content.append(text)
                got = True
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(thought, str) and thought:
                self.reasoning.append(thought)
                got = True
            for tc in delta.get("tool_calls") or ():
                parts = self.tools.setdefault(tc.get("index") or 0, _ToolCallParts())
                if tc.get("id"):
                    parts.id = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    parts.name += fn["name"]
                args = fn.get("arguments")
                if args:
                    parts.arguments.append(args if isinstance(args, str) else json.dumps(args))
                got = True
            if got and self.first_token_at is None:
                self.first_token_at = self.clock()
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _sglext(self, ext: dict[str, Any]) -> None:
        ids = ext.get("input_ids")
        if isinstance(ids, list):
            self.prompt_ids = ids
        outs = ext.get("output_ids")
        if isinstance(outs, list) and outs and isinstance(outs[0], list):
            self.output_ids = outs[0]  # one list per choice; regen asks for n=1
        spec = ext.get("spec_tokens_details")
        if isinstance(spec, list):  # n > 1 sends one per choice
            spec = spec[0] if spec else None
        if isinstance(spec, dict):
            self.spec = spec

    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(
            ToolCall(id=p.id, name=p.name, arguments="".join(p.arguments))
            for _, p in sorted(self.tools.items())
        )

    def usage_fields(self) -> dict[str, int | None]:
        return usage_fields(self.usage)


def usage_fields(usage: dict[str, Any] | None) -> dict[str, int | None]:
    """TurnResult's usage fields from a usage mapping (OpenAI and SGLang spellings)."""
    if not usage:
        return {}
    details = usage.get("completion_tokens_details") or {}
    reasoning = details.get("reasoning_tokens")
    if reasoning is None:
        reasoning = usage.get("reasoning_tokens")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return {
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "reasoning_tokens": reasoning,
        "cached_tokens": cached,
    }
