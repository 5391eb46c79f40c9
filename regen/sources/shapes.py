"""The seven row shapes of the source datasets (CONTRACTS §5), parsed into messages.

Each parser takes one raw row (a dict) and returns a :class:`Parsed` conversation, or raises
:class:`~regen.core.errors.RowError` with a short stable reason code and the offending field:

    missing_field  wrong_type  unknown_role  empty_turn  empty_prompt  no_user_turn
    assistant_first  bad_tool_json  malformed_chat
    native rows (same codes as regen.sources.native): id_type  empty  length_mismatch  mask_value
    id_out_of_vocab  mask_all_zero

Owns no files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

from regen.core import jsontext
from regen.core.chat import Role, ToolSpec
from regen.core.errors import RowError
from regen.core.jsontext import JsonValue
from regen.core.sample import Message, ToolCall

#: upstream role names → regen roles
ROLE_MAP: dict[str, Role] = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
}


@dataclass(slots=True)
class Parsed:
    """What a row shape yields: the conversation, its tools, and the upstream id if any."""

    messages: list[Message]
    tools: list[ToolSpec] | None = None
    upstream_id: object = None
    meta: dict[str, JsonValue] = field(default_factory=dict)
    #: False when the upstream id names a group of rows (SWE-Gym's instance_id: several
    #: trajectories per task); the sample id then always carries a content hash
    id_unique: bool = True


@dataclass(slots=True)
class Tokens:
    """A native row's tokens."""

    input_ids: list[int]
    loss_mask: list[int]
    upstream_id: object = None


#: one raw row of a source (JSON, or what pyarrow made of a Parquet row)
Row = Mapping[str, object]
Parser = Callable[[Row], Parsed]


# --- helpers -------------------------------------------------------------------------------


def _get(row: Mapping[str, object], key: str) -> object:
    if key not in row or row[key] is None:
        raise RowError("missing_field", f"no {key!r}", field=key)
    return row[key]


def _str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise RowError("wrong_type", f"expected text, got {type(value).__name__}", field=where)
    return value


def _opt_str(value: object, where: str) -> str | None:
    """An optional text field: None when absent, null or empty, else its text (wrong_type when
    it is not text)."""
    if value is None or value == "":
        return None
    return _str(value, where)


def _list(value: object, where: str) -> list[object]:
    if not isinstance(value, list):
        raise RowError("wrong_type", f"expected a list, got {type(value).__name__}", field=where)
    return value


def _role(raw: object, where: str) -> Role:
    if not isinstance(raw, str) or raw.strip().lower() not in ROLE_MAP:
        raise RowError("unknown_role", f"role {raw!r}", field=where)
    return ROLE_MAP[raw.strip().lower()]


def _upstream_id(row: Mapping[str, object], *keys: str) -> object:
    for k in keys:
        v = row.get(k)
        if v is not None and str(v).strip():
            return v
    return None


def _json_arg(raw: object, where: str) -> str:
    """Tool-call arguments as a JSON string (a dict is dumped, a string must parse)."""
    if isinstance(raw, str):
        try:
            jsontext.loads(raw)
        except json.JSONDecodeError as e:
            raise RowError("bad_tool_json", f"arguments: {e.msg}", field=where) from None
        return raw
    if isinstance(raw, dict):
        return json.dumps(raw, ensure_ascii=False)
    raise RowError("bad_tool_json", f"arguments are {type(raw).__name__}", field=where)


_THOUGHT = re.compile(
    r"^\s*<\|begin_of_thought\|>(.*?)<\|end_of_thought\|>\s*"
    r"(?:<\|begin_of_solution\|>(.*?)(?:<\|end_of_solution\|>)?\s*)?$",
    re.S,
)
_THINK = re.compile(r"^\s*<think>(.*?)</think>(.*)$", re.S)


def split_reasoning(text: str) -> tuple[str, str | None]:
    """Split an answer into (content, reasoning) when it carries a marked thinking block."""
    m = _THOUGHT.match(text)
    if m:
        return (m.group(2) or "").strip(), m.group(1).strip()
    m = _THINK.match(text)
    if m:
        return m.group(2).strip(), m.group(1).strip()
    return text, None


def _assistant(text: str) -> Message:
    content, reasoning = split_reasoning(text)
    return Message("assistant", content, reasoning=reasoning)


