"""Qwen3-Coder (30B-A3B, 480B-A35B) and Qwen3.5: the Qwen framing with XML tool calls.

Owns no files. The format (the Qwen3-Coder and Qwen3.5 chat templates; SGLang 0.5.23
``function_call/qwen3_coder_detector.py`` and the ``qwen3`` reasoning parser; vLLM 0.32
``tool_parsers/qwen3_engine_tool_parser.py`` over ``parser/qwen3.py``):

- the framing, reasoning block and thinking switch of :mod:`regen.targets.qwen3` (Qwen3-Coder
  does not reason; Qwen3.5's generation prompt opens ``<think>\\n``);
- each call ``<tool_call>\\n<function={name}>\\n`` + per argument ``<parameter={key}>\\n{value}
  \\n</parameter>\\n`` + ``</function>\\n</tool_call>``; content before the calls is followed by
  ``\\n\\n``, calls by ``\\n``; a value is written as the template's ``| string`` does (objects
  and lists as JSON);
- SGLang's Qwen3-Next / Qwen3.5 loaders add 1 to every aux id.

Both engines read values by the tool's schema and return the arguments as JSON
(``json.dumps``), so an argument's text is what the template would write from that JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from regen.core.sample import ToolCall
from regen.targets.family import Family, Parsers, TokenizerFacts, arguments_json
from regen.targets.qwen3 import (
    CALL_CLOSE,
    CALL_OPEN,
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    XML_CALL_MARK,
    Qwen3Family,
)


def value_text(value: object) -> str:
    """A parameter value as the template writes it (``tojson`` for objects and lists, else
    Jinja's ``string``)."""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


class Qwen3CoderFamily(Qwen3Family):
    """The XML calls (module docstring)."""

    def call_text(self, call: ToolCall) -> str:
        args = arguments_json(call.arguments)
        params = "".join(
            f"<parameter={k}>\n{value_text(v)}\n</parameter>\n"
            for k, v in (args.items() if isinstance(args, dict) else ())
        )
        return f"{CALL_OPEN}\n<function={call.name}>\n{params}</function>\n{CALL_CLOSE}"

    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        if not calls:
            return ""
        lead = "\n\n" if content.strip() else ""
        return lead + "\n".join(self.call_text(c) for c in calls)

    def recognises(self, facts: TokenizerFacts) -> bool:
        """Qwen's tokens and a template that writes ``<function=`` calls."""
        return Family.recognises(self, facts) and XML_CALL_MARK in facts.chat_template


QWEN3_CODER = Qwen3CoderFamily(
    name="qwen3_coder",
    title="Qwen3-Coder / Qwen3.5",
    end_of_turn=IM_END,
    special_tokens=SPECIAL_TOKENS,
    turn_open_tokens=(IM_START,),
    call_markers=(CALL_OPEN, XML_CALL_MARK),
    sglang=Parsers(tool="qwen3_coder", reasoning="qwen3"),
    vllm=Parsers(tool="qwen3_coder", reasoning="qwen3"),
    aux_shift="always",
    thinking_kwarg="enable_thinking",
    other_ends=("<|endoftext|>",),
    model_types=("qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe"),
)
