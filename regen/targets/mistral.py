"""Mistral's ``[TOOL_CALLS]`` / ``[THINK]`` format (mistral_common tokenizer v13 and later: the
``[THINK]`` Magistral-Small releases, Ministral-3 (2512, Reasoning and Instruct),
Devstral-Small-2507 / Devstral 2; Mistral AI).

Owns no files. The format (the Ministral-3-14B-Reasoning-2512 chat template, vendored as
``regen/devkit/tokenizers/templates/mistral.jinja``; mistral_common's ``InstructTokenizerV13``
(``tokens/tokenizers/instruct.py``); SGLang 0.5.23 ``function_call/mistral_detector.py`` and
``parser/reasoning_parser.py``'s ``MistralDetector``; vLLM 0.32
``tool_parsers/mistral_tool_parser.py`` and ``reasoning/mistral_reasoning_parser.py``, both
adapters of ``parser/mistral.py``):

- the prompt ``<s>[SYSTEM_PROMPT]…[/SYSTEM_PROMPT][AVAILABLE_TOOLS]…[/AVAILABLE_TOOLS]``, then
  ``[INST]{user}[/INST]``, each answer followed by ``</s>``, tool results
  ``[TOOL_RESULTS]{content}[/TOOL_RESULTS]``; there is no generation prompt (the prompt ends
  ``[/INST]`` or ``[/TOOL_RESULTS]``: state ``none``);
- an answer ``[THINK]{reasoning}[/THINK]`` when it reasons, the content, then per call
  ``[TOOL_CALLS]{name}[ARGS]{arguments as JSON}`` (mistral_common writes the arguments with
  ``json.dumps``: ``", "`` and ``": "``), then ``</s>``;
- thinking has no switch: the template's default system prompt asks the reasoning models to
  think in ``[THINK]…[/THINK]``; a caller's system message replaces it (the model may then not
  think). Reasoning in history is rendered only from ``thinking`` content chunks; a message's
  ``reasoning_content`` is dropped;
- SGLang's Mistral and Ministral-3 loaders (Llama subclasses) add 1 to every aux id. The
  multimodal ``Mistral3ForConditionalGeneration`` (Mistral-Small-3.x, Magistral-Small-2509,
  Ministral-3 as published) has no EAGLE-3 capture in SGLang 0.5.23: its server refuses the
  draft.

Other tokenizer versions write other calls and are not this family (:meth:`MistralFamily.recognises`
refuses their templates): v3 / v7 (Mistral-7B-v0.3, Nemo, Small-3.1)
``[TOOL_CALLS][{"name": …, "arguments": …}]``, v11 (Mistral-Small-3.2)
``[TOOL_CALLS]{name}[CALL_ID]{id}[ARGS]{json}`` (SGLang drops such a call, vLLM names it
``{name}{id}``, the special ``[CALL_ID]`` dropped). v15 adds ``[MODEL_SETTINGS]`` (reasoning
effort), not modelled here. Mistral Large 3 writes this format too but is a DeepSeek-V3 model
(SGLang's ``MistralLarge3ForCausalLM`` numbers aux ids as DeepSeek's: ``first_is_one``);
recognition refuses a ``config.json`` ``model_type`` outside :attr:`Family.model_types`.

The templates are strict. The Ministral-3 template refuses (TemplateError, and the engines a 400)
a conversation whose user and assistant turns do not alternate after the system message (two
user messages in a row; assistant messages with calls and tool results are exempt), a system
message anywhere but first, and an assistant message with neither content nor calls (an empty
answer in the history); such a sample fails to render, on the engines too. regen's demo
samples alternate and render.
The v11 template (Mistral-Small-3.2) also refuses call ids that are not 9 characters, and vLLM's
``mistral`` tokenizer mode cuts longer ids to their last 9.

vLLM renders with mistral_common, not the Jinja template, when the model folder has
``tekken.json`` or ``tokenizer.model.v*`` and ``--tokenizer-mode`` is ``auto``
(``tokenizers/registry.py``, ``renderers/mistral.py``): no default system prompt, the template
kwargs ignored. regen renders the Jinja template, so vLLM is run with ``--tokenizer-mode hf``
(:attr:`MistralFamily.vllm_tokenizer_mode`; a repo with both weight formats also wants
``--config-format hf --load-format hf``). SGLang renders the Jinja template of the HF tokenizer
(a folder with ``tekken.json`` and no ``tokenizer.json`` loads mistral_common's tokenizer
instead: ``utils/hf_transformers/tokenizer.py``).

What the engines give back:

- the reasoning: vLLM strips its trailing whitespace, SGLang keeps it;
- content before calls: both strip it; text after the calls: vLLM drops it, SGLang appends it to
  the content after a space;
- arguments: vLLM returns the model's JSON text as written (re-dumped only when the tool's
  schema changes a value's type), SGLang re-dumps it with ``json.dumps`` (``", "``, ``": "``);
  the rebuild writes the text it is given;
- SGLang keeps the special tokens (``[THINK]``) in its output only for requests with tools or a
  reasoning effort (``serving_chat.py``); every request therefore asks for
  ``skip_special_tokens: false`` (:meth:`MistralFamily.request_fields`), so that an answer
  without tools keeps its ``[THINK]`` markers (vLLM's parser asks for it itself). SGLang forces
  its reasoning parser open only when a request sets ``reasoning_effort``, which regen does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from regen.core.sample import ToolCall
from regen.targets.family import Family, Parsers, Thinking, ThinkState, TokenizerFacts

BOS, EOS = "<s>", "</s>"
INST, INST_END = "[INST]", "[/INST]"
TOOLS, TOOLS_END = "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"
RESULTS, RESULTS_END = "[TOOL_RESULTS]", "[/TOOL_RESULTS]"
SYSTEM, SYSTEM_END = "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"
TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
THINK, THINK_END = "[THINK]", "[/THINK]"

#: tekken control-token ranks (mistral_common ``tekken.py``); the ids of ``[ARGS]``,
#: ``[THINK]`` and ``[/THINK]`` have no published source here, so they are not listed
PUBLISHED_IDS: dict[str, int] = {
    "<unk>": 0,
    BOS: 1,
    EOS: 2,
    INST: 3,
    INST_END: 4,
    TOOLS: 5,
    TOOLS_END: 6,
    RESULTS: 7,
    RESULTS_END: 8,
    TOOL_CALLS: 9,
    "<pad>": 11,
    SYSTEM: 17,
    SYSTEM_END: 18,
}
#: tekken's vocabulary (mistral_common ``data/tekken_240911.json``)
VOCAB_SIZE = 131072
SPECIAL_TOKENS = (
    INST, INST_END, TOOLS, TOOLS_END, RESULTS, RESULTS_END, SYSTEM, SYSTEM_END, TOOL_CALLS, ARGS,
)  # fmt: skip
#: what templates of the other call formats write (v11's call ids, v3/v7's JSON list)
OTHER_FORMATS = (CALL_ID, f"{TOOL_CALLS}[")


class MistralFamily(Family):
    """The v13 ``[TOOL_CALLS]name[ARGS]{json}`` calls (module docstring)."""

    #: vLLM's ``--tokenizer-mode``: the HF tokenizer, so that vLLM renders the Jinja template
    #: regen renders (``auto`` picks mistral_common for a folder with ``tekken.json``)
    vllm_tokenizer_mode: ClassVar[str | None] = "hf"

    def request_fields(self, thinking: Thinking) -> dict[str, object]:
        """``skip_special_tokens: false``: SGLang otherwise drops ``[THINK]`` / ``[/THINK]``
        from an answer to a request without tools (module docstring)."""
        self.effort(thinking)
        return {"skip_special_tokens": False}

    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        return "".join(f"{TOOL_CALLS}{c.name}{ARGS}{c.arguments}" for c in calls)

    def response_text(
        self,
        state: ThinkState,
        reasoning: str | None,
        content: str,
        tool_calls: Sequence[ToolCall] = (),
        finish_reason: str = "stop",
    ) -> str:
        """``[THINK]{reasoning}[/THINK]`` when there is reasoning, the content, the calls,
        ``</s>``; empty reasoning is none (the servers report it as none)."""
        return super().response_text(state, reasoning or None, content, tool_calls,
                                     finish_reason)  # fmt: skip

    def recognises(self, facts: TokenizerFacts) -> bool:
        """Mistral's instruction and v11+ call tokens, a template (where there is one) that
        writes no other call format, and a Mistral ``model_type`` where ``config.json`` gives
        one."""
        if not Family.recognises(self, facts):
            return False
        if any(mark in facts.chat_template for mark in OTHER_FORMATS):
            return False
        return facts.model_type is None or facts.model_type in self.model_types


MISTRAL = MistralFamily(
    name="mistral",
    title="Mistral [TOOL_CALLS] / [THINK] (v13+: Magistral, Ministral-3, Devstral)",
    end_of_turn=EOS,
    special_tokens=SPECIAL_TOKENS,
    turn_open_tokens=(INST, RESULTS, SYSTEM),
    call_markers=(TOOL_CALLS,),
    sglang=Parsers(tool="mistral", reasoning="mistral"),
    vllm=Parsers(tool="mistral", reasoning="mistral"),
    aux_shift="always",
    think=(THINK, THINK_END),
    published_ids=PUBLISHED_IDS,
    published_vocab=VOCAB_SIZE,
    model_types=("mistral", "mistral3", "ministral", "ministral3"),
)
