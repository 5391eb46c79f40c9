"""Kimi K3 (moonshotai/Kimi-K3; Moonshot AI): the XTML chat format.

Owns no files. Where each fact was read (vLLM 0.32 and SGLang 0.5.23 as pinned; the checkpoint's
remote code ``encoding_k3.py`` / ``tokenization_kimi.py`` in public copies, third-party):

- **The format.** Four special tokens frame everything: a tag is ``<|open|>{name}{ k="v"}*<|sep|>``
  … ``<|close|>{name}<|sep|>`` (attribute values escape ``&`` then ``"``), and every message is
  ``<|open|>message role="{role}"[ name="…"]<|sep|>{body}<|close|>message<|sep|><|end_of_msg|>``.
  An assistant body is ``[<|open|>think<|sep|>{reasoning}<|close|>think<|sep|>]`` (the think
  channel exactly when thinking is on, empty without reasoning; every history turn keeps its
  reasoning) + ``<|open|>response<|sep|>{content}<|close|>response<|sep|>`` + the calls:
  ``<|open|>tools<|sep|>`` + per call ``<|open|>call tool="{name}" index="{i}"<|sep|>`` + per
  argument ``<|open|>argument key="{k}" type="{t}"<|sep|>{value}<|close|>argument<|sep|>``
  + ``<|close|>call<|sep|>`` … + ``<|close|>tools<|sep|>`` (a string value raw, any other
  ``json.dumps``; type boolean / null / number / string / object / array by the value; text
  arguments that are no JSON go whole into ``<|open|>json type="object"<|sep|>…``). Tool results
  are ``role="tool" tool="{name}" index="{n}"`` (n counts results since the assistant turn), the
  request's tools one ``type="tool-declare"`` system message of key-sorted compact JSON, the
  effort a ``type="thinking-effort"`` one, and the generation prompt
  ``<|open|>message role="assistant"<|sep|><|open|>think<|sep|>`` (thinking) or
  ``…<|open|>response<|sep|>`` (not). Sources: ``encoding_k3.py`` (moonshotai/Kimi-K3 main, and
  the copy derived from commit c5d1dd4), llama.cpp's port ``models/templates/Kimi-K3.jinja``
  (vendored as ``regen/devkit/tokenizers/templates/kimi_k3.jinja``: the witness of the tests).
  Where c5d1dd4 and main differ (main names an assistant message's ``name``; main writes each
  attribute as four text segments) this module follows main, as the llama.cpp port does.
- **No chat template.** The checkpoint's tokenizer renders in Python (``apply_chat_template``:
  ``thinking`` defaults to True, ``thinking_effort`` to ``max``; low / high / max only), so both
  engines call it and regen ports it (:meth:`KimiK3Family.encode_prompt`), with each engine's
  own preparation before it:

  - vLLM (``renderers/kimi_k3.py``; ``--tokenizer-mode kimi_k3`` is what ``auto`` picks for the
    architecture, ``config/model.py``; ``--trust-remote-code``): ``_normalize_k3_tool_messages``
    puts a block of tool results in the calls' order when every result names a call by its id
    or by ``"{name}:{0-based position}"``; ``enable_thinking`` becomes ``thinking`` and a
    ``reasoning_effort`` kwarg ``thinking_effort`` (``none``: thinking off); an effort other
    than low / high / max is refused (HTTP 400); a kwarg set to None or ``auto`` is dropped
    (so ``thinking_effort: null`` is the default ``max``); tools are ``model_dump()`` (a missing
    description is declared ``"description":null``); a ``developer`` message reaches the
    encoder as it is, which writes none, and a system message loses its tools;
  - SGLang (``entrypoints/openai/serving_chat.py`` ``_prepare_kimi_k3_messages`` and
    ``_encode_messages``; ``chat_encoding.py``): history arguments are parsed leniently (text
    that is no JSON stays text: a ``json`` block), ``<|kimi_image_placeholder|>`` typed in text
    becomes ``<| kimi_image_placeholder |>``, content None becomes ``""``, ``developer``
    becomes ``system`` and a system message keeps its tools (a lazy-loading declaration); the
    chat_template_kwargs reach the encoder as they are (``enable_thinking`` is not read); tools
    are ``model_dump(exclude_unset=True)``: only what the client set. regen gets the request's
    tools as regen.template.prepare completed them and drops what it filled in, so a client's
    own ``"description": null`` and a tool sent without ``"type"`` render as if the null were
    absent and the type given (both rare: datasets send OpenAI's full shape);
  - no engine known (``plain``, ``legacy``): vLLM's.

  Both encoders then order tool results whose ``tool_call_id`` matches a call id.
- **Thinking** is a switch plus an effort: regen sends ``chat_template_kwargs``
  ``{"thinking": bool, "thinking_effort": level}`` (the level only with thinking on), which both
  engines hand the encoder unchanged and vLLM's reasoning parser reads.
- **The answer** after ``<|open|>think<|sep|>`` is ``{reasoning}<|close|>think<|sep|>`` +
  ``<|open|>response<|sep|>{content}<|close|>response<|sep|>`` + the calls +
  ``<|close|>message<|sep|>``, and ``<|end_of_msg|>`` (the generation config's eos) stops it;
  after ``<|open|>response<|sep|>`` (thinking off) the model writes the response body directly.
  Parsers (SGLang ``function_call/kimik3_detector.py``, ``kimik3_format.py``,
  ``parser/reasoning_parser.py`` ``KimiK3Detector``; vLLM ``parser/kimi_k3.py`` composing
  ``reasoning/kimi_k3_reasoning_parser.py`` and ``tool_parsers/kimi_k3_tool_parser.py``): the
  reasoning raw, the content the response channel's body, ``<|close|>message<|sep|>`` dropped,
  each argument typed back (a ``string`` raw, else ``json.loads``) and returned as
  ``json.dumps``. vLLM returns no reasoning (None) for an empty think channel. With tools,
  SGLang adds ``<|close|>tools<|sep|>`` as a stop string (``serving_chat.py``
  ``tool_call_stop``): a turn with calls stops there, trimmed, and never writes
  ``<|close|>message<|sep|><|end_of_msg|>``; the rebuild writes the template's form.
- SGLang 0.5.23's K3 model has no EAGLE-3 capture (``models/kimi_k3.py``: no
  ``set_eagle3_layers_to_capture``; the server refuses to start): ``aux_shift`` unsupported.

**Token ids of a local row.** K3's tokenizer encodes the prompt segment by segment: control
segments (the four tokens, image prompts) with special tokens recognised, every other segment
(message text, reasoning, argument values, names, attribute values, the tools' JSON) with
``disallowed_special=()``, so marker strings typed in text stay plain BPE; and BPE never merges
across segments. regen's Renderer encodes the joined text whole. A server row carries the
server's ids (and its check compares decoded text), so it is exact. A local row differs only
where (a) text holds one of K3's special-token strings (``<|open|>``, ``<|end_of_msg|>``,
``[EOS]``, ``<|media_pad|>``…): conversations about K3's own format, pasted chat logs: rare; or
(b) the whole-text pre-tokenizer splits differently at a join of two text segments: only inside
a tag's header, where the name and each attribute's `` key``, ``="``, value and ``"`` are
separate segments; K3's pattern splits there anyway except for a value that starts or ends with
punctuation (``key="$ref"``: ``="$`` + ``ref`` whole against ``="`` + ``$ref``): rarer.
:meth:`KimiK3Family.prompt_segments` gives the segments; encoding them one by one (control ones
with special tokens, the rest as plain text) reproduces the engines' ids.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from regen.core.errors import ArgumentsError, TemplateError
from regen.core.sample import ToolCall
from regen.core.tools import schema_types, vllm_tools
from regen.targets.family import (
    Family,
    Parsers,
    RenderFlag,
    Thinking,
    ThinkState,
    TokenizerFacts,
    arguments_json,
)

log = logging.getLogger(__name__)

OPEN, CLOSE, SEP, END_OF_MSG = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
#: where an image goes in text (encoding_k3.py), and how SGLang neutralises one a user typed
IMAGE_PLACEHOLDER = "<|kimi_image_placeholder|>"
IMAGE_PLACEHOLDER_TYPED = "<| kimi_image_placeholder |>"
#: what SGLang hands the encoder for each image (``image_prompts``)
MEDIA_PAD = "<|media_pad|>"
#: the effort levels the encoder takes (its default first: the tokenizer's ``max``)
EFFORTS = ("max", "low", "high")
#: the engine names whose preparation differs (regen.template.prepare)
SGLANG, VLLM = "sglang", "vllm"


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of a K3 prompt and how K3's tokenizer encodes it: a ``control`` piece with
    special tokens recognised, any other as plain text (module docstring)."""

    text: str
    control: bool = False


