"""The prompt encoder DeepSeek-V4 and V4.1 share (regen's own, written from the facts in
:mod:`regen.targets.deepseek_v4` and :mod:`regen.targets.deepseek_v41`).

Owns no files. :class:`Encoder` renders the messages an engine hands its encoder (tools already
on a system message) under that engine's :class:`Setting` (thinking, the effort's text, where
headers go, how history arguments and JSON are written) and the version's :class:`Dialect`
(its DSML tags, V4.1's system token). The layout (vLLM 0.32 ``tokenizers/deepseek_v4_encoding.py``
and ``deepseek_v41_encoding.py``; deepseek-recipe 0.2.0 behind SGLang 0.5.23, RUN):

- ``<｜begin▁of▁sentence｜>``, the effort text (thinking mode), then the turns;
- user and tool messages in a row are one user turn ``<｜User｜>`` + parts joined by ``\n\n``
  (a result ``<tool_result>{content}</tool_result>``, results in the order of their calls);
- an assistant turn: a header ``<｜Assistant｜>`` + ``<think>`` / ``</think>`` (recipe: before
  every assistant turn; vLLM: only after a user, developer or system turn), then
  ``{reasoning}</think>`` where the reasoning is kept, ``{content}``, ``\n\n`` + the call
  block, ``<｜end▁of▁sentence｜>``; the generation gets a header last;
- thinking mode keeps the history's reasoning when any message declares tools (or vLLM's
  ``drop_thinking`` is off); else it drops, before the last user turn, the reasoning and the
  developer messages, and the headers there close ``</think>``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from regen.core import jsontext
from regen.core.errors import TemplateError
from regen.targets.dsml import (
    ASSISTANT,
    BOS,
    DSML,
    EOS,
    THINK_CLOSE,
    THINK_OPEN,
    USER,
    Dump,
    Tags,
    history_calls,
    json_text,
    object_arguments,
    reasoning_of,
    rust_json_text,
    text_of,
    think_tag,
)


def tools_text(tags: Tags, functions: Sequence[object], dump: Dump) -> str:
    """The tool declarations of V4 / V4.1 (their ``TOOLS_TEMPLATE``), ``tags`` naming them."""
    d, blk, inv, par = f"<{DSML}", tags.block, tags.invoke, tags.parameter
    schemas = "\n".join(dump(f) for f in functions)
    return (
        "## Tools\n\n"
        "You have access to a set of tools to help answer the user's question. You can invoke "
        f'tools by writing a "{d}{blk}>" block like the following:\n\n'
        f"{d}{blk}>\n"
        f'{d}{inv} name="$TOOL_NAME">\n'
        f'{d}{par} name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{DSML}{par}>\n'
        "...\n"
        f"</{DSML}{inv}>\n"
        f'{d}{inv} name="$TOOL_NAME2">\n'
        "...\n"
        f"</{DSML}{inv}>\n"
        f"</{DSML}{blk}>\n\n"
        'String parameters should be specified as is and set `string="true"`. For all other '
        "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
        '`string="false"`.\n\n'
        f"If thinking_mode is enabled (triggered by {THINK_OPEN}), you MUST output your complete "
        f"reasoning inside {THINK_OPEN}...{THINK_CLOSE} BEFORE any tool calls or final "
        "response.\n\n"
        f"Otherwise, output directly after {THINK_CLOSE} with tool calls or final response.\n\n"
        "### Available Tool Schemas\n\n"
        f"{schemas}\n\n"
        "You MUST strictly follow the above defined tool name and parameter schemas to invoke "
        "tool calls.\n"
    )


@dataclass(frozen=True, slots=True)
class Dialect:
    """What V4.1 changes of V4's prompt."""

    tags: Tags
    #: how recipe (SGLang) writes argument values and tool schemas: V4 in Rust's number
    #: format, V4.1 in Python's (both read integers beyond 64 bits as floats; RUN)
    recipe_dump: Dump = rust_json_text
    #: V4.1's ``<｜System｜>``: before the first message when it is a system message or an
    #: effort line is written, and before every later system message (None: V4)
    system_token: str | None = None
    #: later system messages count as user turns (V4.1)
    system_is_user: bool = False


