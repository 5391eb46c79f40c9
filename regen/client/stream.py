"""Assemble one streamed chat completion from its SSE lines, on plain dicts.

The SDK's typed chunk objects cost ~20 µs of model construction per token; a ~400-token answer
would spend more CPU there than anywhere else, so the stream is read as raw lines and each
``data:`` line is decoded with ``json.loads``. One ``data:`` line is one event (every
OpenAI-compatible server writes one JSON object per line); ``data: [DONE]`` ends the stream;
comments, ``event:`` and ``id:`` lines are ignored. A chunk carrying ``error`` raises the
matching regen error (see :func:`regen.client.errors.stream_error`). A ``data:`` line that is
not a JSON object, or a field read here of the wrong type (text that is a number, a delta that
is a list, a count that is text), raises :class:`~regen.core.errors.MalformedAnswerError`
naming the field (:func:`typed`): no row is built from such an answer. Ids of the wrong type
are the profile's business (``id_list``: not ids).

The fast path: SGLang streams one token per chunk, and all the text chunks of one stream are
the same bytes around the token's JSON string (same id, created, model, keys). The first chunk
of each such shape is decoded in full; when it carried only text (one choice, index 0, a
non-empty ``content``, ``reasoning_content`` or ``reasoning`` string and nothing else that
:meth:`StreamAccumulator.add` reads), the bytes before and after that string are kept as a
:class:`_TextShape`, and proven to be one by decoding two probes (the string replaced by a
non-empty and an empty one) through the full path. A later line that starts and ends with a
kept shape's bytes is then that chunk with another string, so only the string is decoded, by
the ``json`` module's own string scanner (escapes and all); a string the scanner does not end
exactly at the shape's tail (an unescaped quote: another structure) or refuses goes to the full
parser. Every other line (role, finish, tool calls, ``sglext``, usage, errors, and any server
whose chunks differ in more than the string) is decoded in full.
tests/contract/test_stream_fast_path.py proves both paths give the same result on SGLang's own
serializer, the simulator and odd text.

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

vLLM's ids (``return_token_ids``) are recorded too: the ``prompt_token_ids`` of a chunk's top
level (vLLM's first chunk) and the ``token_ids`` list of each chunk's choice, concatenated in
stream order (a chunk whose delta is empty still carries its id). A chunk with ``token_ids``
never takes the fast path (its bytes differ from chunk to chunk). Which of these a row takes
is the engine profile's business (:mod:`regen.client.profiles`); the accumulator only records
what the wire said.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import TypedDict, TypeVar

from regen.client.errors import stream_error
from regen.core import jsontext
from regen.core.errors import MalformedAnswerError
from regen.core.sample import ToolCall

T = TypeVar("T")


class UsageCounts(TypedDict, total=False):
    """A :class:`regen.core.result.TurnResult`'s usage fields, as a server reported them."""

    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    cached_tokens: int | None
    cut_saved: int | None


@dataclass(slots=True)
class _ToolCallParts:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


#: text-chunk shapes learned per stream (content and reasoning: 2 in practice), and lines that
#: may try to teach one (a server whose chunks never repeat a shape stops paying after that)
MAX_SHAPES = 4
MAX_LEARN_TRIES = 8
#: the keys of a text delta, in the order :meth:`StreamAccumulator.add` reads them
_TEXT_KEYS = (("content", False), ("reasoning_content", True), ("reasoning", True))
_PROBE = "zq"