# --- 1. ShareGPT from/value -------------------------------------------------------------------


def parse_from_value(row: Mapping[str, object], *, system_key: str | None = None) -> Parsed:
    """``conversations: [{from, value}]`` (ShareGPT, OpenThoughts, Perfect-Blend)."""
    turns = _list(_get(row, "conversations"), "conversations")
    messages: list[Message] = []
    system = row.get(system_key) if system_key else None
    if isinstance(system, str) and system.strip():
        messages.append(Message("system", system))
    for i, t in enumerate(turns):
        where = f"conversations[{i}]"
        if not isinstance(t, dict):
            raise RowError("wrong_type", "a turn is not an object", field=where)
        role = _role(t.get("from"), f"{where}.from")
        value = _str(t.get("value"), f"{where}.value")
        messages.append(_assistant(value) if role == "assistant" else Message(role, value))
    upstream_source = row.get("source")
    meta: dict[str, JsonValue] = (
        {"upstream_source": upstream_source} if isinstance(upstream_source, str) else {}
    )
    return Parsed(messages, None, _upstream_id(row, "id"), meta)


# --- 2. OpenAI messages -----------------------------------------------------------------------


def _content(raw: object, where: str) -> str:
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list):  # [{type: text, text}] parts
        parts = []
        for j, p in enumerate(raw):
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
            else:
                raise RowError("wrong_type", "content part without text", field=f"{where}[{j}]")
        return "".join(parts)
    raise RowError("wrong_type", f"content is {type(raw).__name__}", field=where)


def _tool_calls(raw: object, where: str) -> tuple[ToolCall, ...]:
    calls = []
    for j, c in enumerate(_list(raw, where)):
        w = f"{where}[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(c, dict) or not isinstance(fn, dict) or not isinstance(name, str) \
                or not name:  # fmt: skip
            raise RowError("bad_tool_json", "tool call without function.name", field=w)
        args = _json_arg(fn.get("arguments", "{}"), f"{w}.function.arguments")
        calls.append(ToolCall(str(c.get("id") or f"functions.{name}:{j}"), name, args))
    return tuple(calls)


def _tools_column(raw: object, where: str) -> list[ToolSpec] | None:
    if raw is None or raw == "" or raw == []:
        return None
    if isinstance(raw, str):
        try:
            raw = jsontext.loads(raw)
        except json.JSONDecodeError as e:
            raise RowError("bad_tool_json", e.msg, field=where) from None
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise RowError("bad_tool_json", "tools must be a list of objects", field=where)
    return check_tools(raw, where)


def check_tools(tools: list[dict[str, object]], where: str = "tools") -> list[ToolSpec]:
    """``tools`` when each is a declaration both engines' protocol models take (SGLang's
    ``Tool``/``Function``, vLLM's ``ChatCompletionToolsParam``/``FunctionDefinition``): ``type``
    "function" or absent, ``function`` an object with a non-empty text ``name``, a text
    ``description`` and an object ``parameters`` where given (null allowed), ``strict`` a bool;
    else ``bad_tool_json`` naming the field."""
    for i, t in enumerate(tools):
        w = f"{where}[{i}]"
        if t.get("type", "function") != "function":
            raise RowError("bad_tool_json", "a tool's type is not 'function'", field=f"{w}.type")
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise RowError(
                "bad_tool_json", "a tool without a function object", field=f"{w}.function"
            )
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RowError("bad_tool_json", "a function without a name", field=f"{w}.function.name")
        for key, kind, ok in _FUNCTION_FIELDS:
            if fn.get(key) is not None and not isinstance(fn[key], ok):
                detail = f"{key} is {type(fn[key]).__name__}, not {kind}"
                raise RowError("bad_tool_json", detail, field=f"{w}.function.{key}")
    return cast("list[ToolSpec]", tools)  # each checked above


#: a function declaration's optional fields: (key, what it must be, its type)
_FUNCTION_FIELDS = (("description", "text", str), ("parameters", "an object", dict),
                    ("strict", "a bool", bool))  # fmt: skip