class Segments(list[Segment]):
    """A prompt being written, piece by piece (empty pieces are left out, as the encoder's)."""

    def control(self, text: str) -> None:
        if text:
            self.append(Segment(text, True))

    def text(self, text: Any) -> None:
        text = str(text)
        if text:
            self.append(Segment(text))

    def open(self, tag: str, attrs: Sequence[tuple[str, Any]] = ()) -> None:
        """``<|open|>{tag}{ key="value"}*<|sep|>``."""
        self.control(OPEN)
        self.text(tag)
        for key, value in attrs:
            self.text(f" {key}")
            self.text('="')
            self.text(escape(value))
            self.text('"')
        self.control(SEP)

    def close(self, tag: str) -> None:
        """``<|close|>{tag}<|sep|>``."""
        self.control(CLOSE)
        self.text(tag)
        self.control(SEP)

    def joined(self) -> str:
        return "".join(s.text for s in self)


def escape(value: Any) -> str:
    """An attribute value: ``&`` then ``"`` escaped."""
    return str(value).replace("&", "&amp;").replace('"', "&quot;")


def open_tag(tag: str, attrs: Sequence[tuple[str, Any]] = ()) -> str:
    out = Segments()
    out.open(tag, attrs)
    return out.joined()


def close_tag(tag: str) -> str:
    return f"{CLOSE}{tag}{SEP}"