@dataclass(slots=True, frozen=True)
class _TextShape:
    """The bytes around the JSON string of one kind of text chunk (see the module docstring)."""

    head: bytes  #: up to and including the string's opening quote
    tail: bytes  #: from the string's closing quote to the end of the line
    reasoning: bool  #: the string is reasoning (else content)
    model: str  #: what the chunk sets ``model`` to ("" when it has none)


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
    usage: dict[str, object] | None = None
    first_token_at: float | None = None
    chunks: int = 0
    done: bool = False
    prompt_ids: list[int] | None = None  #: sglext.input_ids
    output_ids: list[int] | None = None  #: sglext.output_ids[0]
    spec: dict[str, object] | None = None  #: sglext.spec_tokens_details
    top_prompt_ids: list[int] | None = None  #: a chunk's top-level prompt_token_ids (vLLM)
    choice_ids: list[int] | None = None  #: the choices' token_ids, concatenated (vLLM)
    fast: bool = True  #: take text chunks of a known shape without a full parse
    fast_chunks: int = 0  #: chunks the fast path took
    looped: bool = False  #: regen closed the stream: the answer loops (regen.quality.loop)
    _shapes: list[_TextShape] = field(default_factory=list)
    _tries: int = 0

    def feed_line(self, line: str) -> None:
        """One line of the SSE body."""
        if line.startswith("data:"):
            self._payload(line[5:].strip(), "[DONE]")

    def feed_bytes(self, line: bytes) -> None:
        """One line of the SSE body, undecoded (:mod:`regen.client.transport` feeds these)."""
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            for shape in self._shapes:
                if self._take(shape, payload):
                    return
            data = self._payload(payload, b"[DONE]")
            if data is not None and self.fast and self._tries < MAX_LEARN_TRIES:
                self._learn(payload, data)

    def _payload(self, payload: str | bytes, done_marker: str | bytes) -> dict[str, object] | None:
        """The data of one SSE event: the end marker, an error object, or a chunk (returned)."""
        if not payload:
            return None
        if payload == done_marker:
            self.done = True
            return None
        try:
            data = jsontext.loads(payload)  # str or bytes alike
        except ValueError:
            raise MalformedAnswerError(
                f"answer from {self.endpoint}: an event that is not JSON: {_excerpt(payload)}",
                endpoint=self.endpoint,
            ) from None
        event = self._typed(data, dict, "an event")
        if event is None:
            raise MalformedAnswerError(f"answer from {self.endpoint}: an event that is null",
                                       endpoint=self.endpoint)  # fmt: skip
        if event.get("error") is not None:
            raise stream_error(event["error"], endpoint=self.endpoint)
        self.add(event)
        return event

    def _take(self, shape: _TextShape, payload: bytes) -> bool:
        """Apply ``payload`` as a text chunk of ``shape``; False when it is not one."""
        head, tail = shape.head, shape.tail
        if not (payload.startswith(head) and payload.endswith(tail)):
            return False
        if len(payload) < len(head) + len(tail):  # head and tail overlap: not this shape
            return False
        try:
            # what json.loads does to bytes (UTF-8, surrogatepass), then its string scanner
            raw = payload[len(head) : len(payload) - len(tail) + 1].decode("utf-8", "surrogatepass")
            text, end = scanstring(raw, 0, True)
        except ValueError:  # UnicodeDecodeError, JSONDecodeError: the full parser decides
            return False
        if end != len(raw):  # an unescaped quote inside: another structure
            return False
        self.chunks += 1
        self.fast_chunks += 1
        if shape.model:
            self.model = shape.model
        if text:
            (self.reasoning if shape.reasoning else self.content).append(text)
            if self.first_token_at is None:
                self.first_token_at = self.clock()
        return True

    def _learn(self, payload: bytes, data: dict[str, object]) -> None:
        """Keep the shape of ``payload`` when it is a text chunk that probes prove to be one."""
        choices = data.get("choices")
        if not (isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict)):
            return
        delta = choices[0].get("delta")
        if not isinstance(delta, dict):
            return
        found = [(k, r, v) for k, r in _TEXT_KEYS if isinstance(v := delta.get(k), str) and v]
        if not found:
            return
        key, reasoning, value = found[0]
        self._tries += 1
        marker = f'"{key}":"'.encode()
        at = payload.find(marker)
        if at < 0 or payload.find(marker, at + 1) >= 0:
            return
        start = at + len(marker)
        try:
            rest = payload[start:].decode("utf-8", "surrogatepass")
            text, end = scanstring(rest, 0, True)
        except ValueError:
            return
        if text != value:
            return
        cut = start + len(rest[: end - 1].encode("utf-8", "surrogatepass"))
        model = data.get("model")
        shape = _TextShape(payload[:start], payload[cut:], reasoning, str(model) if model else "")
        if all(self._probe(shape, probe) for probe in (_PROBE, "")):
            self._shapes.append(shape)
            if len(self._shapes) >= MAX_SHAPES:
                self._tries = MAX_LEARN_TRIES

    @staticmethod
    def _probe(shape: _TextShape, value: str) -> bool:
        """The full path on the shape with ``value`` does exactly what :meth:`_take` does."""
        full = StreamAccumulator(clock=lambda: 0.0, fast=False)
        try:
            full.feed_bytes(b"data: " + shape.head + value.encode() + shape.tail)
        except Exception:
            return False
        text = [value] if value else []
        return (
            full.chunks == 1
            and full.content == ([] if shape.reasoning else text)
            and full.reasoning == (text if shape.reasoning else [])
            and full.model == shape.model
            and (full.first_token_at is not None) == bool(value)
            and not full.tools
            and full.finish_reason is None
            and full.usage is None
            and full.prompt_ids is None
            and full.output_ids is None
            and full.spec is None
            and full.top_prompt_ids is None
            and full.choice_ids is None
            and not full.done
        )

    def add(self, data: dict[str, object]) -> None:
        """One decoded chunk (:class:`MalformedAnswerError` for a field of the wrong type)."""
        self.chunks += 1
        model = self._typed(data.get("model"), str, "model")
        if model:
            self.model = model
        usage = self._typed(data.get("usage"), dict, "usage")
        if usage:
            self.usage = usage
        ext = self._typed(data.get("sglext"), dict, "sglext")
        if ext:
            self._sglext(ext)
        top = data.get("prompt_token_ids")
        if isinstance(top, list):
            self.top_prompt_ids = top
        for choice in self._typed(data.get("choices"), list, "choices") or ():
            choice = self._typed(choice, dict, "choices[]")
            if choice is None or choice.get("index", 0) not in (0, None):
                continue
            ids = choice.get("token_ids")
            if isinstance(ids, list):
                if self.choice_ids is None:
                    self.choice_ids = []
                self.choice_ids.extend(ids)
            delta = self._typed(choice.get("delta"), dict, "delta") or {}
            got = False
            text = self._typed(delta.get("content"), str, "delta.content")
            if text:
                self.content.append(text)
                got = True
            thought = self._typed(delta.get("reasoning_content") or delta.get("reasoning"), str,
                                  "delta.reasoning_content")  # fmt: skip
            if thought:
                self.reasoning.append(thought)
                got = True
            for tc in self._typed(delta.get("tool_calls"), list, "delta.tool_calls") or ():
                self._tool_call_delta(self._typed(tc, dict, "delta.tool_calls[]") or {})
                got = True
            if got and self.first_token_at is None:
                self.first_token_at = self.clock()
            finish = self._typed(choice.get("finish_reason"), str, "finish_reason")
            if finish:
                self.finish_reason = finish

    def _tool_call_delta(self, tc: dict[str, object]) -> None:
        index = self._typed(tc.get("index"), int, "tool_calls[].index") or 0
        parts = self.tools.setdefault(index, _ToolCallParts())
        if call_id := self._typed(tc.get("id"), str, "tool_calls[].id"):
            parts.id = call_id
        fn = self._typed(tc.get("function"), dict, "tool_calls[].function") or {}
        if name := self._typed(fn.get("name"), str, "tool_calls[].function.name"):
            parts.name += name
        args: object = fn.get("arguments")
        if isinstance(args, dict):  # some servers send the object itself
            args = json.dumps(args, ensure_ascii=False)
        if text := self._typed(args, str, "tool_calls[].function.arguments"):
            parts.arguments.append(text)

    def _typed(self, value: object, kind: type[T], where: str) -> T | None:
        """``value`` when it is None or a ``kind`` (:func:`typed`)."""
        return typed(value, kind, where, self.endpoint)

    def _sglext(self, ext: dict[str, object]) -> None:
        ids = ext.get("input_ids")
        if isinstance(ids, list):
            self.prompt_ids = ids
        outs = ext.get("output_ids")
        if isinstance(outs, list) and outs and isinstance(outs[0], list):
            self.output_ids = outs[0]  # one list per choice; regen asks for n=1
        spec: object = ext.get("spec_tokens_details")
        if isinstance(spec, list):  # n > 1 sends one per choice
            spec = spec[0] if spec else None
        if isinstance(spec, dict):
            self.spec = spec

    def tokens(self) -> int:
        """Tokens streamed so far, as regen counts them: the ids when the server streams them
        (vLLM's ``token_ids``), else the text pieces (SGLang sends one token per chunk)."""
        if self.choice_ids is not None:
            return len(self.choice_ids)
        return len(self.reasoning) + len(self.content)

    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(
            ToolCall(id=p.id, name=p.name, arguments="".join(p.arguments))
            for _, p in sorted(self.tools.items())
        )

    def usage_fields(self) -> UsageCounts:
        return usage_fields(self.usage, self.endpoint)


