"""The OpenAI chat-completions JSON that regen writes and keeps, typed: a message, a tool call,
a tool declaration. Owns no files.

These are the shapes regen builds itself (:meth:`regen.core.sample.Message.to_openai`) or has
checked at the door (a source's tools pass :func:`regen.sources.shapes.check_tools` before they
become :attr:`regen.core.sample.Sample.tools`). JSON from outside that nothing has checked yet
(a row, a server's answer, what a chat template is handed) is a
:data:`regen.core.jsontext.JsonValue` or ``object`` until it is narrowed.
"""

from __future__ import annotations

from typing import Literal, NotRequired, Required, TypedDict

from regen.core.jsontext import JsonObject, JsonValue

Role = Literal["system", "user", "assistant", "tool"]


class FunctionCallJson(TypedDict):
    """A tool call's function: its name and its arguments as JSON text."""

    name: str
    arguments: str


class ToolCallJson(TypedDict):
    """One tool call of an assistant message."""

    id: str
    type: Literal["function"]
    function: FunctionCallJson


class MessageJson(TypedDict):
    """One request message (the optional keys only where the message has them)."""

    role: Role
    content: str
    reasoning_content: NotRequired[str]
    tool_calls: NotRequired[list[ToolCallJson]]
    tool_call_id: NotRequired[str]
    name: NotRequired[str]


class FunctionSpec(TypedDict, total=False):
    """A tool's function declaration as a source gave it (checked: a non-empty text name, the
    optional fields of the types below or null; other keys pass as they came)."""

    name: Required[str]
    description: str | None
    parameters: JsonObject | None
    strict: bool | None
    defer_loading: JsonValue


class ToolSpec(TypedDict, total=False):
    """One tool declaration of a request (``type`` "function" or absent)."""

    type: str
    function: Required[FunctionSpec]
    defer_loading: JsonValue
