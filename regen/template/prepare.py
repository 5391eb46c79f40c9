"""What a serving engine hands the chat template: a request's messages and tools, prepared.

Owns no files. A server does not hand the chat template the request's JSON as it came: it
validates it into its own protocol models and reshapes it first. The local render must hand the
template what the engine that answered handed it, or a template that prints what it is given
renders another prompt (docs/targets.md). One :class:`Preparation` per engine, chosen by the
engine profile's name (:func:`preparation`); each says where it was read:

- **vLLM 0.32** (``renderers/chat_utils.py`` ``_parse_chat_message_content`` and
  ``_postprocess_messages``; ``entrypoints/openai/chat_completion/protocol.py``
  ``_normalize_messages_before``; the tool model ``ChatCompletionToolsParam``):

  - a history tool call's ``arguments`` become the JSON object they hold; ``""``, ``null``,
    text that is not JSON and JSON that is not an object become ``{}`` (with a warning, never
    a refusal); the call is ``{"id", "function": {"arguments", "name"}, "type"}``;
  - an assistant message's reasoning reaches the template twice, as ``reasoning`` and
    ``reasoning_content``; other roles lose it; ``name`` is kept on every role;
  - a template that loops over a message's content (vLLM's AST check,
    :func:`loops_over_content`) gets every content as a list of text parts
    (``[{"type": "text", "text": s}]``), a tool result's content excepted;
  - a tool is ``{"type": "function", "function": {"name", "description", "parameters"}}`` in
    that order, a missing description or parameters as ``None``, unknown keys dropped.

- **SGLang 0.5.23** (``entrypoints/openai/protocol.py``'s message and tool models;
  ``serving_chat.py`` ``normalize_assistant_tool_call_arguments`` and ``_apply_jinja_template``;
  ``parser/jinja_template_utils.py`` ``process_content_for_template_format``;
  ``function_call/utils.py`` ``normalize_json_schema_types``):

  - a history call's ``arguments`` must be a JSON object: anything else refuses the request
    (HTTP 400 "Assistant tool call function.arguments must be valid JSON." / "... must be a
    JSON object."): here a :class:`ArgumentsError`, the sample's failure, never the run's.
    The encoders of Kimi K3 and DeepSeek-V4/V4.1 are lenient: the text stays as it came
    (:attr:`regen.targets.family.Family.sglang_arguments`); the call is
    ``{"id", "index": None, "type", "function": {"name", "arguments"}}``;
  - a user message keeps only its role and content; other roles keep every field that is set
    (reasoning as ``reasoning_content`` only);
  - a tool is ``{"type", "function": {the client's keys in its order, a missing description or
    parameters appended as None}, "defer_loading": None}``, its parameter types rewritten to
    JSON Schema's own (``int`` → ``integer``, ``varchar(255)`` → ``string``, ...).

- **plain** (any other server, and the checks before a run, which know no engine yet): the
  request's messages with each call's arguments as the object they hold (``{}`` for text that
  holds none, as vLLM: nothing is refused), the tools as they are.

- **legacy**: what regen handed every template before this module: the arguments as the
  request's JSON text. A run started then keeps it (run.json's ``render``, docs/format.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

from regen.core import jsontext
from regen.core.errors import ArgumentsError, TemplateError
from regen.core.sample import Message
from regen.core.tools import sglang_tools, vllm_tools
from regen.targets.family import ArgumentsRule

if TYPE_CHECKING:
    from jinja2 import nodes

log = logging.getLogger(__name__)

#: how the messages' content reaches a template: as text, or as a list of parts (vLLM's
#: ``openai`` content format)
ContentFormat = Literal["string", "openai"]
#: how a run renders history tool-call arguments: ``objects`` as the engines hand them,
#: ``strings`` as regen did before (a run started then keeps it)
RenderArguments = Literal["objects", "strings"]
#: the engine names a preparation is kept for (the engine profiles' names)
VLLM, SGLANG = "vllm", "sglang"


@dataclass(frozen=True, slots=True)
class Preparation:
    """How one engine prepares messages and tools for the chat template (module docstring)."""

    name: str
    #: what it does with arguments that are not a JSON object
    arguments: ArgumentsRule

    def messages(
        self,
        messages: Sequence[Message | Mapping[str, object]],
        content_format: ContentFormat = "string",
        arguments: ArgumentsRule | None = None,
    ) -> list[dict[str, object]]:
        """The messages as the template sees them (``arguments``: the family's rule where it
        differs from the engine's)."""
        rule = arguments or self.arguments
        return [self.message(_as_dict(m), rule, content_format) for m in messages]

    def message(
        self, m: dict[str, object], rule: ArgumentsRule, content_format: ContentFormat
    ) -> dict[str, object]:
        out = dict(m)
        if out.get("tool_calls"):
            out["tool_calls"] = [_plain_call(c, rule) for c in jsontext.iterate(out["tool_calls"])]
        return out

    def tools(self, tools: Sequence[Mapping[str, object]] | None) -> list[dict[str, object]] | None:
        """The tool declarations as the template sees them (None: none)."""
        return [dict(t) for t in tools] if tools else None


@dataclass(frozen=True, slots=True)
class Legacy(Preparation):
    """Arguments as the request's JSON text: what regen rendered before (module docstring)."""

    def message(
        self, m: dict[str, object], rule: ArgumentsRule, content_format: ContentFormat
    ) -> dict[str, object]:
        return m


@dataclass(frozen=True, slots=True)
class Vllm(Preparation):
    """vLLM 0.32's preparation (module docstring)."""

    def message(
        self, m: dict[str, object], rule: ArgumentsRule, content_format: ContentFormat
    ) -> dict[str, object]:
        role = m["role"]
        content = m.get("content")
        if content_format == "openai" and role != "tool":
            content = [] if content is None else [{"type": "text", "text": content}]
        elif content is None:
            content = ""
        out: dict[str, object] = {"role": role, "content": content}
        if role == "assistant":
            if m.get("tool_calls"):
                out["tool_calls"] = [_vllm_call(c) for c in jsontext.iterate(m["tool_calls"])]
            reasoning = m.get("reasoning")
            if reasoning is None:
                reasoning = m.get("reasoning_content")
            if reasoning is not None:
                out["reasoning"] = out["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in m:
            out["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            out["name"] = m["name"]
        return out

    def tools(self, tools: Sequence[Mapping[str, object]] | None) -> list[dict[str, object]] | None:
        return vllm_tools(tools)


#: the fields of SGLang's message model besides role and content, in its order
_SGLANG_FIELDS = ("tool_call_id", "name", "phase", "reasoning_content", "tool_calls", "tools",
                  "prefix")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Sglang(Preparation):
    """SGLang 0.5.23's preparation (module docstring)."""

    def message(
        self, m: dict[str, object], rule: ArgumentsRule, content_format: ContentFormat
    ) -> dict[str, object]:
        role = m["role"]
        out: dict[str, object] = {"role": role, "content": m.get("content") or ""}
        if role == "user":
            return out
        for key in _SGLANG_FIELDS:
            value = m.get(key)
            if key == "tool_calls" and value is not None:
                value = [_sglang_call(c, rule) for c in jsontext.iterate(value)]
            if value is not None:
                out[key] = value
        return out

    def tools(self, tools: Sequence[Mapping[str, object]] | None) -> list[dict[str, object]] | None:
        return sglang_tools(tools)


LEGACY = Legacy("legacy", "keep")
PLAIN = Preparation("plain", "empty")
#: the preparation of each engine profile by its name (regen.client.profiles)
PREPARATIONS: dict[str, Preparation] = {VLLM: Vllm(VLLM, "empty"), SGLANG: Sglang(SGLANG, "refuse")}


def preparation(engine: str | None, render: RenderArguments = "objects") -> Preparation:
    """The preparation of the engine called ``engine`` (None, or one of no known engine:
    :data:`PLAIN`); :data:`LEGACY` for a run that renders arguments as ``strings``."""
    if render == "strings":
        return LEGACY
    return PREPARATIONS.get(engine or "", PLAIN)


def parse_arguments(text: object, rule: ArgumentsRule, name: str = "") -> object:
    """A history call's ``arguments`` as the template sees them under ``rule``: the JSON object
    the text holds; otherwise ``{}`` (``empty``), the text (``keep``), or ArgumentsError."""
    if isinstance(text, dict):
        return text
    if not text and rule == "empty":
        return {}
    value: object
    try:
        value = jsontext.loads(text) if isinstance(text, str) else text
    except ValueError:
        value = _NOT_JSON
    if isinstance(value, dict):
        return value
    if rule == "empty":
        if value is not None:
            log.debug("tool call %r: arguments are not a JSON object: rendered as {}", name)
        return {}
    if rule == "keep":
        return text
    what = "valid JSON" if value is _NOT_JSON else "a JSON object"
    raise ArgumentsError(f"Assistant tool call function.arguments must be {what}. (tool call "
                         f"{name!r}; the engine refuses the request)")  # fmt: skip


_NOT_JSON = object()


def _as_dict(m: Message | Mapping[str, object]) -> dict[str, object]:
    return dict(m.to_openai()) if isinstance(m, Message) else dict(m)


def _call(call: object) -> tuple[Mapping[str, object], Mapping[str, object]]:
    """A call and its function: mappings, as both engines' protocol models require
    (TemplateError: they refuse the request)."""
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(call, Mapping) or not isinstance(fn, Mapping):
        raise TemplateError("an assistant tool call must be an object with a 'function' object")
    return call, fn


def _plain_call(call: object, rule: ArgumentsRule) -> object:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call  # the template says what it makes of it
    call, fn = _call(call)
    args = parse_arguments(fn.get("arguments"), rule, str(fn.get("name")))
    return {**call, "function": {**fn, "arguments": args}}


def _vllm_call(raw: object) -> dict[str, object]:
    call, fn = _call(raw)
    args = parse_arguments(fn.get("arguments"), "empty", str(fn.get("name")))
    out: dict[str, object] = {"id": call.get("id"), "function": {"arguments": args,
                                                               "name": fn.get("name")}}  # fmt: skip
    out["type"] = call.get("type", "function")
    out.update({k: v for k, v in call.items() if k not in ("id", "function", "type")})
    return out


def _sglang_call(raw: object, rule: ArgumentsRule) -> dict[str, object]:
    call, fn = _call(raw)
    args = fn.get("arguments")
    if isinstance(args, str):
        args = parse_arguments(args, rule, str(fn.get("name")))
    return {"id": call.get("id"), "index": call.get("index"), "type": call.get("type", "function"),
            "function": {"name": fn.get("name"), "arguments": args}}  # fmt: skip


# -- vLLM's content format (renderers/hf.py _detect_content_format) -----------------------------
@lru_cache(maxsize=32)
def loops_over_content(template: str) -> bool:
    """Whether a chat template iterates over a message's content (vLLM then hands it every
    content as a list of text parts: its ``openai`` content format). The rules are vLLM's:
    a ``for`` over ``M.content`` / ``M['content']`` where ``M`` is a loop variable over
    ``messages`` (or a name assigned from them), over a macro parameter that received such a
    content, or over a name ``content`` outside a macro."""
    import jinja2

    try:
        ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateError:
        return False
    return _content_loop(ast)


def _content_loop(ast: nodes.Template) -> bool:
    """Whether a ``for`` of ``ast`` iterates over a message's content (the rules of
    :func:`loops_over_content`)."""
    from jinja2 import nodes

    def wrapped(node: nodes.Node) -> nodes.Node | None:  # of a filter, test or slice
        if isinstance(node, nodes.Filter | nodes.Test):
            return node.node
        if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
            return node.node
        return None

    def base(node: nodes.Node) -> nodes.Node:
        while (inner := wrapped(node)) is not None:
            node = inner
        return node

    def direct(node: nodes.Node, names: set[str]) -> bool:
        return isinstance(node, nodes.Name) and node.ctx == "load" and node.name in names

    def is_name(node: nodes.Node, names: set[str]) -> bool:
        return direct(base(node), names)

    def is_content_of(node: nodes.Node, names: set[str]) -> bool:  # M.content, M['content']
        node = base(node)
        if isinstance(node, nodes.Getitem):
            return (direct(node.node, names) and isinstance(node.arg, nodes.Const)
                    and node.arg.value == "content")  # fmt: skip
        return isinstance(node, nodes.Getattr) and node.attr == "content" and direct(
            node.node, names)  # fmt: skip

    lists = {"messages"}
    grew = True
    while grew:  # names assigned from messages (or from such names)
        found = {a.target.name for a in ast.find_all(nodes.Assign)
                 if isinstance(a.target, nodes.Name) and is_name(a.node, lists)}  # fmt: skip
        grew = not found <= lists
        lists |= found
    items = {f.target.name for f in ast.find_all(nodes.For)
             if isinstance(f.target, nodes.Name) and is_name(f.iter, lists)}  # fmt: skip
    in_macros, params = _macro_loops(ast, items, is_content_of)
    for loop in ast.find_all(nodes.For):
        it = loop.iter
        if is_content_of(it, items):
            return True
        if isinstance(it, nodes.Name) and it.name in params.get(id(loop), ()):
            return True
        if id(loop) not in in_macros and isinstance(it, nodes.Name) and it.name == "content":
            return True
    return False


def _macro_loops(
    ast: nodes.Template, items: set[str], is_content_of: Callable[[nodes.Node, set[str]], bool]
) -> tuple[set[int], dict[int, set[str]]]:
    """The ``for`` loops inside macros (their ids), and of those the ones whose macro some
    call hands a message's content (``is_content_of`` a name of ``items``): the parameters
    that receive it, by loop id."""
    from jinja2 import nodes

    in_macros: set[int] = set()
    params: dict[int, set[str]] = {}
    for macro in ast.find_all(nodes.Macro):
        names = [a.name for a in macro.args]
        got: set[str] = set()
        for call in ast.find_all(nodes.Call):
            if isinstance(call.node, nodes.Name) and call.node.name == macro.name:
                got |= {names[i] for i, a in enumerate(call.args)
                        if i < len(names) and is_content_of(a, items)}  # fmt: skip
                got |= {k.key for k in call.kwargs
                        if k.key in names and is_content_of(k.value, items)}  # fmt: skip
        for loop in macro.find_all(nodes.For):
            in_macros.add(id(loop))
            if got:
                params[id(loop)] = got
    return in_macros, params
