"""GLM-4.5 / GLM-4.5-Air / GLM-4.6 (Zhipu AI, zai-org).

Owns no files. The format (the GLM-4.5/4.6 chat template; SGLang 0.5.23
``function_call/glm4_moe_detector.py`` and ``parser/reasoning_parser.py``'s ``Glm45Detector``;
vLLM 0.32 ``tool_parsers/glm47_moe_tool_parser.py`` over ``parser/glm47_moe.py``):

- the prompt starts ``[gMASK]<sop>``; a message is ``<|{role}|>\\n{body}`` with no closing
  token: an answer ends when the model writes the next role token, ``<|user|>`` after an
  answer, ``<|observation|>`` after tool calls (``<|endoftext|>`` also stops it);
- the generation prompt is ``<|assistant|>`` (thinking off adds ``\\n<think></think>``);
- an answer ``\\n<think>{reasoning}</think>`` + ``\\n{content}`` + per call
  ``\\n<tool_call>{name}\\n`` + per argument ``<arg_key>{k}</arg_key>\\n<arg_value>{v}
  </arg_value>\\n`` + ``</tool_call>``; the template strips reasoning and content, writes a
  string value as it is and any other value as JSON;
- thinking is switched by ``chat_template_kwargs.enable_thinking``;
- SGLang's GLM-4 MoE loader adds 1 to every aux id.

SGLang strips the content before a call (vLLM does not); both read values by the tool's schema
and return the arguments as JSON, so the rebuild writes the template's whitespace and values.

vLLM 0.32 serves ``--tool-call-parser glm45`` with its GLM-4.7 parser (``tool_parsers/
__init__.py``), and constrains tool calls by default (``VLLM_ENFORCE_STRICT_TOOL_CALLING``)
with that parser's grammar (``tool_parsers/structural_tag_registry.py`` ``_glm_4_7_tool_tag``:
``<tool_call>NAME`` then ``<arg_key>k</arg_key><arg_value>v</arg_value>`` pairs, no newlines):
a GLM-4.5 model served so writes GLM-4.7's calls (measured with the demo target:
tests/engines/test_families_vllm.py). The rows are the server's ids, what the served model
writes; the cross-check takes that form too (:meth:`GlmFamily.served_variant`). Serve it with
``VLLM_ENFORCE_STRICT_TOOL_CALLING=0`` for the model's own calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import fields

from regen.core.errors import TemplateError
from regen.core.sample import ToolCall
from regen.targets.family import Family, Parsers, ThinkState, TokenizerFacts, arguments_json

USER = "<|user|>"
ASSISTANT = "<|assistant|>"
SYSTEM = "<|system|>"
OBSERVATION = "<|observation|>"
ENDOFTEXT = "<|endoftext|>"
OPEN, CLOSE = "<think>", "</think>"

#: GLM-4 tokenizer ids (vocab 151552); the think, call and argument tokens have no published
#: source, so they are not listed
PUBLISHED_IDS: dict[str, int] = {
    ENDOFTEXT: 151329,
    "[gMASK]": 151331,
    "<sop>": 151333,
    SYSTEM: 151335,
    USER: 151336,
    ASSISTANT: 151337,
    OBSERVATION: 151338,
}
VOCAB_SIZE = 151552
SPECIAL_TOKENS = (
    "[gMASK]", "<sop>", SYSTEM, USER, ASSISTANT, OBSERVATION, "<tool_call>", "</tool_call>",
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
)  # fmt: skip


#: what a GLM-4.7 template writes and a GLM-4.5 one does not: the call's name right after
#: ``<tool_call>`` (SGLang 0.5.23 ``template_detection.py`` ``_is_glm47``; regen.targets.glm47)
GLM47_CALL_RULE = re.compile(r"\{\{[-\s]*['\"]<tool_call>['\"]\s*[+~]\s*tc\.name")


def value_text(value: object) -> str:
    """An argument value as the template writes it (strings as they are, else JSON)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def compact_call_text(call: ToolCall) -> str:
    """A call in GLM-4.7's form, without separators:
    ``<tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>``."""
    args = arguments_json(call.arguments)
    pairs = "".join(
        f"<arg_key>{k}</arg_key><arg_value>{value_text(v)}</arg_value>"
        for k, v in (args.items() if isinstance(args, dict) else ())
    )
    return f"<tool_call>{call.name}{pairs}</tool_call>"