@dataclass(slots=True)
class Setting:
    """How one engine renders a request."""

    thinking: bool
    #: the effort text written first in thinking mode
    effort_text: str
    #: recipe (SGLang): a header before every assistant turn, recipe's arguments and JSON
    recipe: bool
    #: what the assistant's history arguments become
    arguments: Callable[[Mapping[str, object]], Mapping[str, object]] = object_arguments
    #: how argument values and tool schemas are written
    dump: Dump = json_text
    #: the engine's ``drop_thinking`` (vLLM's template kwarg; recipe: always)
    drop: bool = True
    engine: str = "vllm"


#: a part of a merged user turn: ``text`` or ``tool`` (a result), its call id, its content
Block = tuple[str, object, object]


def blocks_of(turn: Mapping[str, object]) -> list[Block]:
    """A merged user turn's parts (:func:`merge_turns`)."""
    blocks = turn["blocks"]
    if not isinstance(blocks, list):
        raise TypeError(f"a merged user turn's blocks are a list, not {type(blocks).__name__}")
    return blocks


def merge_turns(messages: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """User and tool messages in a row become one user turn of parts (``text`` or a tool
    result), the results in the order of the calls that asked for them."""
    turns: list[dict[str, object]] = []
    for m in messages:
        role = m.get("role")
        if role not in ("user", "tool"):
            turns.append(dict(m))
            continue
        part: Block = ("text", "", m.get("content")) if role == "user" else (
            "tool", m.get("tool_call_id") or "", m.get("content"))  # fmt: skip
        if turns and turns[-1].get("role") == "user":
            blocks_of(turns[-1]).append(part)
        else:
            turns.append({"role": "user", "blocks": [part]})
    order_results(turns)
    return turns


def order_results(turns: list[dict[str, object]]) -> None:
    """Sort each user turn's results by the position of their call in the latest assistant
    turn that called (a result of no known call counts as the first)."""
    order: dict[object, int] = {}
    for turn in turns:
        if turn.get("role") == "assistant" and turn.get("tool_calls"):
            order = {_call_id(c): i for i, c in enumerate(jsontext.iterate(turn["tool_calls"]))}
            order.pop("", None)
        elif turn.get("role") == "user":
            parts = blocks_of(turn)
            results = [p for p in parts if p[0] == "tool"]
            if len(results) > 1 and order:
                ranked = iter(sorted(results, key=lambda p: order.get(p[1], 0)))
                turn["blocks"] = [next(ranked) if p[0] == "tool" else p for p in parts]


def _call_id(call: object) -> object:
    if not isinstance(call, Mapping):
        raise TemplateError(f"DeepSeek-V4 needs a tool call as an object, not {call!r}")
    return call.get("id") or ""


def part_text(part: Block) -> str:
    kind, _, content = part
    if isinstance(content, list):
        content = "\n\n".join(text_of(b.get("text", "")) for b in content if isinstance(b, dict))
    return f"<tool_result>{content}</tool_result>" if kind == "tool" else f"{content}"


def _function(tool: object) -> object:
    """A declared tool's ``function``."""
    if not isinstance(tool, Mapping):
        raise TemplateError(f"DeepSeek-V4 needs a tool as an object, not {tool!r}")
    return tool["function"]


class Encoder:
    """One request's V4 / V4.1 prompt from the engine's messages (module docstring)."""

    def __init__(self, turns: list[dict[str, object]], dialect: Dialect, setting: Setting) -> None:
        self.dialect = dialect
        self.setting = setting
        keep = any(t.get("tools") for t in turns)
        #: the history keeps its reasoning (a request with tools, or drop_thinking off)
        self.keep = keep or not setting.drop
        if setting.thinking and not self.keep:
            turns = self.forget(turns)
        self.turns = turns
        self.last_user = self.last_user_index(turns)

    def last_user_index(self, turns: Sequence[Mapping[str, object]]) -> int:
        found = [i for i, t in enumerate(turns) if self.counts_as_user(i, t)]
        return found[-1] if found else -1

    def counts_as_user(self, i: int, turn: Mapping[str, object]) -> bool:
        role = turn.get("role")
        return role in ("user", "developer") or (
            self.dialect.system_is_user and role == "system" and i > 0
        )

    def forget(self, turns: list[dict[str, object]]) -> list[dict[str, object]]:
        """Before the last user turn: no reasoning, no developer messages."""
        last = self.last_user_index(turns)
        out = []
        for i, t in enumerate(turns):
            role = t.get("role")
            if i >= last or role in ("user", "system", "latest_reminder"):
                out.append(t)
            elif role == "assistant":
                out.append(
                    {k: v for k, v in t.items() if k not in ("reasoning", "reasoning_content")}
                )
        return out

    def text(self) -> str:
        out = [BOS, self.preamble()]
        for i, turn in enumerate(self.turns):
            if turn.get("role") == "assistant" and self.header_before(i):
                out.append(self.header(i - 1))
            out.append(self.turn_text(i, turn))
        if self.header_before(len(self.turns)):
            out.append(self.header(len(self.turns) - 1))
        return "".join(out)

    def preamble(self) -> str:
        effort = self.setting.effort_text if self.setting.thinking else ""
        token = self.dialect.system_token
        first_is_system = bool(self.turns) and self.turns[0].get("role") == "system"
        if token is not None and (effort or first_is_system):
            return token + effort
        return effort

    def header_before(self, i: int) -> bool:
        """Whether the assistant turn ``i`` (or the generation, ``i == len``) gets a header:
        always in recipe; in vLLM only after a user, developer or system turn (V4.1: not after
        a first system message)."""
        if self.setting.recipe:
            return True
        if i == 0:
            return False
        prev = self.turns[i - 1]
        first_system = i - 1 == 0 and prev.get("role") == "system"
        return prev.get("role") != "assistant" and not (
            first_system and self.dialect.system_token is not None
        )

    def header(self, prev: int) -> str:
        """``<｜Assistant｜>`` and whether the reasoning opens, after the turn ``prev``."""
        opens = self.setting.thinking and (self.keep or prev >= self.last_user)
        return f"{ASSISTANT}{think_tag(opens)}"

    def turn_text(self, i: int, turn: Mapping[str, object]) -> str:
        role = turn.get("role")
        if role == "user":
            return USER + "\n\n".join(part_text(p) for p in blocks_of(turn))
        if role == "system":
            token = self.dialect.system_token if i > 0 else None
            return (token or "") + text_of(turn.get("content") or "") + self.tools_part(turn)
        if role == "developer":
            if not turn.get("content"):
                raise TemplateError("DeepSeek-V4: a developer message needs content")
            return f"{USER}{turn['content']}{self.tools_part(turn)}"
        if role == "assistant":
            return self.assistant_text(i, turn)
        raise TemplateError(f"DeepSeek-V4 renders no {role!r} message")

    def tools_part(self, turn: Mapping[str, object]) -> str:
        tools = turn.get("tools")
        if not tools:
            return ""
        functions = [_function(t) for t in jsontext.iterate(tools)]
        return "\n\n" + tools_text(self.dialect.tags, functions, self.setting.dump)

    def assistant_text(self, i: int, turn: Mapping[str, object]) -> str:
        calls = history_calls(turn, self.setting.arguments)
        head = ""
        if self.setting.thinking and (self.keep or i > self.last_user):
            head = f"{reasoning_of(turn, self.setting.engine) or ''}{THINK_CLOSE}"
        block = ""
        if calls:
            block = "\n\n" + self.dialect.tags.block_text(calls, self.setting.dump)
        return f"{head}{turn.get('content') or ''}{block}{EOS}"
