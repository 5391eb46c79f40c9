"""DSML, the tool-call markup of DeepSeek-V3.2, V4 and V4.1, and what their families share.

Owns no files. The three publish no chat template: both engines render their prompts with a
Python encoder of their own (vLLM 0.32 ``tokenizers/deepseek_v32.py``, ``deepseek_v4.py``,
``deepseek_v41.py`` and their ``*_encoding.py``; SGLang 0.5.23
``entrypoints/openai/encoding_dsv32.py`` for V3.2 and, for V4 / V4.1, the ``deepseek-recipe``
package behind ``parser/deepseek_recipe_renderer.py``), so each family here encodes its own
prompts (:meth:`DsmlFamily.encode_prompt`; regen's encoders, written from those facts).

The markup (the encoders' ``encode_arguments_to_dsml``; the engines' parsers read it back):

- a block ``<｜DSML｜{block}>\\n`` + the calls joined by ``\\n`` + ``\\n</｜DSML｜{block}>``,
  where ``{block}`` is ``function_calls`` (V3.2), ``tool_calls`` (V4) or `` calls`` (V4.1,
  whose tags all carry a leading space: `` invoke``, `` parameter``);
- a call ``<｜DSML｜invoke name="{name}">\\n`` + its parameters joined by ``\\n`` +
  ``\\n</｜DSML｜invoke>``;
- a parameter ``<｜DSML｜parameter name="{key}" string="true">{value}</｜DSML｜parameter>`` for
  a string (written as it is), ``string="false"`` and the value as JSON for anything else;
- an answer is ``{reasoning}</think>{content}``, then ``\\n\\n`` and the block when it calls,
  then ``<｜end▁of▁sentence｜>`` (the prompt opened ``<think>``, or closed it with ``</think>``
  when thinking is off). The model never writes ``<think>`` itself.

What the engines give back (``deepseekv32_detector.py``, recipe's token parser, vLLM's
``parser/deepseek_v32.py`` / ``deepseek_v4.py`` / ``deepseek_v41.py``): vLLM keeps the
``\\n\\n`` before the block in the content, SGLang drops it; the rebuild writes it once
(:meth:`DsmlFamily.answer_text`). The arguments come back as JSON objects and are written
again as the encoders write a history call (non-string values re-dumped with ``", "`` and
``": "``).

Thinking: vLLM reads ``thinking`` or ``enable_thinking``, SGLang ``thinking`` only, so regen
sends both (:meth:`DsmlFamily.template_kwargs`). Recognition: a DeepSeek ``model_type`` decides;
without one, the DeepSeek tokens and either no chat template (the published tokenizers have
none) or a template writing the family's own block opener, and the family's token hint
(:meth:`DsmlFamily.token_hint`). A DeepSeek-V3.1 tokenizer ships a template without DSML and is
never taken (:mod:`regen.targets.deepseek`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from regen.core import jsontext
from regen.core.errors import TemplateError
from regen.core.sample import ToolCall
from regen.targets.family import Family, Thinking, TokenizerFacts, arguments_json

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
#: the token every DSML tag holds
DSML = "｜DSML｜"
#: V4 / V4.1's token of the latest reminder (a V4 tokenizer's hint); V4.1's system token
LATEST_REMINDER = "<｜latest_reminder｜>"
SYSTEM = "<｜System｜>"
#: every ``config.json`` model type of the DeepSeek chat models (V3 / V3.1 included)
DEEPSEEK_MODEL_TYPES = ("deepseek_v3", "deepseek_v32", "deepseek_v4", "deepseek_v41")
#: tokens every DSML family's tokenizer holds
CORE_TOKENS = (EOS, USER, ASSISTANT, THINK_OPEN, THINK_CLOSE)
#: what separates the content from a call block
BEFORE_CALLS = "\n\n"
#: the engines' names (regen.template.prepare)
SGLANG = "sglang"

#: a JSON serializer of argument values and tool schemas
Dump = Callable[[object], str]


def json_text(value: object) -> str:
    """JSON as the Python encoders write it (``json.dumps``, non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=False)


