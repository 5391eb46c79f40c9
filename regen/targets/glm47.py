"""GLM-4.7 and GLM-4.7-Flash (Zhipu AI, zai-org): GLM-4.5's tokens without its separators.

Owns no files. The format (the GLM-4.7-Flash chat template, vendored as
``regen/devkit/tokenizers/templates/glm47.jinja``; SGLang 0.5.23
``function_call/glm47_moe_detector.py`` (``glm47``) and ``parser/reasoning_parser.py``'s
``Glm45Detector`` (``glm45``: SGLang has no ``glm47`` reasoning parser); vLLM 0.32
``parser/glm47_moe.py``, which both its ``glm45`` and ``glm47`` names select):

- the tokens, roles and end of an answer are GLM-4.5's (:mod:`regen.targets.glm`): a message
  is ``<|{role}|>{body}`` with no separator and no closing token; an answer ends when the model
  writes the next role token, ``<|observation|>`` after tool calls, ``<|user|>`` otherwise
  (``<|endoftext|>`` also stops it);
- the generation prompt is ``<|assistant|><think>`` (thinking on: the reasoning is open) or
  ``<|assistant|></think>`` (``enable_thinking`` false: closed);
- an answer ``{reasoning}</think>{content}`` + per call ``<tool_call>{name}`` + per argument
  ``<arg_key>{k}</arg_key><arg_value>{v}</arg_value>`` + ``</tool_call>``: no newline anywhere
  (GLM-4.5 writes one before the think block, the content, each call and each argument); the
  template strips reasoning and content, writes a string value as it is and any other value
  as JSON;
- thinking is switched by ``chat_template_kwargs.enable_thinking`` (``clear_thinking`` false
  keeps the reasoning of earlier turns in the prompt: a history matter, passed as an extra
  kwarg);
- SGLang's GLM-4 MoE loader (GLM-4.7, ``glm4_moe``) adds 1 to every aux id, its GLM-4 MoE Lite
  loader (GLM-4.7-Flash, ``glm4_moe_lite``) only when the first id is 1; the family holds the
  stricter rule (:data:`AUX_SHIFT`), which a list starting at layer 1 satisfies for both.

Recognition: GLM-4.7 has GLM-4.5's tokens and ``model_type`` (``glm4_moe``), so the template
decides, by SGLang's own rule (``parser/template_detection.py`` ``_is_glm47``): the call is
written ``'<tool_call>' + tc.name`` with nothing between. A folder whose ``config.json`` names
another model type is not this family (GLM-5's ``glm_moe_dsa``); ``glm4_moe_lite`` is
GLM-4.7-Flash even without a template. The registry must try this family before GLM-4.5's,
whose recognition reads the tokens only.

The engines' parsers (tests/targets/test_glm47_contract.py): SGLang's ``glm47`` strips the
content around the calls and appends text written after a call to it, vLLM drops that text;
SGLang reads every value by the tool's schema (a string-typed value written as a JSON string
loses its quotes), vLLM keeps a value as written unless the schema types it; a typed value comes
back re-serialised by both (an object written compactly gets JSON's default separators); vLLM
rstrips the reasoning; neither says which token ended the answer (``<|endoftext|>`` or the next
role token: the rebuild writes the role token). The rebuild writes the template's own
whitespace and values.
"""

from __future__ import annotations

from collections.abc import Sequence

from regen.core.errors import TemplateError
from regen.core.sample import ToolCall
from regen.targets.family import (
    AuxShift,
    Family,
    Parsers,
    ThinkState,
    TokenizerFacts,
)
from regen.targets.glm import (
    ASSISTANT,
    CLOSE,
    ENDOFTEXT,
    GLM47_CALL_RULE,
    OBSERVATION,
    OPEN,
    PUBLISHED_IDS,
    SPECIAL_TOKENS,
    SYSTEM,
    USER,
    VOCAB_SIZE,
    GlmFamily,
    compact_call_text,
)

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
#: the thinking switch the 4.7 template reads (GLM-5.3's template has none: not this family)
SWITCH = "enable_thinking"
#: config.json model types: GLM-4.7 (Glm4MoeForCausalLM) and GLM-4.7-Flash
#: (Glm4MoeLiteForCausalLM)
MODEL_TYPE, FLASH_MODEL_TYPE = "glm4_moe", "glm4_moe_lite"
#: GLM-4.7's loader adds 1 always, 4.7-Flash's only when the first id is 1: the family holds
#: the second (a first id of 1 is captured right by both)
AUX_SHIFT: AuxShift = "first_is_one"


class Glm47Family(GlmFamily):
    """GLM-4.7's answer framing (module docstring)."""

    def call_text(self, call: ToolCall) -> str:
        return compact_call_text(call)

    def response_text(
        self,
        state: ThinkState,
        reasoning: str | None,
        content: str,
        tool_calls: Sequence[ToolCall] = (),
        finish_reason: str = "stop",
    ) -> str:
        """The template's text: ``{reasoning}</think>`` (after an open prompt), the content,
        the calls, the next role token (none when truncated; a turn cut in its reasoning ends
        where the model stopped)."""
        if state == "closed" and reasoning:
            raise TemplateError("the prompt closed <think> (thinking off) but the server "
                                "returned reasoning; check chat_template_kwargs")  # fmt: skip
        truncated = finish_reason == "length"
        cut_in_reasoning = truncated and not content and not tool_calls
        head = self.reasoning_head(state, reasoning, cut_in_reasoning)
        if cut_in_reasoning and head:
            return head
        body = content.lstrip() if truncated and not tool_calls else content.strip()
        end = "" if truncated else self.end_text(tool_calls)
        return f"{head}{body}{self.tool_calls_text(tool_calls)}{end}"

    def reasoning_head(self, state: ThinkState, reasoning: str | None, cut: bool) -> str:
        """What precedes the content: the reasoning and ``</think>`` after an open prompt (the
        opener too where the prompt has none and the server returned reasoning); a cut
        reasoning as the model left it."""
        if state == "closed" or (state == "none" and reasoning is None):
            return ""
        opener = "" if state == "open" else OPEN
        if cut:
            return f"{opener}{reasoning or ''}"
        return f"{opener}{(reasoning or '').strip()}{CLOSE}"

    def recognises(self, facts: TokenizerFacts) -> bool:
        """GLM's tokens, no other model type than 4.7's, and a 4.7 template (or the 4.7-Flash
        model type); module docstring. The token rule is the base's, not GLM-4.5's (which may
        come to refuse 4.7 templates)."""
        if not Family.recognises(self, facts):
            return False
        if facts.model_type is not None and facts.model_type not in self.model_types:
            return False
        template = facts.chat_template
        if template:
            return bool(GLM47_CALL_RULE.search(template)) and SWITCH in template
        return facts.model_type == FLASH_MODEL_TYPE


GLM47 = Glm47Family(
    name="glm47",
    title="GLM-4.7 / GLM-4.7-Flash",
    end_of_turn=USER,
    special_tokens=SPECIAL_TOKENS,
    turn_open_tokens=(SYSTEM, USER, ASSISTANT, OBSERVATION),
    call_markers=(CALL_OPEN,),
    sglang=Parsers(tool="glm47", reasoning="glm45"),
    vllm=Parsers(tool="glm47", reasoning="glm47"),
    aux_shift=AUX_SHIFT,
    thinking_kwarg=SWITCH,
    other_ends=(OBSERVATION, ENDOFTEXT),
    published_ids=PUBLISHED_IDS,
    published_vocab=VOCAB_SIZE,
    model_types=(MODEL_TYPE, FLASH_MODEL_TYPE),
)
