"""regen's port of Kimi K3's prompt encoder: ``encoding_k3.py`` ``build_chat_segments`` (main)
and the checkpoint's ``apply_chat_template`` around it (``tokenization_kimi.py``); messages,
tools and kwargs as an engine hands them in, the prompt's segments out.

Owns no files. The format, and where each fact was read: :mod:`regen.targets.kimi_k3` (where the
copy of commit c5d1dd4 and main differ, this port follows main, as llama.cpp's port, the tests'
witness, does). It puts tool results that name a call by id in the calls' order; parses history
arguments (text that holds no JSON is kept for a ``json`` block); writes the tools' declaration
and the effort, tool-choice and response-format notes as system messages, every message in its
tag, an assistant turn's think and response channels and its calls (each argument typed by its
value), and tool results named by their call; and ends with the generation prompt.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence

from regen.core import jsontext
from regen.core.errors import ArgumentsError, TemplateError
from regen.targets.kimi_k3_xtml import END_OF_MSG, Segments

log = logging.getLogger(__name__)

#: where an image goes in text (encoding_k3.py)
IMAGE_PLACEHOLDER = "<|kimi_image_placeholder|>"
#: the effort levels the encoder takes (its default first: the tokenizer's ``max``)
EFFORTS = ("max", "low", "high")

EFFORT_NOTE = (
    "`thinking_effort` guides on how much to think in your thinking channel (not including the "
    "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort={}`."
)
TOOLS_NOTE = "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n{}\n```"
NEW_TOOLS_NOTE = (
    "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
    "You have access to all existing and extended tools.\n"
    "Here are the specs for the extended tools.\n\n```json\n{}\n```"
)
TOOL_CHOICE_NOTE = "The system is invoked with `tool_choice={}`.\nYou MUST {} in the next message."
RAW_JSON_NOTE = (
    "The system is invoked with `response_format={}`.\nYour response must be raw JSON data "
    "without markdown code blocks (```json) or any additional formatting."
)
SCHEMA_NOTE = "\nThe JSON data must match the following schema:\n```json\n{}\n```"


# -- the encoder (encoding_k3.py build_chat_segments, main) ----------------------------------------
def build_segments(
    messages: Sequence[object],
    tools: object,
    *,
    thinking: object = True,
    image_prompts: Sequence[str] | None = None,
    **kwargs: object,
) -> Segments:
    """The generation prompt's segments for ``messages`` and ``tools`` as K3's encoder writes
    them (kwargs: ``thinking_effort``, ``tool_choice``, ``response_format``,
    ``response_schema``; others are ignored, as there)."""
    msgs = [parsed_arguments(m) for m in results_in_call_order(messages)]
    images = Images(image_prompts)
    out = Segments()
    declared = deep_sort(tools)
    if declared:
        system_note(out, "tool-declare", TOOLS_NOTE.format(compact(declared)))
    effort = kwargs.get("thinking_effort")
    if thinking and effort is not None and effort not in EFFORTS:
        raise TemplateError(f"Kimi K3 takes thinking_effort {', '.join(EFFORTS)}, not {effort!r}")
    if thinking and effort in EFFORTS:
        system_note(out, "thinking-effort", EFFORT_NOTE.format(effort))
    calls: object = None
    results = 0
    for m in msgs:
        if not isinstance(m, Mapping):
            continue
        if "role" not in m:
            raise TemplateError("Kimi K3 messages need a role")
        role = m["role"]
        if role == "system" and m.get("tools"):
            system_note(out, "tool-declare", NEW_TOOLS_NOTE.format(compact(m["tools"])))
        elif role in ("user", "system"):
            message(out, m, role, images)
        elif role == "assistant":
            calls, results = m.get("tool_calls"), 0
            assistant(out, m, bool(thinking), images)
        elif role == "tool":
            results += 1
            tool_result(out, m, calls, results, images)
        else:
            log.debug("Kimi K3's encoder writes no %r message: left out", role)
    requirements(out, kwargs)
    out.open("message", [("role", "assistant")])
    out.open("think" if thinking else "response")
    images.consumed()
    return out


class Images:
    """The image prompts an encoder call was given (None: images stay placeholders)."""

    def __init__(self, prompts: Sequence[str] | None) -> None:
        self.prompts, self.used = prompts, 0

    def next(self) -> str:
        if self.prompts is None:
            return IMAGE_PLACEHOLDER
        if self.used >= len(self.prompts):
            raise TemplateError("more images than image prompts")
        self.used += 1
        return self.prompts[self.used - 1]

    def consumed(self) -> None:
        if self.prompts is not None and self.used != len(self.prompts):
            raise TemplateError(f"{len(self.prompts)} image prompts for {self.used} images")


def text(out: Segments, value: object, images: Images) -> None:
    """Text a user, tool or model wrote (an image placeholder in it is an image only where the
    encoder was given image prompts)."""
    value = str(value)
    if images.prompts is None or IMAGE_PLACEHOLDER not in value:
        out.text(value)
        return
    pieces = value.split(IMAGE_PLACEHOLDER)
    for i, piece in enumerate(pieces):
        out.text(piece)
        if i < len(pieces) - 1:
            out.control(images.next())


def content(out: Segments, value: object, images: Images) -> None:
    """A message's content: text, or a list of parts (an image part is an image)."""
    if isinstance(value, str):
        text(out, value, images)
        return
    for part in jsontext.iterate(value or ()):
        if not isinstance(part, Mapping) or "type" not in part:
            raise TemplateError(f"Kimi K3 cannot render the content part {part!r}")
        if part["type"] in ("image", "image_url"):
            out.control(images.next())
        else:
            text(out, part.get("text", ""), images)