class GlmFamily(Family):
    """GLM's answer framing (module docstring)."""

    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        return "".join(self.call_text(c) for c in calls)

    def call_text(self, call: ToolCall) -> str:
        args = arguments_json(call.arguments)
        pairs = "".join(
            f"<arg_key>{k}</arg_key>\n<arg_value>{value_text(v)}</arg_value>\n"
            for k, v in (args.items() if isinstance(args, dict) else ())
        )
        return f"\n<tool_call>{call.name}\n{pairs}</tool_call>"

    def served_variant(self, engine: str | None) -> Family | None:
        """On vLLM, GLM-4.5's calls in GLM-4.7's form: vLLM 0.32's ``glm45`` parser is its
        GLM-4.7 parser, whose strict tool-call grammar (on by default) has the model write
        ``<tool_call>NAME<arg_key>…`` without the newlines (module docstring)."""
        if engine != "vllm" or type(self) is not GlmFamily:
            return None
        return GLM45_ON_VLLM

    def recognises(self, facts: TokenizerFacts) -> bool:
        """GLM's tokens, a model type of its own (or none), and not a GLM-4.7 template (which
        writes the call's name right after ``<tool_call>``: regen.targets.glm47)."""
        return (
            Family.recognises(self, facts)
            and facts.model_type in (None, *self.model_types)
            and not GLM47_CALL_RULE.search(facts.chat_template)
        )

    def end_text(self, calls: Sequence[ToolCall]) -> str:
        """The role token the model writes next: ``<|observation|>`` after calls."""
        return OBSERVATION if calls else USER

    def response_text(
        self,
        state: ThinkState,
        reasoning: str | None,
        content: str,
        tool_calls: Sequence[ToolCall] = (),
        finish_reason: str = "stop",
    ) -> str:
        """The template's text: ``\\n<think>…</think>``, ``\\n`` + content, the calls, the next
        role token (none when truncated; a turn cut in its reasoning has no close marker)."""
        truncated = finish_reason == "length"
        if state == "closed" and reasoning:
            raise TemplateError("the prompt closed <think> (thinking off) but the server "
                                "returned reasoning; check chat_template_kwargs")  # fmt: skip
        opener = "" if state == "open" else f"\n{OPEN}"
        if state != "closed" and reasoning is not None:
            # SGLang's glm45 leaves the opener in the reasoning (the answer starts with "\n")
            reasoning = reasoning.lstrip().removeprefix(OPEN)
        if truncated and not content and not tool_calls and reasoning is not None:
            return f"{opener}{reasoning.lstrip()}"
        head = ""
        if state == "open" or (state == "none" and reasoning is not None):
            head = f"{opener}{(reasoning or '').strip()}{CLOSE}"
        body = content.lstrip() if truncated and not tool_calls else content.strip()
        end = "" if truncated else self.end_text(tool_calls)
        return f"{head}{chr(10) + body if body else ''}{self.tool_calls_text(tool_calls)}{end}"


class _VllmGlmCalls(GlmFamily):
    """GLM-4.5 as vLLM 0.32's strict tool calling has it write: its framing, and each call in
    GLM-4.7's form after the newline the model writes before it (outside the grammar)."""

    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        return "".join(f"\n{compact_call_text(c)}" for c in calls)


GLM45 = GlmFamily(
    name="glm45",
    title="GLM-4.5 / GLM-4.6",
    end_of_turn=USER,
    special_tokens=SPECIAL_TOKENS,
    turn_open_tokens=(SYSTEM, USER, ASSISTANT, OBSERVATION),
    call_markers=("<tool_call>",),
    sglang=Parsers(tool="glm45", reasoning="glm45"),
    vllm=Parsers(tool="glm45", reasoning="glm45"),
    aux_shift="always",
    thinking_kwarg="enable_thinking",
    other_ends=(OBSERVATION, ENDOFTEXT),
    published_ids=PUBLISHED_IDS,
    published_vocab=VOCAB_SIZE,
    model_types=("glm4_moe",),
)
#: GLM-4.5 on vLLM 0.32 with strict tool calling (GlmFamily.served_variant)
GLM45_ON_VLLM = _VllmGlmCalls(**{f.name: getattr(GLM45, f.name) for f in fields(GLM45)})