THINK_OPEN, THINK_CLOSE = open_tag("think"), close_tag("think")
RESPONSE_OPEN, RESPONSE_CLOSE = open_tag("response"), close_tag("response")
TOOLS_OPEN, TOOLS_CLOSE = open_tag("tools"), close_tag("tools")
MESSAGE_CLOSE = close_tag("message")
CALL_OPEN = f"{OPEN}call"
ASSISTANT_OPEN = open_tag("message", [("role", "assistant")])
#: what ends every message, and so every answer
MESSAGE_END = f"{MESSAGE_CLOSE}{END_OF_MSG}"

#: ids of the published tokenizer (third-party copies of its tokenizer_config.json and of the
#: config.json, which agree; vocab 163840 like K2's, whose ids 163586-163588 these reuse)
PUBLISHED_IDS: dict[str, int] = {
    "[BOS]": 163584,
    "[EOS]": 163585,
    END_OF_MSG: 163586,
    OPEN: 163587,
    CLOSE: 163588,
    SEP: 163589,
    "[PAD]": 163839,
}
VOCAB_SIZE = 163840
SPECIAL_TOKENS = (OPEN, CLOSE, SEP, END_OF_MSG)
MODEL_TYPES = ("kimi_k3",)

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
    messages: Sequence[Any],
    tools: Any,
    *,
    thinking: Any = True,
    image_prompts: Sequence[str] | None = None,
    **kwargs: Any,
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
    calls: Any = None
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


def text(out: Segments, value: Any, images: Images) -> None:
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


def content(out: Segments, value: Any, images: Images) -> None:
    """A message's content: text, or a list of parts (an image part is an image)."""
    if isinstance(value, str):
        text(out, value, images)
        return
    for part in value or ():
        if not isinstance(part, Mapping) or "type" not in part:
            raise TemplateError(f"Kimi K3 cannot render the content part {part!r}")
        if part["type"] in ("image", "image_url"):
            out.control(images.next())
        else:
            text(out, part.get("text", ""), images)


def message(out: Segments, m: Mapping[str, Any], role: str, images: Images) -> None:
    out.open("message", [("role", role), *named(m)])
    content(out, m.get("content"), images)
    out.close("message")
    out.control(END_OF_MSG)


