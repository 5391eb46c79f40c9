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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from regen.core import jsontext
from regen.core.errors import RowError
from regen.core.sample import Message, ToolCall

#: upstream role names → regen roles
ROLE_MAP: dict[str, str] = {
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
    tools: list[dict[str, Any]] | None = None
    upstream_id: Any | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    #: False when the upstream id names a group of rows (SWE-Gym's instance_id: several
    #: trajectories per task); the sample id then always carries a content hash
    id_unique: bool = True


@dataclass(slots=True)
class Tokens:
    """A native row's tokens."""

    input_ids: list[int]
    loss_mask: list[int]
    upstream_id: Any | None = None


Parser = Callable[[dict[str, Any]], Parsed]


# --- helpers -------------------------------------------------------------------------------


def _get(row: dict[str, Any], key: str) -> Any:
    if key not in row or row[key] is None:
        raise RowError("missing_field", f"no {key!r}", field=key)
    return row[key]


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RowError("wrong_type", f"expected text, got {type(value).__name__}", field=where)
    return value


def _opt_str(value: Any, where: str) -> str | None:
    """An optional text field: None when absent, null or empty, else its text (wrong_type when
    it is not text)."""
    if value is None or value == "":
        return None
    return _str(value, where)


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise RowError("wrong_type", f"expected a list, got {type(value).__name__}", field=where)
    return value


def _role(raw: Any, where: str) -> str:
    if not isinstance(raw, str) or raw.strip().lower() not in ROLE_MAP:
        raise RowError("unknown_role", f"role {raw!r}", field=where)
    return ROLE_MAP[raw.strip().lower()]


def _upstream_id(row: dict[str, Any], *keys: str) -> Any | None:
    for k in keys:
        v = row.get(k)
        if v is not None and str(v).strip():
            return v
    return None


def _json_arg(raw: Any, where: str) -> str:
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


def parse_from_value(row: dict[str, Any], *, system_key: str | None = None) -> Parsed:
    """``conversations: [{from, value}]`` (ShareGPT, OpenThoughts, Perfect-Blend)."""
    turns = _list(_get(row, "conversations"), "conversations")
    messages: list[Message] = []
    if system_key and isinstance(row.get(system_key), str) and row[system_key].strip():
        messages.append(Message("system", row[system_key]))
    for i, t in enumerate(turns):
        where = f"conversations[{i}]"
        if not isinstance(t, dict):
            raise RowError("wrong_type", "a turn is not an object", field=where)
        role = _role(t.get("from"), f"{where}.from")
        value = _str(t.get("value"), f"{where}.value")
        messages.append(_assistant(value) if role == "assistant" else Message(role, value))  # type: ignore[arg-type]
    meta = {"upstream_source": row["source"]} if isinstance(row.get("source"), str) else {}
    return Parsed(messages, None, _upstream_id(row, "id"), meta)


# --- 2. OpenAI messages -----------------------------------------------------------------------


def _content(raw: Any, where: str) -> str:
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


def _tool_calls(raw: Any, where: str) -> tuple[ToolCall, ...]:
    calls = []
    for j, c in enumerate(_list(raw, where)):
        w = f"{where}[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RowError("bad_tool_json", "tool call without function.name", field=w)
        args = _json_arg(fn.get("arguments", "{}"), f"{w}.function.arguments")
        calls.append(ToolCall(str(c.get("id") or f"functions.{fn['name']}:{j}"), fn["name"], args))
    return tuple(calls)


def _tools_column(raw: Any, where: str) -> list[dict[str, Any]] | None:
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


def check_tools(tools: list[dict[str, Any]], where: str = "tools") -> list[dict[str, Any]]:
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
    return tools


#: a function declaration's optional fields: (key, what it must be, its type)
_FUNCTION_FIELDS = (("description", "text", str), ("parameters", "an object", dict),
                    ("strict", "a bool", bool))  # fmt: skip


def parse_messages(row: dict[str, Any]) -> Parsed:
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
            messages.append(Message(role, content))  # type: ignore[arg-type]
    tools = _tools_column(row.get("tools"), "tools")
    upstream = _upstream_id(row, "id", "prompt_id")
    if upstream is not None:
        return Parsed(messages, tools, upstream)
    return Parsed(messages, tools, _upstream_id(row, "instance_id"), id_unique=False)


# --- 3. input/output --------------------------------------------------------------------------


def parse_input_output(row: dict[str, Any]) -> Parsed:
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


def _xlam_type(t: Any) -> tuple[str, bool]:
    """(JSON-schema type, optional?) of an xLAM type string such as ``List[int], optional``."""
    text = str(t or "string")
    optional = "optional" in text.lower()
    base = text.split(",")[0].strip().split("[")[0].strip().lower()
    return _XLAM_TYPES.get(base, "string"), optional


def _xlam_tool(t: Any, where: str) -> dict[str, Any]:
    if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
        raise RowError("bad_tool_json", "tool without a name", field=where)
    params = t.get("parameters") or {}
    if not isinstance(params, dict):
        raise RowError("bad_tool_json", "parameters is not an object", field=where)
    props: dict[str, Any] = {}
    required = []
    for pname, spec in params.items():
        spec = spec if isinstance(spec, dict) else {}
        jtype, optional = _xlam_type(spec.get("type"))
        prop: dict[str, Any] = {"type": jtype}
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


def _json_column(row: dict[str, Any], key: str) -> Any:
    raw = _get(row, key)
    if isinstance(raw, str):
        try:
            return jsontext.loads(raw)
        except json.JSONDecodeError as e:
            raise RowError("bad_tool_json", f"{e.msg} at column {e.colno}", field=key) from None
    return raw


def parse_xlam(row: dict[str, Any]) -> Parsed:
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


def _glaive_functions(system: str) -> tuple[str, list[dict[str, Any]] | None]:
    """The system prose and the function definitions (concatenated JSON objects) after it."""
    text = system.strip()
    if text.upper().startswith("SYSTEM:"):
        text = text[len("SYSTEM:") :].strip()
    start = text.find("{")
    if start < 0:
        return text, None
    prose, rest = text[:start].strip(), text[start:]
    tools: list[dict[str, Any]] = []
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
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise RowError("bad_tool_json", "function call without a name", field="chat")
    args = _json_arg(obj.get("arguments") or {}, "chat")
    return ToolCall(f"functions.{obj['name']}:{index}", obj["name"], args)


def parse_glaive(row: dict[str, Any]) -> Parsed:
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


def parse_instruction_response(row: dict[str, Any]) -> Parsed:
    """``instruction`` and ``response`` (Magicoder)."""
    instruction = _str(_get(row, "instruction"), "instruction")
    response = _str(row.get("response") or "", "response")
    messages = [Message("user", instruction)]
    if response.strip():
        messages.append(_assistant(response))
    return Parsed(messages, None, _upstream_id(row, "id"))


# --- 7. native tokens -------------------------------------------------------------------------


def parse_native(row: dict[str, Any]) -> Tokens:
    """``input_ids`` and ``loss_mask``: structural checks only (ints, equal lengths, 0/1 mask)."""
    ids = _get(row, "input_ids")
    mask = _get(row, "loss_mask")
    for key, seq in (("input_ids", ids), ("loss_mask", mask)):
        if not isinstance(seq, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in seq
        ):
            raise RowError("id_type", "expected a list of integers", field=key)
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