def message(out: Segments, m: Mapping[str, object], role: str, images: Images) -> None:
    out.open("message", [("role", role), *named(m)])
    content(out, m.get("content"), images)
    out.close("message")
    out.control(END_OF_MSG)


def named(m: Mapping[str, object]) -> list[tuple[str, object]]:
    return [("name", m["name"])] if m.get("name") else []


def system_note(out: Segments, kind: str, body: str) -> None:
    """A system message the encoder writes itself (``type="{kind}"``)."""
    out.open("message", [("role", "system"), ("type", kind)])
    out.text(body.strip())
    out.close("message")
    out.control(END_OF_MSG)


def assistant(out: Segments, m: Mapping[str, object], thinking: bool, images: Images) -> None:
    out.open("message", [("role", "assistant"), *named(m)])
    if thinking:
        out.open("think")
        reasoning = m.get("reasoning_content") or m.get("reasoning")
        if reasoning is not None and str(reasoning).strip():
            text(out, reasoning, images)
        out.close("think")
    out.open("response")
    content(out, m.get("content"), images)
    out.close("response")
    calls = m.get("tool_calls")
    if calls:
        out.open("tools")
        for i, call in enumerate(jsontext.iterate(calls), start=1):
            fn = call_function(call)
            raw = fn.get(JSON_BLOCK)
            write_call(out, fn.get("name"), i, fn.get("arguments"), raw if isinstance(raw, str)
                       else None, images)  # fmt: skip
        out.close("tools")
    out.close("message")
    out.control(END_OF_MSG)


def write_call(
    out: Segments, name: object, index: int, args: object, raw: str | None, images: Images
) -> None:
    """One call: its arguments typed one by one, or the text that held no JSON as a block."""
    if name is None:
        raise TemplateError("Kimi K3 tool calls need a function name")
    out.open("call", [("tool", name), ("index", index)])
    if raw is not None:
        out.open("json", [("type", "object")])
        text(out, raw, images)
        out.close("json")
    elif args:
        if not isinstance(args, Mapping):
            raise TemplateError(f"tool call {name!r}: Kimi K3 takes arguments as an object or text")
        for key, value in args.items():
            out.open("argument", [("key", key), ("type", value_type(value))])
            text(out, value_text(value), images)
            out.close("argument")
    out.close("call")


def value_type(value: object) -> str:
    """An argument's ``type`` attribute."""
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "object" if isinstance(value, dict) else "array"


