"""Qwen3 (Qwen3-8B, Qwen3-235B-A22B, the 2507 Instruct / Thinking variants; Alibaba Qwen).

Owns no files. The format (the Qwen3 chat template; SGLang 0.5.23
``function_call/qwen25_detector.py`` and ``parser/reasoning_parser.py`` ``Qwen3Detector``;
vLLM 0.32 ``tool_parsers/hermes_tool_parser.py`` and ``parser/qwen3.py``):

- every message ``<|im_start|>{role}\\n{body}<|im_end|>\\n``; the generation prompt is
  ``<|im_start|>assistant\\n`` (thinking off adds ``<think>\\n\\n</think>\\n\\n``; the
  Thinking-2507 template opens ``<think>\\n`` itself);
- an answer with reasoning is ``<think>\\n{reasoning}\\n</think>\\n\\n{content}`` (the template
  strips the reasoning's newlines and the content's leading ones);
- each call ``<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>``, after a newline
  when content or another call precedes it; then ``<|im_end|>``;
- thinking is switched by ``chat_template_kwargs.enable_thinking``;
- SGLang's Qwen3 loaders add 1 to every aux id.

The servers' parsers disagree on whitespace (SGLang strips the content before a call, vLLM
keeps it; both keep the newlines around the reasoning), so :class:`Qwen3Family` assembles the
template's own whitespace from whatever they return. :class:`Qwen3Family` is also the base of
the families that share this framing (:mod:`regen.targets.qwen3_coder`, :mod:`regen.targets.glm`).
"""

from __future__ import annotations

from collections.abc import Sequence

from regen.core.sample import ToolCall
from regen.targets.family import Family, Parsers, ThinkState, TokenizerFacts

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"

#: the special tokens of the Qwen2.5 / Qwen3 tokenizer with their published ids (vocab 151936)
PUBLISHED_IDS: dict[str, int] = {
    "<|endoftext|>": 151643,
    IM_START: 151644,
    IM_END: 151645,
    CALL_OPEN: 151657,
    CALL_CLOSE: 151658,
    "<tool_response>": 151665,
    "</tool_response>": 151666,
    "<think>": 151667,
    "</think>": 151668,
}
VOCAB_SIZE = 151936
#: the framing tokens a Qwen3 tokenizer holds (Qwen2.5 lacks the think tokens)
SPECIAL_TOKENS = (IM_START, IM_END, CALL_OPEN, CALL_CLOSE, "<think>", "</think>")
#: what a template that writes XML calls holds (Qwen3-Coder, Qwen3.5)
XML_CALL_MARK = "<function="


class Qwen3Family(Family):
    """The Qwen chat framing with the template's own whitespace (module docstring); the call
    text is :meth:`call_text`'s."""

    #: what separates the reasoning block from the content
    after_think = "\n\n"

    def call_text(self, call: ToolCall) -> str:
        """One call as the model writes it (hermes JSON)."""
        body = f'{{"name": "{call.name}", "arguments": {call.arguments}}}'
        return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"

    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        if not calls:
            return ""
        lead = "\n" if content.strip() else ""
        return lead + "\n".join(self.call_text(c) for c in calls)

    def response_text(
        self,
        state: ThinkState,
        reasoning: str | None,
        content: str,
        tool_calls: Sequence[ToolCall] = (),
        finish_reason: str = "stop",
    ) -> str:
        """The base assembly over the template's whitespace: reasoning ``\\n…\\n`` (after an
        open prompt that wrote ``<think>\\n``: ``…\\n``), content after ``\\n\\n``, content
        before calls stripped."""
        cut = finish_reason == "length" and not content and not tool_calls
        block = reasoning is not None and state != "closed"
        if block:
            reasoning = self.reasoning_body(state, reasoning or "", cut)
        return super().response_text(
            state, reasoning, self.content_body(content, tool_calls, block and not cut), tool_calls,
            finish_reason,
        )  # fmt: skip

    def reasoning_body(self, state: ThinkState, reasoning: str, cut: bool) -> str:
        """The reasoning between the markers as the template writes it (a cut one ends where
        the model stopped)."""
        lead = "" if state == "open" else "\n"
        body = reasoning.lstrip("\n") if cut else reasoning.strip("\n")
        return f"{lead}{body}" if cut else f"{lead}{body}\n"

    def content_body(self, content: str, calls: Sequence[ToolCall], after_block: bool) -> str:
        """The content as the template writes it: stripped before calls, its leading newlines
        replaced by :attr:`after_think` after a reasoning block."""
        body = content.strip() if calls else content
        return f"{self.after_think}{body.lstrip(chr(10))}" if after_block else body

    def recognises(self, facts: TokenizerFacts) -> bool:
        """Qwen's tokens and a template that writes JSON calls (not ``<function=``)."""
        return super().recognises(facts) and XML_CALL_MARK not in facts.chat_template


QWEN3 = Qwen3Family(
    name="qwen3",
    title="Qwen3",
    end_of_turn=IM_END,
    special_tokens=SPECIAL_TOKENS,
    turn_open_tokens=(IM_START,),
    call_markers=(CALL_OPEN,),
    sglang=Parsers(tool="qwen25", reasoning="qwen3"),
    vllm=Parsers(tool="hermes", reasoning="qwen3"),
    aux_shift="always",
    thinking_kwarg="enable_thinking",
    other_ends=("<|endoftext|>",),
    published_ids=PUBLISHED_IDS,
    published_vocab=VOCAB_SIZE,
    model_types=("qwen3", "qwen3_moe"),
)