def usage_fields(usage: object, endpoint: str | None = None) -> UsageCounts:
    """TurnResult's usage fields from a usage mapping (OpenAI and SGLang spellings;
    :class:`MalformedAnswerError` for a count that is not an int)."""
    if not usage:
        return {}
    found = typed(usage, dict, "usage", endpoint) or {}

    def details(key: str) -> dict[str, object]:
        return typed(found.get(key), dict, f"usage.{key}", endpoint) or {}

    def count(value: object, key: str) -> int | None:
        return typed(value, int, f"usage.{key}", endpoint)

    reasoning = details("completion_tokens_details").get("reasoning_tokens")
    if reasoning is None:
        reasoning = found.get("reasoning_tokens")
    cached = details("prompt_tokens_details").get("cached_tokens")
    return {
        "prompt_tokens": count(found.get("prompt_tokens"), "prompt_tokens"),
        "completion_tokens": count(found.get("completion_tokens"), "completion_tokens"),
        "reasoning_tokens": count(reasoning, "reasoning_tokens"),
        "cached_tokens": count(cached, "cached_tokens"),
    }


def _excerpt(payload: str | bytes) -> str:
    text = payload if isinstance(payload, str) else payload.decode("utf-8", "replace")
    return repr(text[:80]) + ("..." if len(text) > 80 else "")


def typed(value: object, kind: type[T], where: str, endpoint: str | None) -> T | None:
    """``value`` when it is None or exactly a ``kind`` (decoded JSON holds no subclasses, and
    so a bool is no int); otherwise the answer is malformed (:class:`MalformedAnswerError`
    naming the field)."""
    if value is None:
        return None
    if type(value) is kind:
        return value
    raise MalformedAnswerError(
        f"answer from {endpoint}: {where} is {type(value).__name__}, not {kind.__name__}",
        endpoint=endpoint,
    )