def wide_ints_as_floats(value: object) -> object:
    """``value`` with the integers beyond 64 bits as floats, as orjson (SGLang's history
    arguments) and deepseek-recipe's JSON parse them (RUN)."""
    if isinstance(value, dict):
        return {k: wide_ints_as_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [wide_ints_as_floats(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return value if _NARROW[0] <= value < _NARROW[1] else float(value)
    return value


def wide_ints_in_object(value: Mapping[str, object]) -> dict[str, object]:
    """:func:`wide_ints_as_floats` of an object."""
    return {k: wide_ints_as_floats(v) for k, v in value.items()}


#: the integers orjson and serde_json keep as integers (i64 and u64)
_NARROW = (-(2**63), 2**64)


def rust_json_text(value: object) -> str:
    """JSON as deepseek-recipe (Rust) writes it (RUN against deepseek-recipe 0.2.0): the Python
    separators, but floats in Rust's shortest form (``1e-7``, ``0.00001``), and integers beyond
    64 bits as floats."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json_text(str(k))}: {rust_json_text(v)}"
                               for k, v in value.items()) + "}"  # fmt: skip
    if isinstance(value, list | tuple):
        return "[" + ", ".join(rust_json_text(v) for v in value) + "]"
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return json_text(value)
    if isinstance(value, int):
        return str(value) if _NARROW[0] <= value < _NARROW[1] else _rust_float(float(value))
    if isinstance(value, float):
        return _rust_float(value)
    return json_text(value)


def _rust_float(value: float) -> str:
    """A float as Rust's ``ryu`` writes it: Python's ``repr`` but a bare exponent (``1e-7``) and
    plain decimals down to 1e-5 (Python switches to an exponent below 1e-4)."""
    text = repr(value)
    if "e" not in text:
        return text
    mantissa, exp = text.split("e")
    power = int(exp)
    if power == -5:
        sign, digits = ("-", mantissa[1:]) if mantissa.startswith("-") else ("", mantissa)
        return f"{sign}0.0000{digits.replace('.', '')}"
    return f"{mantissa}e{'+' if power > 0 else '-'}{abs(power)}"


@dataclass(frozen=True, slots=True)
class Tags:
    """One version's DSML tag names (module docstring)."""

    block: str
    invoke: str = "invoke"
    parameter: str = "parameter"

    @property
    def opener(self) -> str:
        """What opens a call block (an unparsed call in a reply's content)."""
        return f"<{DSML}{self.block}>"

    @property
    def invoke_opener(self) -> str:
        return f"<{DSML}{self.invoke} name="

    def block_text(self, calls: Sequence[tuple[str, Mapping[str, object]]], dump: Dump) -> str:
        """The call block of ``(name, arguments)`` pairs."""
        body = "\n".join(self.invoke_text(name, args, dump) for name, args in calls)
        return f"{self.opener}\n{body}\n</{DSML}{self.block}>"

    def invoke_text(self, name: str, arguments: Mapping[str, object], dump: Dump) -> str:
        params = "\n".join(self.parameter_text(k, v, dump) for k, v in arguments.items())
        return f'<{DSML}{self.invoke} name="{name}">\n{params}\n</{DSML}{self.invoke}>'

    def parameter_text(self, key: str, value: object, dump: Dump) -> str:
        flag, text = ("true", value) if isinstance(value, str) else ("false", dump(value))
        tag = f"{DSML}{self.parameter}"
        return f'<{tag} name="{key}" string="{flag}">{text}</{tag}>'


def text_of(value: object) -> str:
    """A message's text as the encoders add it to text (TypeError, as there, for anything but
    text)."""
    if isinstance(value, str):
        return value
    raise TypeError(f'can only concatenate str (not "{type(value).__name__}") to str')


def think_tag(open_: bool) -> str:
    """``<think>`` where the model reasons next, ``</think>`` where it does not."""
    return THINK_OPEN if open_ else THINK_CLOSE


def reasoning_of(message: Mapping[str, object], engine: str) -> object:
    """An assistant message's reasoning as the engine's encoder reads it: SGLang's from
    ``reasoning_content``; vLLM's from ``reasoning`` (its preparation sets both; a request
    prepared without an engine has ``reasoning_content`` only)."""
    if engine != SGLANG and "reasoning" in message:
        return message.get("reasoning")
    return message.get("reasoning_content")


def function_of(call: object) -> Mapping[str, object]:
    """A history call's ``function`` ({} where it has none; TemplateError where the call or
    its function is no object)."""
    fn = call.get("function") or {} if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping):
        raise TemplateError(f"DeepSeek's encoder needs a tool call as an object, not {call!r}")
    return fn


def call_arguments(call: Mapping[str, object]) -> object:
    """A history call's ``function.arguments``: the object a JSON text holds, else as it is."""
    args = function_of(call).get("arguments")
    return arguments_json(args) if isinstance(args, str) else args


def object_arguments(call: Mapping[str, object]) -> Mapping[str, object]:
    """A history call's arguments, which must be a JSON object (the strict encoders raise)."""
    args = call_arguments(call)
    if not isinstance(args, dict):
        raise TemplateError("DeepSeek's encoder needs a history call's arguments as a JSON object")
    return args


def history_calls(
    message: Mapping[str, object], arguments: Callable[[Mapping[str, object]], Mapping[str, object]]
) -> list[tuple[str, Mapping[str, object]]]:
    """An assistant message's calls as ``(name, arguments)``."""
    out: list[tuple[str, Mapping[str, object]]] = []
    for c in jsontext.iterate(message.get("tool_calls") or ()):
        if not isinstance(c, Mapping):
            raise TemplateError(f"DeepSeek's encoder needs a tool call as an object, not {c!r}")
        out.append((str(function_of(c).get("name") or ""), arguments(c)))
    return out


def vllm_tools(tools: Sequence[Mapping[str, object]] | None) -> list[dict[str, object]] | None:
    """Tools as vLLM's tool model dumps them: ``function`` as ``name``, ``description``,
    ``parameters`` (None where missing), then ``strict`` / ``defer_loading`` where set
    (idempotent over regen.template.prepare's vLLM tools)."""
    if not tools:
        return None
    out: list[dict[str, object]] = []
    for tool in tools:
        fn = function_of(tool)
        spec = {k: fn.get(k) for k in ("name", "description", "parameters")}
        spec.update({k: fn[k] for k in ("strict", "defer_loading") if fn.get(k) is not None})
        out.append({**tool, "function": spec})
    return out


def sglang_last_assistant(messages: list[dict[str, object]]) -> list[dict[str, object]]:
    """SGLang re-sends a trailing assistant text turn as a user turn (``serving_chat.py``
    ``_handle_last_assistant_message``; the recipe path's ``_trailing_assistant_turn``)."""
    if messages and messages[-1].get("role") == "assistant":
        content = messages[-1].get("content")
        if isinstance(content, str):
            return [*messages[:-1], {"role": "user", "content": content}]
    return messages


class DsmlFamily(Family):
    """What DeepSeek-V3.2, V4 and V4.1 share (module docstring); each sets :attr:`tags`,
    :attr:`vllm_tokenizer_mode` and its encoder."""

    #: the version's DSML tag names
    tags: ClassVar[Tags]
    # each sets :attr:`Family.vllm_tokenizer_mode`: it selects vLLM's Python encoder (and its
    # renderer) for a checkpoint whose architecture does not (a DeepSeek one selects it itself)

    @property
    def encodes_prompts(self) -> bool:
        return True

    def template_kwargs(self, thinking: Thinking) -> dict[str, object]:
        """Both switches: vLLM reads ``thinking`` or ``enable_thinking``, SGLang ``thinking``
        alone."""
        self.effort(thinking)
        on = bool(thinking)
        return {"thinking": on, "enable_thinking": on}

    # -- the response -------------------------------------------------------------------------
    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        """``\\n\\n`` and the call block, as the encoders write a history call."""
        if not calls:
            return ""
        pairs = [(c.name, self.returned_arguments(c)) for c in calls]
        return f"{BEFORE_CALLS}{self.tags.block_text(pairs, json_text)}"

    def returned_arguments(self, call: ToolCall) -> Mapping[str, object]:
        args = arguments_json(call.arguments)
        if not isinstance(args, dict):
            raise TemplateError(f"tool call {call.name!r}: arguments are not a JSON object")
        return args

    def answer_text(self, content: str, calls: Sequence[ToolCall], end: str) -> str:
        """The content (less the ``\\n\\n`` vLLM keeps before a block), the calls, the end."""
        if calls:
            content = content.removesuffix(BEFORE_CALLS)
        return super().answer_text(content, calls, end)

    # -- recognition --------------------------------------------------------------------------
    def recognises(self, facts: TokenizerFacts) -> bool:
        """A DeepSeek model type decides; else the DeepSeek tokens, and a template writing this
        family's block (or none at all, as published) and :meth:`token_hint`."""
        if facts.model_type in DEEPSEEK_MODEL_TYPES:
            return facts.model_type in self.model_types
        if not set(CORE_TOKENS) <= facts.tokens:
            return False
        if facts.chat_template:
            return self.tags.opener in facts.chat_template
        return self.token_hint(facts.tokens)

    def token_hint(self, tokens: frozenset[str]) -> bool:
        """Whether a tokenizer without a template or model type is this version's."""
        raise NotImplementedError
