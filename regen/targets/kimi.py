"""Kimi K2 / K2-Thinking / K2.5 / K2.6 (Moonshot AI).

Owns no files. The format (CONTRACTS §1; SGLang 0.5.23 ``function_call/kimik2_detector.py``
and ``--reasoning-parser kimi_k2``; vLLM 0.32 ``tool_parsers/kimi_k2_tool_parser.py`` and
``reasoning/kimi_k2_reasoning_parser.py``):

- every message ``<|im_X|>{role}<|im_middle|>{body}<|im_end|>`` (X: user, assistant, system);
- an answer ``<think>{reasoning}</think>{content}`` + the tool-call section + ``<|im_end|>``;
  the section is ``<|tool_calls_section_begin|>`` + per call ``<|tool_call_begin|>{id}
  <|tool_call_argument_begin|>{arguments}<|tool_call_end|>`` + ``<|tool_calls_section_end|>``
  (no spaces; the id defaults to ``functions.{name}:{index}``; arguments verbatim);
- thinking is switched by ``chat_template_kwargs.thinking``;
- SGLang's DeepSeek-V2 loader (K2.5 delegates to it) adds 1 to the aux ids only when the first
  is 1;
- native rows: pre-tokenized Kimi rows (``kimi_native``) must hold an assistant turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from regen.core.sample import ToolCall
from regen.targets.family import Family, Parsers

IM_END = "<|im_end|>"
CALLS_BEGIN = "<|tool_calls_section_begin|>"
CALLS_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
CALL_ARGS = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"

#: Kimi's special tokens with their ids in the published tokenizer (vocab 163840; CONTRACTS §1)
PUBLISHED_IDS: dict[str, int] = {
    "[BOS]": 163584,
    "[EOS]": 163585,
    IM_END: 163586,
    "<|im_user|>": 163587,
    "<|im_assistant|>": 163588,
    "<|im_system|>": 163594,
    CALLS_BEGIN: 163595,
    CALLS_END: 163596,
    CALL_BEGIN: 163597,
    CALL_ARGS: 163598,
    CALL_END: 163599,
    "<|im_middle|>": 163601,
    "<think>": 163606,
    "</think>": 163607,
    "[PAD]": 163839,
}
VOCAB_SIZE = 163840
#: the framing tokens a Kimi tokenizer must hold
SPECIAL_TOKENS = (
    IM_END, "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
    CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_ARGS, CALL_END,
)  # fmt: skip


class KimiFamily(Family):
    """Kimi's tool-call section (module docstring)."""

    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        if not calls:
            return ""
        parts = [CALLS_BEGIN]
        for i, c in enumerate(calls):
            call_id = c.id or f"functions.{c.name}:{i}"
            parts.append(f"{CALL_BEGIN}{call_id}{CALL_ARGS}{c.arguments}{CALL_END}")
        parts.append(CALLS_END)
        return "".join(parts)


KIMI = KimiFamily(
    name="kimi",
    title="Kimi K2 / K2.5 / K2.6",
    end_of_turn=IM_END,
    special_tokens=SPECIAL_TOKENS,
    turn_open_tokens=("<|im_user|>", "<|im_assistant|>", "<|im_system|>"),
    call_markers=(CALLS_BEGIN, CALL_BEGIN),
    sglang=Parsers(tool="kimi_k2", reasoning="kimi_k2"),
    vllm=Parsers(tool="kimi_k2", reasoning="kimi_k2"),
    aux_shift="first_is_one",
    thinking_kwarg="thinking",
    native_turn_tokens=("<|im_assistant|>", "<|im_middle|>", IM_END),
    published_ids=PUBLISHED_IDS,
    published_vocab=VOCAB_SIZE,
    model_types=("kimi_k2", "kimi_k25", "kimi_vl"),
    remote_code=True,
)
