"""Record types that flow from sources to the engine: messages, samples, rejections.

A :class:`Sample` is one conversation from one source with a stable id. Its id survives a
reordering of the source: it is the upstream id when the source has one, else a hash of the
normalized conversation. ``content_hash`` is source-independent and drives cross-source dedup.

Text that is not valid Unicode: a JSON escape such as ``"\\ud800"`` decodes to a lone
surrogate, a Python ``str`` that no UTF-8 encoder accepts (hashing, Parquet, the journal, a
request body all encode). regen's one rule: such a string is never passed on. A source row
holding one is skipped as ``invalid_unicode`` (regen.sources.reader, naming the field) and an
answer holding one fails its sample (regen.client.chat); :func:`unencodable_field` finds them
and :func:`scrub` makes diagnostic text (error messages, never data) safe to write.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Literal

from regen.core.chat import MessageJson, Role, ToolCallJson, ToolSpec
from regen.core.jsontext import JsonValue

ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})
Mode = Literal["regenerate", "native"]
Turns = Literal["all", "last"]
#: the ``Sample.meta`` key holding a new attempt's number (see :attr:`Sample.attempt`)
ATTEMPT_META = "regen.attempt"


@dataclass(slots=True, frozen=True)
class ToolCall:
    """One function call made by an assistant turn. ``arguments`` is a JSON string."""

    id: str
    name: str
    arguments: str

    def __reduce__(self) -> tuple[type[ToolCall], tuple[str, str, str]]:
        return (ToolCall, (self.id, self.name, self.arguments))

    def to_openai(self) -> ToolCallJson:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(slots=True, frozen=True)
class Message:
    """One chat message. ``reasoning`` is the assistant's thinking, kept apart from content."""

    role: Role
    content: str
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def __reduce__(self) -> tuple[type[Message], tuple[object, ...]]:
        return (Message, (self.role, self.content, self.reasoning, self.tool_calls,
                          self.tool_call_id, self.name))  # fmt: skip

    def to_openai(self) -> MessageJson:
        """The message as an OpenAI chat-completions request message."""
        out: MessageJson = {"role": self.role, "content": self.content}
        if self.reasoning is not None:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_openai(cls, d: MessageJson) -> Message:
        calls = tuple(
            ToolCall(
                id=c.get("id") or "",
                name=c["function"]["name"],
                arguments=_arguments_text(c["function"]["arguments"]),
            )
            for c in d.get("tool_calls") or ()
        )
        return cls(
            role=d["role"],
            content=d.get("content") or "",
            reasoning=d.get("reasoning_content"),
            tool_calls=calls,
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
        )