def parse_messages(row: Mapping[str, object]) -> Parsed:
    """``messages: [{role, content, tool_calls?, tool_call_id?, name?}]`` (UltraChat, SWE-Gym)."""
    msgs = _list(_get(row, "messages"), "messages")
    messages: list[Message] = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RowError("wrong_type", "a message is not an object", field=where)
        role = _role(m.get("role"), f"{where}.role")
        content = _content(m.get("content"), f"{where}.content")
        if role == "assistant":
            raw_calls = m.get("tool_calls")
            calls = _tool_calls(raw_calls, f"{where}.tool_calls") if raw_calls else ()
            text, reasoning = split_reasoning(content)
            reasoning = (
                _opt_str(m.get("reasoning_content"), f"{where}.reasoning_content") or reasoning
            )
            messages.append(Message("assistant", text, reasoning=reasoning, tool_calls=calls))
        elif role == "tool":
            messages.append(
                Message(
                    "tool",
                    content,
                    tool_call_id=_opt_str(m.get("tool_call_id"), f"{where}.tool_call_id"),
                    name=_opt_str(m.get("name"), f"{where}.name"),
                )
            )
        else:
            messages.append(Message(role, content))
    tools = _tools_column(row.get("tools"), "tools")
    upstream = _upstream_id(row, "id", "prompt_id")
    if upstream is not None:
        return Parsed(messages, tools, upstream)
    return Parsed(messages, tools, _upstream_id(row, "instance_id"), id_unique=False)


# --- 3. input/output --------------------------------------------------------------------------


def parse_input_output(row: Mapping[str, object]) -> Parsed:
    """``input`` (the problem), ``output`` (the answer, often with <think>): OpenCodeReasoning."""
    prompt = _str(_get(row, "input"), "input")
    if prompt.strip() == "-":
        detail = "input is '-' (a reference to another dataset)"
        raise RowError("empty_prompt", detail, field="input")
    answer = _str(row.get("output") or "", "output")
    messages = [Message("user", prompt)]
    if answer.strip():
        messages.append(_assistant(answer))
    return Parsed(messages, None, _upstream_id(row, "id"))


# --- 4. xLAM ----------------------------------------------------------------------------------

_XLAM_TYPES = {
    "str": "string",
    "string": "string",
    "int": "integer",
    "integer": "integer",
    "float": "number",
    "number": "number",
    "bool": "boolean",
    "boolean": "boolean",
    "list": "array",
    "dict": "object",
    "set": "array",
    "tuple": "array",
}


def _xlam_type(t: object) -> tuple[str, bool]:
    """(JSON-schema type, optional?) of an xLAM type string such as ``List[int], optional``."""
    text = str(t or "string")
    optional = "optional" in text.lower()
    base = text.split(",")[0].strip().split("[")[0].strip().lower()
    return _XLAM_TYPES.get(base, "string"), optional


