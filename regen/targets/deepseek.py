"""DeepSeek-V3.1 (and V3.1-Terminus; DeepSeek-AI).

Owns no files. The format (the V3.1 chat template; SGLang 0.5.23
``function_call/deepseekv31_detector.py`` and ``parser/reasoning_parser.py``'s ``deepseek-v3``
detector; vLLM 0.32 ``tool_parsers/deepseekv31_tool_parser.py`` and
``reasoning/deepseek_v3_reasoning_parser.py``):

- a user turn ``<｜User｜>{content}``; the generation prompt ``<｜Assistant｜><think>`` with
  thinking on, ``<｜Assistant｜></think>`` with it off (so a turn always starts open or closed);
- an answer ``{reasoning}</think>{content}``, then the calls, then ``<｜end▁of▁sentence｜>``;
  nothing is written between the pieces (no newlines);
- the calls ``<｜tool▁calls▁begin｜>`` + per call ``<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>
  {arguments}<｜tool▁call▁end｜>`` + ``<｜tool▁calls▁end｜>``;
- thinking is switched by ``chat_template_kwargs.thinking``;
- SGLang's DeepSeek-V2 loader adds 1 to the aux ids only when the first is 1.

SGLang strips the content before the calls and re-serializes the arguments; vLLM keeps both as
written but, its call pattern lacking DOTALL, loses a call whose arguments hold a newline.
"""

from __future__ import annotations

from collections.abc import Sequence

from regen.core.sample import ToolCall
from regen.targets.family import Family, Parsers, TokenizerFacts

EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
CALL_SEP = "<｜tool▁sep｜>"
#: DeepSeek-V3.2 is not this family, though its tokenizer holds the same special tokens: its
#: calls are DSML blocks (SGLang ``deepseekv32``, vLLM ``deepseek_v32``) and it publishes no
#: chat template (both engines render its prompts with their own Python encoder). Its
#: ``config.json`` model type, a template holding DSML, or none at all tells it apart.
DSML_MARK = "DSML"
V32_MODEL_TYPES = ("deepseek_v32",)

#: published ids of the DeepSeek-V3 tokenizer (vocab 129280). The think tokens (128798/128799
#: in V3.1) are left out: the one source naming them disagrees with its own docs.
PUBLISHED_IDS: dict[str, int] = {
    "<｜begin▁of▁sentence｜>": 0,
    EOS: 1,
    USER: 128803,
    ASSISTANT: 128804,
    CALLS_BEGIN: 128806,
    CALLS_END: 128807,
    CALL_BEGIN: 128808,
    CALL_END: 128809,
    CALL_SEP: 128814,
}
VOCAB_SIZE = 129280
SPECIAL_TOKENS = (EOS, USER, ASSISTANT, CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, CALL_SEP)


class DeepSeekFamily(Family):
    """DeepSeek-V3.1's tool-call block (module docstring)."""

    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        if not calls:
            return ""
        body = "".join(f"{CALL_BEGIN}{c.name}{CALL_SEP}{c.arguments}{CALL_END}" for c in calls)
        return f"{CALLS_BEGIN}{body}{CALLS_END}"

    def recognises(self, facts: TokenizerFacts) -> bool:
        """DeepSeek's tokens and a V3.1 template: not V3.2 (:data:`DSML_MARK`)."""
        return (
            super().recognises(facts)
            and bool(facts.chat_template)
            and DSML_MARK not in facts.chat_template
            and facts.model_type not in V32_MODEL_TYPES
        )


DEEPSEEK_V3 = DeepSeekFamily(
    name="deepseek_v3",
    title="DeepSeek-V3.1",
    end_of_turn=EOS,
    special_tokens=SPECIAL_TOKENS,
    turn_open_tokens=(USER, ASSISTANT),
    call_markers=(CALLS_BEGIN, CALL_BEGIN),
    sglang=Parsers(tool="deepseekv31", reasoning="deepseek-v3"),
    vllm=Parsers(tool="deepseek_v31", reasoning="deepseek_v3"),
    aux_shift="first_is_one",
    thinking_kwarg="thinking",
    published_ids=PUBLISHED_IDS,
    published_vocab=VOCAB_SIZE,
    model_types=("deepseek_v3",),
)