def _arguments_text(arguments: object) -> str:
    """A call's arguments as JSON text (arguments that are not text are dumped as JSON)."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


@dataclass(slots=True)
class Sample:
    """One conversation to regenerate (or a native pre-tokenized row to pass through)."""

    id: str  #: stable id: "{source}:{upstream id}" or "{source}:h{hash}"
    source: str  #: manifest source name
    messages: list[Message]
    tools: list[ToolSpec] | None = None  #: OpenAI tool declarations
    mode: Mode = "regenerate"
    turns: Turns = "all"  #: which assistant turns to regenerate
    input_ids: list[int] | None = None  #: native rows only
    loss_mask: list[int] | None = None  #: native rows only
    row: int = -1  #: row number in the source (for error messages; not part of identity)
    meta: dict[str, JsonValue] = field(default_factory=dict)
    #: where the row lives in a local JSONL source: (byte offset, length) of its line; set by
    #: the reader for the plan index, not part of identity, not pickled
    loc: tuple[int, int] | None = field(default=None, repr=False, compare=False)
    _hash: str | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def content_hash(self) -> str:
        """Source-independent hash of the normalized conversation (dedup key; computed once:
        a sample's conversation is not changed after it was read)."""
        if self._hash is None:
            if self.input_ids is not None:
                payload: object = {"ids": self.input_ids, "mask": self.loss_mask}
            else:
                payload = {"m": [normalized_message(m) for m in self.messages], "t": self.tools}
            self._hash = stable_hash(payload)
        return self._hash

    # plain tuples pickle ~3x faster (queue, Ray)
    def __reduce__(self) -> tuple[type[Sample], tuple[object, ...]]:
        return (Sample, (self.id, self.source, self.messages, self.tools, self.mode, self.turns,
                         self.input_ids, self.loss_mask, self.row, self.meta))  # fmt: skip

    @property
    def attempt(self) -> int:
        """0 for a sample's first answer; n for its n-th new attempt (``regen run
        --retry-flagged``, regen.plan.attempts), kept in ``meta``."""
        value = self.meta.get(ATTEMPT_META, 0)
        if not isinstance(value, int | float | str):
            raise TypeError(f"meta {ATTEMPT_META!r} is {type(value).__name__}, not a number")
        return int(value)

    def prompt_chars(self) -> int:
        """Characters of all non-assistant text (what a max-prompt filter bounds)."""
        return sum(len(m.content) for m in self.messages if m.role != "assistant")

    def assistant_turns(self) -> int:
        return sum(1 for m in self.messages if m.role == "assistant")

    def original_chars(self) -> int:
        """Mean characters of the source's own answers to the turns to regenerate (content,
        reasoning and tool calls; 0 when there is none): another model's answer to the same
        prompt, the best predictor of how long the target's answer will be."""
        if self.mode == "native":
            return 0
        answers = [m for m in self.messages if m.role == "assistant"]
        if self.turns == "last":
            answers = answers[-1:]
        sizes = [_answer_chars(m) for m in answers]
        sizes = [n for n in sizes if n > 0]
        return round(sum(sizes) / len(sizes)) if sizes else 0

    def invalid_text(self) -> tuple[str, str] | None:
        """(field, code point) of the first text of this sample that is not valid Unicode
        (a lone surrogate: see the module docstring), or None. Fields are named as in a
        request: ``messages[1].tool_calls[0].arguments``, ``tools[0].function.name``."""
        for i, m in enumerate(self.messages):
            for name in ("content", "reasoning", "name", "tool_call_id"):
                value = getattr(m, name)
                if value is not None and (bad := lone_surrogate(value)) is not None:
                    return f"messages[{i}].{name}", bad
            for j, c in enumerate(m.tool_calls):
                for name in ("id", "name", "arguments"):
                    if (bad := lone_surrogate(getattr(c, name))) is not None:
                        return f"messages[{i}].tool_calls[{j}].{name}", bad
        if self.tools and (hit := unencodable_field(self.tools, "tools")) is not None:
            return hit
        if (bad := lone_surrogate(self.id)) is not None:
            return "id", bad
        return unencodable_field(self.meta, "meta") if self.meta else None

    def turns_to_regenerate(self) -> int:
        """How many requests this sample needs (at least one for a prompt-only sample)."""
        if self.mode == "native":
            return 0
        n = self.assistant_turns()
        if self.turns == "last":
            return 1
        return max(n, 1)


@dataclass(slots=True, frozen=True)
class Rejection:
    """A row that a source could not turn into a sample, with a reason code for counting."""

    source: str
    row: int
    reason: str
    detail: str = ""
    field: str | None = None

    def __str__(self) -> str:
        where = f"source {self.source!r} row {self.row}"
        if self.field:
            where += f" field {self.field!r}"
        return f"{where}: {self.reason}" + (f" ({self.detail})" if self.detail else "")


def _answer_chars(m: Message) -> int:
    calls = sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
    return len(m.content) + len(m.reasoning or "") + calls


@functools.lru_cache(maxsize=256)
def normalized_message(m: Message) -> dict[str, str | list[list[str]] | None]:
    """The identity-relevant part of a message, with whitespace and Unicode normalized (cached:
    a row's id and its content hash normalize the same messages; do not mutate the result)."""
    return {
        "r": m.role,
        "c": _norm(m.content),
        "k": _norm(m.reasoning) if m.reasoning else None,
        "t": [[c.name, c.arguments] for c in m.tool_calls],
    }


def _norm(text: str) -> str:
    return " ".join(unicodedata.normalize("NFC", text).split())


def stable_hash(payload: object, n: int = 16) -> str:
    """Hex sha256 (first ``n`` chars) of a canonical JSON rendering of ``payload``."""
    raw = json.dumps(payload, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    # surrogatepass: the same bytes as UTF-8 for valid text, and hashing never fails on a
    # lone surrogate (such a row is rejected by its reader; this keeps the check honest)
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def make_sample_id(source: str, upstream_id: object, messages: list[Message]) -> str:
    """Stable id: the upstream id when the source has one, else a hash of the conversation."""
    if upstream_id is not None and str(upstream_id).strip():
        return f"{source}:{str(upstream_id).strip()}"
    return f"{source}:h{stable_hash([normalized_message(m) for m in messages])}"


#: a UTF-16 surrogate code point: in a Python str only a lone one (a pair decodes to one char)
_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(text: str) -> str | None:
    """The first lone surrogate of ``text`` as ``U+D800``, or None when it encodes as UTF-8."""
    if text.isascii():
        return None
    m = _SURROGATE.search(text)
    return None if m is None else f"U+{ord(m.group()):04X}"


def unencodable_field(value: object, path: str = "") -> tuple[str, str] | None:
    """(dotted field, code point) of the first string (or key) under ``value`` that holds a
    lone surrogate, or None. Paths read like the adapters' fields: ``conversations[2].value``."""
    if isinstance(value, str):
        bad = lone_surrogate(value)
        return None if bad is None else (path or "(value)", bad)
    if isinstance(value, dict):
        for k, v in value.items():
            where = f"{path}.{k}" if path else str(k)
            if isinstance(k, str) and (bad := lone_surrogate(k)) is not None:
                return (f"{path or '(top level)'} key {k!r}", bad)
            if isinstance(v, str | dict | list | tuple) and (hit := unencodable_field(v, where)):
                return hit
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            if isinstance(v, str | dict | list | tuple) and (
                hit := unencodable_field(v, f"{path}[{i}]")
            ):
                return hit
    return None


def scrub(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD: for diagnostics (error messages,
    warnings) that must be writable, never for data."""
    return text if lone_surrogate(text) is None else _SURROGATE.sub("\ufffd", text)