def value_text(value: object) -> str:
    """An argument's value: a string raw, anything else as JSON (default separators)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def tool_result(
    out: Segments, m: Mapping[str, object], calls: object, index: int, images: Images
) -> None:
    """A tool result, named by ``tool`` / ``name`` or by the call at its position."""
    name = m.get("tool", m.get("name"))
    if name is None and isinstance(calls, Sequence) and calls and index <= len(calls):
        name = call_function(calls[index - 1]).get("name")
    if name is None:
        raise TemplateError("a Kimi K3 tool result needs a tool name: 'tool' / 'name', or a "
                            "call at its position")  # fmt: skip
    out.open("message", [("role", "tool"), ("tool", name), ("index", index)])
    content(out, m.get("content"), images)
    out.close("message")
    out.control(END_OF_MSG)


def requirements(out: Segments, kwargs: Mapping[str, object]) -> None:
    """The ``tool_choice`` and ``response_format`` notes (kwargs the encoder reads)."""
    choice = kwargs.get("tool_choice")
    if choice in ("required", "none"):
        must = "call tools" if choice == "required" else "NOT call any tools"
        system_note(out, "tool-choice", TOOL_CHOICE_NOTE.format(choice, must))
    fmt = kwargs.get("response_format")
    kind = fmt.get("type", fmt) if isinstance(fmt, Mapping) else fmt
    if kind == "json_object":
        system_note(out, "response-format", RAW_JSON_NOTE.format(kind))
    elif kind == "json_schema":
        schema = kwargs["response_schema"] if "response_schema" in kwargs else response_schema(fmt)
        note = RAW_JSON_NOTE.format(kind) + SCHEMA_NOTE.format(compact(deep_sort(schema)))
        system_note(out, "response-format", note)


def response_schema(fmt: object) -> object:
    wrapper = fmt.get("json_schema") if isinstance(fmt, Mapping) else None
    if not isinstance(wrapper, Mapping):
        return wrapper
    return wrapper.get("schema", wrapper.get("json_schema", wrapper))


def compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def deep_sort(value: object) -> object:
    """Every mapping's keys sorted, all the way down."""
    if isinstance(value, Mapping):
        return {k: deep_sort(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [deep_sort(v) for v in value]
    return value


#: where a call keeps the text of arguments that held no JSON (this module's own key)
JSON_BLOCK = "_json_block"


def call_function(call: object) -> Mapping[str, object]:
    """A call's function (``call.function``, or the call itself)."""
    fn = call.get("function", call) if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping):
        raise TemplateError(f"a Kimi K3 tool call must be an object, not {call!r}")
    return fn


def parsed_arguments(m: object) -> object:
    """A message with its calls' arguments as the encoder reads them (:mod:`regen.targets.kimi_k3`):
    an object, or ``{}`` for none, or the text that held no JSON (kept apart); the tools of a
    system message key-sorted."""
    if not isinstance(m, Mapping):
        return m
    out = dict(m)
    if out.get("tools") is not None:
        out["tools"] = deep_sort(out["tools"])
    if not out.get("tool_calls"):
        return out
    calls: list[object] = []
    for call in jsontext.iterate(out["tool_calls"]):
        fn = dict(call_function(call))
        fn["arguments"], raw = read_arguments(fn.get("arguments"), fn.get("name"))
        if raw is not None:
            fn[JSON_BLOCK] = raw
        if isinstance(call, Mapping) and "function" in call:
            calls.append({**call, "function": fn})
        else:
            calls.append(fn)
    out["tool_calls"] = calls
    return out


def read_arguments(args: object, name: object) -> tuple[Mapping[str, object], str | None]:
    if args is None:
        return {}, None
    if isinstance(args, dict):
        return args, None
    if not isinstance(args, str):
        raise TemplateError(f"tool call {name!r}: Kimi K3 takes arguments as an object or text")
    if not args.strip():
        return {}, None
    try:
        value = jsontext.loads(args)
    except ValueError:
        return {}, args
    if not isinstance(value, dict):
        raise ArgumentsError(f"tool call {name!r}: Kimi K3 tool call arguments must be a JSON "
                             "object (the encoder refuses the request)")  # fmt: skip
    return value, None


def results_in_call_order(messages: Sequence[object]) -> list[object]:
    """Each run of tool results in the order of the calls they answer, when every one names a
    call of the last assistant turn by its id (``tool_call_id``, else ``id``); each then named
    by its call. A run with one it cannot place stays as it is."""
    out: list[object] = []
    ids: dict[str, tuple[int, object]] = {}
    i = 0
    while i < len(messages):
        m = messages[i]
        role = _role(m)
        if role != "tool":
            if role == "assistant" and isinstance(m, Mapping):
                ids = call_positions(m.get("tool_calls") or ())
            out.append(m)
            i += 1
            continue
        j = i
        while j < len(messages) and _role(messages[j]) == "tool":
            j += 1
        out += placed([r for r in messages[i:j] if isinstance(r, Mapping)], ids)
        i = j
    return out


def _role(m: object) -> object:
    return m.get("role") if isinstance(m, Mapping) else None


def call_positions(calls: object) -> dict[str, tuple[int, object]]:
    """Call id → (1-based position, name); the first of a repeated id."""
    found: dict[str, tuple[int, object]] = {}
    for position, call in enumerate(jsontext.iterate(calls), start=1):
        if not isinstance(call, Mapping) or call.get("id") is None:
            continue
        fn = call.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else call.get("name")
        found.setdefault(str(call["id"]), (position, name))
    return found


def placed(
    run: Sequence[Mapping[str, object]], ids: Mapping[str, tuple[int, object]]
) -> list[object]:
    keys = [r.get("tool_call_id", r.get("id")) for r in run]
    where = [ids.get(str(k)) if k is not None else None for k in keys]
    found = [w for w in where if w is not None]
    if len(found) < len(where):
        return list(run)
    order = sorted(range(len(run)), key=lambda k: (found[k][0], k))
    out: list[object] = []
    for k in order:
        _, name = found[k]
        result = dict(run[k])
        if name is not None:
            result["tool"] = name
            if "name" in result:
                result["name"] = name
        out.append(result)
    return out


#: apply_chat_template's own arguments, which are no template kwargs
_CALL_ARGUMENTS = frozenset({"tokenize", "return_dict", "chat_template", "add_generation_prompt",
                             "tools", "padding", "truncation", "max_length", "return_tensors",
                             "image_prompts"})  # fmt: skip


def tokenizer_segments(
    messages: Sequence[object],
    tools: object,
    kwargs: Mapping[str, object],
    image_prompts: Sequence[str] | None = None,
) -> Segments:
    """What K3's ``apply_chat_template`` (tokenization_kimi.py) makes of a call: ``thinking``
    on unless given, ``thinking_effort`` ``max`` unless given (None: no effort note)."""
    kw = {k: v for k, v in kwargs.items() if k not in _CALL_ARGUMENTS}
    thinking = kw.pop("thinking", True)
    kw.setdefault("thinking_effort", EFFORTS[0])
    return build_segments(messages, tools, thinking=thinking, image_prompts=image_prompts, **kw)