def named(m: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return [("name", m["name"])] if m.get("name") else []


def system_note(out: Segments, kind: str, body: str) -> None:
    """A system message the encoder writes itself (``type="{kind}"``)."""
    out.open("message", [("role", "system"), ("type", kind)])
    out.text(body.strip())
    out.close("message")
    out.control(END_OF_MSG)


def assistant(out: Segments, m: Mapping[str, Any], thinking: bool, images: Images) -> None:
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
        for i, call in enumerate(calls, start=1):
            fn = call_function(call)
            write_call(out, fn.get("name"), i, fn.get("arguments"), fn.get(JSON_BLOCK), images)
        out.close("tools")
    out.close("message")
    out.control(END_OF_MSG)


def write_call(
    out: Segments, name: Any, index: int, args: Any, raw: str | None, images: Images
) -> None:
    """One call: its arguments typed one by one, or the text that held no JSON as a block."""
    if name is None:
        raise TemplateError("Kimi K3 tool calls need a function name")
    out.open("call", [("tool", name), ("index", index)])
    if raw is not None:
        out.open("json", [("type", "object")])
        text(out, raw, images)
        out.close("json")
    else:
        for key, value in (args or {}).items():
            out.open("argument", [("key", key), ("type", value_type(value))])
            text(out, value_text(value), images)
            out.close("argument")
    out.close("call")


def value_type(value: Any) -> str:
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


def value_text(value: Any) -> str:
    """An argument's value: a string raw, anything else as JSON (default separators)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def tool_result(
    out: Segments, m: Mapping[str, Any], calls: Any, index: int, images: Images
) -> None:
    """A tool result, named by ``tool`` / ``name`` or by the call at its position."""
    name = m.get("tool", m.get("name"))
    if name is None and calls and index <= len(calls):
        name = call_function(calls[index - 1]).get("name")
    if name is None:
        raise TemplateError("a Kimi K3 tool result needs a tool name: 'tool' / 'name', or a "
                            "call at its position")  # fmt: skip
    out.open("message", [("role", "tool"), ("tool", name), ("index", index)])
    content(out, m.get("content"), images)
    out.close("message")
    out.control(END_OF_MSG)


def requirements(out: Segments, kwargs: Mapping[str, Any]) -> None:
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


def response_schema(fmt: Any) -> Any:
    wrapper = fmt.get("json_schema") if isinstance(fmt, Mapping) else None
    if not isinstance(wrapper, Mapping):
        return wrapper
    return wrapper.get("schema", wrapper.get("json_schema", wrapper))


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def deep_sort(value: Any) -> Any:
    """Every mapping's keys sorted, all the way down."""
    if isinstance(value, Mapping):
        return {k: deep_sort(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [deep_sort(v) for v in value]
    return value


#: where a call keeps the text of arguments that held no JSON (this module's own key)
JSON_BLOCK = "_json_block"


def call_function(call: Any) -> Mapping[str, Any]:
    """A call's function (``call.function``, or the call itself)."""
    fn = call.get("function", call) if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping):
        raise TemplateError(f"a Kimi K3 tool call must be an object, not {call!r}")
    return fn


def parsed_arguments(m: Any) -> Any:
    """A message with its calls' arguments as the encoder reads them (module docstring):
    an object, or ``{}`` for none, or the text that held no JSON (kept apart); the tools of a
    system message key-sorted."""
    if not isinstance(m, Mapping):
        return m
    out = dict(m)
    if out.get("tools") is not None:
        out["tools"] = deep_sort(out["tools"])
    if not out.get("tool_calls"):
        return out
    calls = []
    for call in out["tool_calls"]:
        fn = dict(call_function(call))
        fn["arguments"], raw = read_arguments(fn.get("arguments"), fn.get("name"))
        if raw is not None:
            fn[JSON_BLOCK] = raw
        calls.append({**call, "function": fn} if "function" in call else fn)
    out["tool_calls"] = calls
    return out


def read_arguments(args: Any, name: Any) -> tuple[dict[str, Any], str | None]:
    if args is None:
        return {}, None
    if isinstance(args, dict):
        return args, None
    if not isinstance(args, str):
        raise TemplateError(f"tool call {name!r}: Kimi K3 takes arguments as an object or text")
    if not args.strip():
        return {}, None
    try:
        value = json.loads(args)
    except ValueError:
        return {}, args
    if not isinstance(value, dict):
        raise ArgumentsError(f"tool call {name!r}: Kimi K3 tool call arguments must be a JSON "
                             "object (the encoder refuses the request)")  # fmt: skip
    return value, None


def results_in_call_order(messages: Sequence[Any]) -> list[Any]:
    """Each run of tool results in the order of the calls they answer, when every one names a
    call of the last assistant turn by its id (``tool_call_id``, else ``id``); each then named
    by its call. A run with one it cannot place stays as it is."""
    out: list[Any] = []
    ids: dict[str, tuple[int, Any]] = {}
    i = 0
    while i < len(messages):
        m = messages[i]
        role = m.get("role") if isinstance(m, Mapping) else None
        if role != "tool":
            if role == "assistant":
                ids = call_positions(m.get("tool_calls") or ())
            out.append(m)
            i += 1
            continue
        j = i
        while j < len(messages) and isinstance(messages[j], Mapping) and \
                messages[j].get("role") == "tool":  # fmt: skip
            j += 1
        out += placed(messages[i:j], ids)
        i = j
    return out


def call_positions(calls: Sequence[Any]) -> dict[str, tuple[int, Any]]:
    """Call id → (1-based position, name); the first of a repeated id."""
    found: dict[str, tuple[int, Any]] = {}
    for position, call in enumerate(calls, start=1):
        if not isinstance(call, Mapping) or call.get("id") is None:
            continue
        fn = call.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else call.get("name")
        found.setdefault(str(call["id"]), (position, name))
    return found


def placed(run: Sequence[Mapping[str, Any]], ids: Mapping[str, tuple[int, Any]]) -> list[Any]:
    keys = [r.get("tool_call_id", r.get("id")) for r in run]
    where = [ids.get(str(k)) if k is not None else None for k in keys]
    if any(w is None for w in where):
        return list(run)
    order = sorted(range(len(run)), key=lambda k: (where[k][0], k))  # type: ignore[index]
    out = []
    for k in order:
        _, name = where[k]  # type: ignore[misc]
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
    messages: Sequence[Any],
    tools: Any,
    kwargs: Mapping[str, Any],
    image_prompts: Sequence[str] | None = None,
) -> Segments:
    """What K3's ``apply_chat_template`` (tokenization_kimi.py) makes of a call: ``thinking``
    on unless given, ``thinking_effort`` ``max`` unless given (None: no effort note)."""
    kw = {k: v for k, v in kwargs.items() if k not in _CALL_ARGUMENTS}
    thinking = kw.pop("thinking", True)
    kw.setdefault("thinking_effort", EFFORTS[0])
    return build_segments(messages, tools, thinking=thinking, image_prompts=image_prompts, **kw)


# -- vLLM 0.32 (renderers/kimi_k3.py) -----------------------------------------------------------
#: the kwarg values vLLM's merge of the request's kwargs over its defaults leaves out
_UNSET = (None, "auto")


def vllm_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The chat_template_kwargs vLLM hands the encoder: those set to None or ``auto`` dropped
    (``renderers/params.py`` ``merge_kwargs`` under the serving defaults: an explicit
    ``thinking_effort: null`` is the tokenizer's ``max`` here, no effort on SGLang); then
    ``_apply_k3_thinking_kwargs``: ``enable_thinking`` → ``thinking``, a ``reasoning_effort``
    → ``thinking_effort`` (``none``: thinking off); any other effort refused."""
    kw = {k: v for k, v in kwargs.items() if v not in _UNSET}
    enable = kw.pop("enable_thinking", None)
    if enable is not None:
        kw.setdefault("thinking", enable)
    effort = kw.pop("reasoning_effort", None)
    if effort == "none":
        kw.setdefault("thinking", False)
    elif effort is not None:
        kw.setdefault("thinking_effort", effort)
    level = kw.get("thinking_effort")
    if level is not None and level not in EFFORTS:
        raise TemplateError(f"vLLM refuses thinking_effort {level!r} for Kimi K3 (HTTP 400; "
                            f"it takes {', '.join(EFFORTS)})")  # fmt: skip
    return kw


def vllm_tool_order(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``_normalize_k3_tool_messages``: the tool results right after an assistant turn with
    calls, in the calls' order, when each names one by its id or by ``"{name}:{position}"``
    (0-based), each given its call's ``tool`` and ``index``; else as they are."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        out.append(dict(m))
        i += 1
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        if not calls:
            continue
        j = i
        while j < len(messages) and messages[j].get("role") == "tool":
            j += 1
        out += vllm_placed(messages[i:j], call_aliases(calls))
        i = j
    return out


def call_aliases(calls: Sequence[Any]) -> dict[str, tuple[int, str]]:
    found: dict[str, tuple[int, str]] = {}
    for position, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, Mapping) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            continue
        aliases = [f"{name}:{position}"]
        if call.get("id"):
            aliases.insert(0, str(call["id"]))
        for alias in aliases:
            found.setdefault(alias, (position, name))
    return found


def vllm_placed(
    run: Sequence[Mapping[str, Any]], aliases: Mapping[str, tuple[int, str]]
) -> list[dict[str, Any]]:
    found = []
    for order, result in enumerate(run):
        key = result.get("tool_call_id")
        where = aliases.get(str(key)) if key is not None else None
        if where is None:
            return [dict(r) for r in run]
        found.append((where[0], order, {**result, "tool": where[1], "index": where[0] + 1}))
    return [r for _, _, r in sorted(found, key=lambda f: (f[0], f[1]))]


# -- SGLang 0.5.23 (serving_chat.py _prepare_kimi_k3_messages, _encode_messages) -----------------
def sglang_messages(messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """``_prepare_kimi_k3_messages``; and the number of images (SGLang hands the encoder one
    ``<|media_pad|>`` image prompt each)."""
    out, images = [], 0
    for m in messages:
        m = copy.deepcopy(dict(m))
        body = m.get("content")
        if isinstance(body, list):
            m["content"] = [p for p in map(sglang_part, body) if p is not None]
            images += sum(p["type"] == "image_url" for p in m["content"])
        elif isinstance(body, str):
            m["content"] = body.replace(IMAGE_PLACEHOLDER, IMAGE_PLACEHOLDER_TYPED)
        elif body is None:
            m["content"] = ""
        if m.get("role") == "assistant":
            for key in ("reasoning_content", "reasoning"):
                if key in m:
                    m[key] = typed_placeholders(m[key])
            for call in m.get("tool_calls") or ():
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict) and "arguments" in fn:
                    fn["arguments"] = typed_placeholders(fn["arguments"])
        if m.get("role") in ("system", "developer") and m.get("tools"):
            m["tools"] = [sglang_message_tool(t) for t in m["tools"]]
        if m.get("role") == "developer":
            m["role"] = "system"
        out.append(m)
    return out, images


def sglang_part(part: Any) -> dict[str, Any] | None:
    if not isinstance(part, Mapping):
        return None
    if part.get("type") in ("text", "input_text"):
        return {"type": "text", "text": typed_placeholders(part["text"])}
    if part.get("type") in ("image_url", "input_image"):
        image = part.get("image_url") or {}
        if isinstance(image, str):
            image = {"url": image, "detail": part.get("detail")}
        return {"type": "image_url", "image_url": image}
    return None


def typed_placeholders(value: Any) -> Any:
    """``<|kimi_image_placeholder|>`` in every string of ``value`` made typed text."""
    if isinstance(value, str):
        return value.replace(IMAGE_PLACEHOLDER, IMAGE_PLACEHOLDER_TYPED)
    if isinstance(value, list):
        return [typed_placeholders(v) for v in value]
    if isinstance(value, dict):
        return {k: typed_placeholders(v) for k, v in value.items()}
    return value


#: the fields of SGLang's tool and function models (protocol.py ``Tool``, ``Function``)
_TOOL_FIELDS = ("type", "function", "defer_loading")
_FUNCTION_FIELDS = ("description", "name", "parameters", "strict", "defer_loading")


def sglang_message_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A system message's tool as SGLang's ``model_dump(exclude_unset=True)`` gives it: the
    fields the client set (a None ``strict`` / function ``defer_loading`` dropped, the tool's
    ``defer_loading`` copied into the function), parameter types made JSON Schema's."""
    fn = tool.get("function") or {}
    spec = {k: copy.deepcopy(fn[k]) for k in fn if k in _FUNCTION_FIELDS}
    spec = {k: v for k, v in spec.items() if k not in ("strict", "defer_loading") or v is not None}
    if tool.get("defer_loading") is not None and spec.get("defer_loading") is None:
        spec["defer_loading"] = tool["defer_loading"]
    if spec.get("parameters") is not None:
        schema_types(spec["parameters"])
    out = {k: tool[k] for k in _TOOL_FIELDS if k in tool and k != "function"}
    return {**out, "function": spec}


def sglang_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The request's tools as SGLang's K3 path dumps them (``exclude_unset``), from the shape
    regen.template.prepare gave them: what that preparation filled in (a None description,
    parameters or ``defer_loading``) dropped again. A client's own ``"description": null``
    cannot be told from none there: it is dropped too."""
    if not tools:
        return None
    out = []
    for tool in tools:
        fn = {k: v for k, v in (tool.get("function") or {}).items()
              if v is not None or k not in ("description", "parameters")}  # fmt: skip
        top = {k: v for k, v in tool.items()
               if k != "function" and (v is not None or k != "defer_loading")}  # fmt: skip
        out.append({**top, "function": fn})
    return out


def sglang_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The chat_template_kwargs SGLang hands the encoder: as they are, less ``tokenize``,
    ``return_dict`` and ``image_prompts`` (``enable_thinking`` and ``reasoning_effort`` kwargs
    are not read)."""
    return {k: v for k, v in kwargs.items() if k not in ("tokenize", "return_dict",
                                                         "image_prompts")}  # fmt: skip


class KimiK3Family(Family):
    """Kimi K3's XTML format and its Python-encoded prompts (module docstring)."""

    #: vLLM's ``--tokenizer-mode`` (``auto`` picks it for KimiK3ForConditionalGeneration)
    vllm_tokenizer_mode: ClassVar[str | None] = "kimi_k3"

    # -- thinking -----------------------------------------------------------------------------
    def template_kwargs(self, thinking: Thinking) -> dict[str, Any]:
        """``{"thinking": bool}``, and the effort level (``thinking_effort``) with it on."""
        level = self.effort(thinking)
        kwargs: dict[str, Any] = {"thinking": bool(thinking)}
        if level is not None:
            kwargs["thinking_effort"] = level
        return kwargs

    # -- the prompt ---------------------------------------------------------------------------
    @property
    def encodes_prompts(self) -> bool:
        return True

    def encode_prompt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        kwargs: Mapping[str, Any],
        engine: str,
    ) -> str:
        """The prompt ``engine`` renders (SGLang's preparation for ``sglang``, vLLM's for every
        other engine; module docstring)."""
        return self.prompt_segments(messages, tools, kwargs, engine).joined()

    def prompt_segments(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        kwargs: Mapping[str, Any],
        engine: str,
    ) -> Segments:
        """The prompt as the segments K3's tokenizer encodes one by one (module docstring)."""
        if engine == SGLANG:
            msgs, images = sglang_messages(messages)
            return tokenizer_segments(msgs, sglang_tools(tools), sglang_kwargs(kwargs),
                                      [MEDIA_PAD] * images if images else None)  # fmt: skip
        if engine != VLLM:  # no engine known: vLLM's tools, and its messages carry none
            tools = vllm_tools(tools)
            messages = [{k: v for k, v in m.items() if k != "tools"} for m in messages]
        return tokenizer_segments(vllm_tool_order(messages), tools, vllm_kwargs(kwargs))

    # -- the response -------------------------------------------------------------------------
    def think_state(self, prompt_text: str) -> ThinkState:
        """``open`` after ``<|open|>think<|sep|>``, ``closed`` after ``<|open|>response<|sep|>``
        (thinking off: the model writes the response body), else ``none``."""
        if prompt_text.endswith(THINK_OPEN):
            return "open"
        if prompt_text.endswith(RESPONSE_OPEN):
            return "closed"
        return "none"

    def split_response(
        self, state: ThinkState, reasoning: str | None, content: str
    ) -> tuple[str | None, str, RenderFlag | None]:
        """No reasoning after an open prompt is vLLM's answer to an empty think channel; a
        parser-less server's content (it holds the channel markers the parsers drop) is split
        at ``<|close|>think<|sep|>`` and unwrapped (``think_inserted`` without one). Content
        that still holds channel markup is flagged ``content_has_think``."""
        flag: RenderFlag | None = None
        raw = reasoning is None and any(m in content for m in (RESPONSE_CLOSE, MESSAGE_CLOSE))
        if reasoning is None and state == "open" and THINK_CLOSE in content:
            reasoning, _, content = content.partition(THINK_CLOSE)
            content = unwrapped(content.removeprefix(RESPONSE_OPEN))
        elif raw:
            content = unwrapped(content)
            flag = "think_inserted" if state == "open" else None
        markup = (THINK_OPEN, THINK_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE, TOOLS_OPEN, MESSAGE_CLOSE)
        if flag is None and any(m in content for m in markup):
            flag = "content_has_think"
        return reasoning, content, flag

    def response_text(
        self,
        state: ThinkState,
        reasoning: str | None,
        content: str,
        tool_calls: Sequence[ToolCall] = (),
        finish_reason: str = "stop",
    ) -> str:
        """What the model wrote: ``{reasoning}<|close|>think<|sep|><|open|>response<|sep|>``
        after an open prompt (the response body alone after a closed one), the content,
        ``<|close|>response<|sep|>``, the calls, ``<|close|>message<|sep|><|end_of_msg|>``.
        A truncated turn has no message end; one cut in its reasoning or its content ends
        there."""
        truncated = finish_reason == "length"
        cut_in_reasoning = truncated and not content and not tool_calls
        if state == "closed":
            if reasoning:
                raise TemplateError(
                    "the prompt opened the response channel (thinking off) but the server "
                    "returned reasoning; check chat_template_kwargs.thinking"
                )
            return self.answer(content, tool_calls, truncated)
        if state == "none" and reasoning is None:
            return f"{RESPONSE_OPEN}{self.answer(content, tool_calls, truncated)}"
        head = "" if state == "open" else THINK_OPEN
        if cut_in_reasoning:
            return f"{head}{reasoning or ''}"
        answer = self.answer(content, tool_calls, truncated)
        return f"{head}{reasoning or ''}{THINK_CLOSE}{RESPONSE_OPEN}{answer}"

    def answer(self, content: str, calls: Sequence[ToolCall], truncated: bool) -> str:
        """The response body, its close, the calls, the message end (module docstring)."""
        if truncated and not calls:
            return content
        text = f"{content}{RESPONSE_CLOSE}{self.tool_calls_text(calls)}"
        return text if truncated else f"{text}{self.end_text(calls)}"

    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        """The tools channel: each call's arguments typed by their JSON values."""
        if not calls:
            return ""
        out = Segments()
        out.open("tools")
        for i, call in enumerate(calls, start=1):
            args = arguments_json(call.arguments)
            mapping = isinstance(args, dict)
            write_call(out, call.name, i, args if mapping else None,
                       None if mapping else call.arguments, Images(None))  # fmt: skip
        out.close("tools")
        return out.joined()

    def end_text(self, calls: Sequence[ToolCall]) -> str:
        """``<|close|>message<|sep|><|end_of_msg|>``."""
        return MESSAGE_END

    def cut_close(self) -> str | None:
        """None: the close marker is three tokens, so the one-token count check of a turn cut
        in its reasoning (regen.template.render) cannot say it was written."""
        return None

    # -- recognition --------------------------------------------------------------------------
    def recognises(self, facts: TokenizerFacts) -> bool:
        """``<|open|>``, ``<|close|>``, ``<|sep|>`` and ``<|end_of_msg|>`` (no K2 tokenizer holds
        them), or ``config.json``'s ``kimi_k3``."""
        return facts.model_type in self.model_types or super().recognises(facts)


def unwrapped(text: str) -> str:
    """A raw answer's response body: the message end and response close taken off its end."""
    return text.removesuffix(END_OF_MSG).removesuffix(MESSAGE_CLOSE).removesuffix(RESPONSE_CLOSE)


KIMI_K3 = KimiK3Family(
    name="kimi_k3",
    title="Kimi K3",
    end_of_turn=END_OF_MSG,
    special_tokens=SPECIAL_TOKENS,
    # a produced answer holds all four special tokens (its channels; <|end_of_msg|> ends it): a
    # prompt's framing is ``<|open|>message role=…`` (a special token and text), which no single
    # id marks, so the loss-mask scan checks only the first token and all-trained masks
    turn_open_tokens=(),
    call_markers=(TOOLS_OPEN, CALL_OPEN),
    sglang=Parsers(tool="kimi_k3", reasoning="kimi_k3"),
    vllm=Parsers(tool="kimi_k3", reasoning="kimi_k3"),
    aux_shift="unsupported",
    think=(THINK_OPEN, THINK_CLOSE),
    thinking_kwarg="thinking",
    efforts=EFFORTS,
    published_ids=PUBLISHED_IDS,
    published_vocab=VOCAB_SIZE,
    model_types=MODEL_TYPES,
    remote_code=True,
    sglang_arguments="keep",
)