def _xlam_tool(t: object, where: str) -> ToolSpec:
    if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
        raise RowError("bad_tool_json", "tool without a name", field=where)
    params = t.get("parameters") or {}
    if not isinstance(params, dict):
        raise RowError("bad_tool_json", "parameters is not an object", field=where)
    props: dict[str, JsonValue] = {}
    required: list[JsonValue] = []
    for pname, spec in params.items():
        spec = spec if isinstance(spec, dict) else {}
        jtype, optional = _xlam_type(spec.get("type"))
        prop: dict[str, JsonValue] = {"type": jtype}
        if spec.get("description"):
            prop["description"] = str(spec["description"])
        if "default" in spec and spec["default"] not in (None, ""):
            prop["default"] = spec["default"]
        elif not optional:
            required.append(pname)
        props[pname] = prop
    return {
        "type": "function",
        "function": {
            "name": t["name"],
            "description": str(t.get("description") or ""),
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


def _json_column(row: Mapping[str, object], key: str) -> object:
    raw = _get(row, key)
    if isinstance(raw, str):
        try:
            return jsontext.loads(raw)
        except json.JSONDecodeError as e:
            raise RowError("bad_tool_json", f"{e.msg} at column {e.colno}", field=key) from None
    return raw


def parse_xlam(row: Mapping[str, object]) -> Parsed:
    """``query`` + JSON-string ``tools`` and ``answers`` → user turn, tools, assistant calls."""
    query = _str(_get(row, "query"), "query")
    tools_raw = _json_column(row, "tools")
    answers = _json_column(row, "answers")
    if not isinstance(tools_raw, list):
        raise RowError("bad_tool_json", "tools is not a list", field="tools")
    if not isinstance(answers, list):
        raise RowError("bad_tool_json", "answers is not a list", field="answers")
    tools = [_xlam_tool(t, f"tools[{i}]") for i, t in enumerate(tools_raw)]
    calls = []
    for i, a in enumerate(answers):
        if not isinstance(a, dict) or not isinstance(a.get("name"), str):
            raise RowError("bad_tool_json", "answer without a name", field=f"answers[{i}]")
        args = _json_arg(a.get("arguments") or {}, f"answers[{i}].arguments")
        calls.append(ToolCall(f"functions.{a['name']}:{i}", a["name"], args))
    messages = [Message("user", query)]
    if calls:
        messages.append(Message("assistant", "", tool_calls=tuple(calls)))
    return Parsed(messages, tools or None, _upstream_id(row, "id"))


# --- 5. Glaive plain-text chat ----------------------------------------------------------------

_GLAIVE_MARK = re.compile(r"(?m)^[ \t]*(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]?")
_GLAIVE_CALL = re.compile(r"<functioncall>\s*(.*)$", re.S)
_GLAIVE_ARGS_QUOTED = re.compile(r"""("arguments"\s*:\s*)'(.*)'(\s*}\s*)$""", re.S)
_EOT = "<|endoftext|>"


def _glaive_functions(system: str) -> tuple[str, list[ToolSpec] | None]:
    """The system prose and the function definitions (concatenated JSON objects) after it."""
    text = system.strip()
    if text.upper().startswith("SYSTEM:"):
        text = text[len("SYSTEM:") :].strip()
    start = text.find("{")
    if start < 0:
        return text, None
    prose, rest = text[:start].strip(), text[start:]
    tools: list[dict[str, object]] = []
    pos = 0
    while pos < len(rest):
        while pos < len(rest) and rest[pos].isspace():
            pos += 1
        if pos >= len(rest):
            break
        try:
            obj, pos = jsontext.raw_decode(rest, pos)
        except json.JSONDecodeError as e:
            detail = f"function definition: {e.msg}"
            raise RowError("bad_tool_json", detail, field="system") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise RowError("bad_tool_json", "function definition without a name", field="system")
        tools.append({"type": "function", "function": obj})
    return prose, check_tools(tools, "system.functions") if tools else None


def _glaive_call(body: str, index: int) -> ToolCall:
    text = body.strip()
    m = _GLAIVE_ARGS_QUOTED.search(text)
    if m:  # Glaive quotes the arguments object with single quotes: not JSON as written
        text = text[: m.start()] + m.group(1) + json.dumps(m.group(2)) + m.group(3)
    try:
        obj = jsontext.loads(text)
    except json.JSONDecodeError as e:
        raise RowError("bad_tool_json", f"function call: {e.msg}", field="chat") from None
    name = obj.get("name") if isinstance(obj, dict) else None
    if not isinstance(obj, dict) or not isinstance(name, str):
        raise RowError("bad_tool_json", "function call without a name", field="chat")
    args = _json_arg(obj.get("arguments") or {}, "chat")
    return ToolCall(f"functions.{name}:{index}", name, args)


def parse_glaive(row: Mapping[str, object]) -> Parsed:
    """``system`` (prose + function definitions), ``chat`` (USER:/ASSISTANT:/FUNCTION RESPONSE:)."""
    chat = _str(_get(row, "chat"), "chat")
    system = row.get("system")
    messages: list[Message] = []
    tools = None
    if isinstance(system, str) and system.strip():
        prose, tools = _glaive_functions(system)
        if prose:
            messages.append(Message("system", prose))
    marks = list(_GLAIVE_MARK.finditer(chat))
    if not marks:
        raise RowError("malformed_chat", "no USER:/ASSISTANT: marker", field="chat")
    if chat[: marks[0].start()].strip():
        raise RowError("malformed_chat", "text before the first marker", field="chat")
    last_call: ToolCall | None = None
    n_calls = 0
    for k, m in enumerate(marks):
        end = marks[k + 1].start() if k + 1 < len(marks) else len(chat)
        body = chat[m.end() : end].replace(_EOT, "").strip()
        kind = m.group(1)
        if kind == "USER":
            messages.append(Message("user", body))
        elif kind == "ASSISTANT":
            call = _GLAIVE_CALL.search(body)
            if call:
                last_call = _glaive_call(call.group(1), n_calls)
                n_calls += 1
                prefix = body[: call.start()].strip()
                messages.append(Message("assistant", prefix, tool_calls=(last_call,)))
            else:
                messages.append(Message("assistant", body))
        else:
            messages.append(
                Message(
                    "tool",
                    body,
                    tool_call_id=last_call.id if last_call else None,
                    name=last_call.name if last_call else None,
                )
            )
    return Parsed(messages, tools, _upstream_id(row, "id"))


# --- 6. instruction/response ------------------------------------------------------------------


def parse_instruction_response(row: Mapping[str, object]) -> Parsed:
    """``instruction`` and ``response`` (Magicoder)."""
    instruction = _str(_get(row, "instruction"), "instruction")
    response = _str(row.get("response") or "", "response")
    messages = [Message("user", instruction)]
    if response.strip():
        messages.append(_assistant(response))
    return Parsed(messages, None, _upstream_id(row, "id"))


# --- 7. native tokens -------------------------------------------------------------------------


def parse_native(row: Mapping[str, object]) -> Tokens:
    """``input_ids`` and ``loss_mask``: structural checks only (ints, equal lengths, 0/1 mask)."""
    raw_ids = _get(row, "input_ids")
    raw_mask = _get(row, "loss_mask")
    ids = _ints(raw_ids, "input_ids")
    mask = _ints(raw_mask, "loss_mask")
    if not ids:
        raise RowError("empty", "input_ids is empty", field="input_ids")
    if len(ids) != len(mask):
        raise RowError(
            "length_mismatch", f"{len(ids)} input_ids vs {len(mask)} loss_mask", field="loss_mask"
        )
    if any(x < 0 for x in ids):
        raise RowError("id_out_of_vocab", "negative token id", field="input_ids")
    if any(x not in (0, 1) for x in mask):
        raise RowError("mask_value", "loss_mask values must be 0 or 1", field="loss_mask")
    if not any(mask):
        raise RowError("mask_all_zero", "loss_mask has no 1", field="loss_mask")
    return Tokens(list(ids), list(mask), _upstream_id(row, "id"))


def _ints(value: object, key: str) -> list[int]:
    """``value`` when it is a list of integers (not bools), else ``id_type`` naming ``key``."""
    if not isinstance(value, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in value
    ):
        raise RowError("id_type", "expected a list of integers", field=key)
    ints: list[int] = value
    return ints


def check_texts(messages: list[Message]) -> None:
    """Every text field of the messages is a ``str`` (optional ones may be None): a value of
    another type that a shape let through is a ``wrong_type`` rejection naming its field, here
    at the door, before anything reads it as text (hashing, normalising, rendering)."""
    for i, m in enumerate(messages):
        _str(m.content, f"messages[{i}].content")
        for name in ("reasoning", "tool_call_id", "name"):
            if (value := getattr(m, name)) is not None:
                _str(value, f"messages[{i}].{name}")
        for j, c in enumerate(m.tool_calls):
            for name in ("id", "name", "arguments"):
                _str(getattr(c, name), f"messages[{i}].tool_calls[{j}].{name}")


def check_conversation(messages: list[Message]) -> None:
    """Checks every regenerate-mode conversation must pass, whatever its shape (first: every
    text it holds is text, :func:`check_texts`)."""
    check_texts(messages)
    if not any(m.role == "user" for m in messages):
        raise RowError("no_user_turn", "the conversation has no user turn", field=None)
    if not any(m.content.strip() for m in messages if m.role != "assistant"):
        raise RowError("empty_prompt", "the prompt has no text", field=None)
    for i, m in enumerate(messages):
        if m.role == "user" and not m.content.strip():
            raise RowError("empty_turn", f"user turn {i} is empty", field=f"messages[{i}]")
    first = next(i for i, m in enumerate(messages) if m.role != "system")
    if messages[first].role == "assistant":
        detail = f"message {first} is an assistant turn with no prompt before it"
        raise RowError("assistant_first", detail, field=f"messages[{first}]")
