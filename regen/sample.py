"""Record types that flow from sources to the engine: messages, samples, rejections.

A :class:`Sample` is one conversation from one source with a stable id. Its id survives a
reordering of the source: it is the upstream id when the source has one, else a hash of the
normalized conversation. ``content_hash`` is source-independent and drives cross-source dedup.
"""

from __future__ import annotations

import functools
import hashlib
import json
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
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

    def __reduce__(self) -> tuple[Any, ...]:
        return (ToolCall, (self.id, self.name, self.arguments))

    def to_openai(self) -> dict[str, Any]:
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

    def __reduce__(self) -> tuple[Any, ...]:
        return (Message, (self.role, self.content, self.reasoning, self.tool_calls,
                          self.tool_call_id, self.name))  # fmt: skip

    def to_openai(self) -> dict[str, Any]:
        """The message as an OpenAI chat-completions request message."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
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
    def from_openai(cls, d: dict[str, Any]) -> Message:
        calls = tuple(
            ToolCall(
                id=c.get("id") or "",
                name=c["function"]["name"],
                arguments=c["function"]["arguments"]
                if isinstance(c["function"]["arguments"], str)
                else json.dumps(c["function"]["arguments"], ensure_ascii=False),
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


@dataclass(slots=True)
class Sample:
    """One conversation to regenerate (or a native pre-tokenized row to pass through)."""

    id: str  #: stable id: "{source}:{upstream id}" or "{source}:h{hash}"
    source: str  #: manifest source name
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None  #: OpenAI tool declarations
    mode: Mode = "regenerate"
    turns: Turns = "all"  #: which assistant turns to regenerate
    input_ids: list[int] | None = None  #: native rows only
    loss_mask: list[int] | None = None  #: native rows only
    row: int = -1  #: row number in the source (for error messages; not part of identity)
    meta: dict[str, Any] = field(default_factory=dict)
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
                payload: Any = {"ids": self.input_ids, "mask": self.loss_mask}
            else:
                payload = {"m": [normalized_message(m) for m in self.messages], "t": self.tools}
            self._hash = stable_hash(payload)
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:  # plain tuples pickle ~3x faster (queue, Ray)
        return (Sample, (self.id, self.source, self.messages, self.tools, self.mode, self.turns,
                         self.input_ids, self.loss_mask, self.row, self.meta))  # fmt: skip

    @property
    def attempt(self) -> int:
        """0 for a sample's first answer; n for its n-th new attempt (``regen run
        --retry-flagged``, regen.engine.attempts), kept in ``meta``."""
        return int(self.meta.get(ATTEMPT_META, 0))

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
def normalized_message(m: Message) -> dict[str, Any]:
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


def stable_hash(payload: Any, n: int = 16) -> str:
    """Hex sha256 (first ``n`` chars) of a canonical JSON rendering of ``payload``."""
    raw = json.dumps(payload, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:n]


def make_sample_id(source: str, upstream_id: Any | None, messages: list[Message]) -> str:
    """Stable id: the upstream id when the source has one, else a hash of the conversation."""
    if upstream_id is not None and str(upstream_id).strip():
        return f"{source}:{str(upstream_id).strip()}"
    return f"{source}:h{stable_hash([normalized_message(m) for m in messages])}"
