"""MiniMax-M3 (MiniMax-M3 and M3-VL; MiniMax): M2's framing, ``<mm:think>`` and namespaced calls.

Owns no files. No MiniMax-M3 chat template was available to read: the format below is the
engines' (SGLang 0.5.23 ``function_call/minimax_m3.py`` (``minimax-m3``),
``parser/reasoning_parser.py``'s ``MiniMaxM3Detector`` (``minimax-m3``) and
``entrypoints/openai/serving_chat.py``'s M3 request rules; vLLM 0.32 ``parser/minimax_m3.py``
and ``reasoning/minimax_m3_reasoning_parser.py``, both named ``minimax_m3``) and what public
copies of the template quote:

- the framing tokens are MiniMax-M2's (:mod:`regen.targets.minimax_m2`): ``]~!b[``, a message
  ``]~b]{role}\\n{body}[e~[\\n``, the generation prompt ``]~b]ai\\n`` + the thinking mode's
  prefill, and an answer ends with ``[e~[``;
- thinking is ``chat_template_kwargs.thinking_mode``: ``enabled`` prefills ``<mm:think>`` (the
  reasoning is open), ``disabled`` prefills ``</mm:think>`` (closed), ``adaptive`` (the
  template's default) prefills nothing and the model opens ``<mm:think>`` itself or answers
  directly. regen's ``sampling.thinking``: ``true`` (or ``enabled``) → ``enabled``, ``false``
  → ``disabled``, ``adaptive`` → ``adaptive`` (:attr:`Family.efforts` holds the two modes
  that think, the default first). SGLang also maps a request's ``thinking.type`` and
  ``reasoning_effort`` (``none``/``minimal`` → disabled) onto the kwargs for a
  ``minimax_m3_vl`` model; the template's ``reasoning_effort`` (low … max) is left to
  ``sampling.chat_template_kwargs``;
- an answer ``[<mm:think>]{reasoning}</mm:think>{content}`` + the calls + ``[e~[``, the pieces
  as the model wrote them (both engines return reasoning and content unstripped);
- every structural tag of a call is prefixed with the added (non-special) token
  ``]<]minimax[>[`` (NS below); the calls ``NS<tool_call>\\n`` + per call ``NS<invoke
  name="{name}">`` + per argument ``NS<{key}>{value}NS</{key}>`` + ``NS</invoke>\\n``, then
  ``NS</tool_call>``. An object value is its members as elements, a list its items as
  ``<item>`` elements, a string as it is, any other scalar as JSON. The whitespace between the
  tags follows replies seen in public bug reports, not a template: SGLang normalises
  whitespace before a tag, vLLM skips it between arguments;
- SGLang's MiniMax-M3 loaders (``minimax_m3.py``, ``minimax_m3_vl.py``) add 1 to every aux id.

The prompt: neither engine has a Python encoder for M3 (both render the checkpoint's own
template), so regen renders M3 prompts only with the template the target ships (never a
vendored one); with none, run with the server's token ids.

What the engines lose (tests/targets/test_minimax_m3_contract.py): a reply in adaptive mode
that opens with a stray ``</mm:think>`` (M3 writes one before non-thinking history turns) comes
back without it from both, and an empty ``<mm:think></mm:think>`` block as no block; SGLang
appends text written after the calls to the content, vLLM drops it; whitespace inside an
``<invoke>`` is not in the parsed call. vLLM's M3 parsers leave ``skip_special_tokens`` on (its
parser says M3's markers are not special tokens; were ``]<]minimax[>[`` special, its tool parser
would lose every argument).

Recognition: M2's framing tokens and M3's own: its markers in the template (SGLang's rule,
``parser/template_detection.py`` ``_is_minimax_m3``), its think tokens, or an M3 ``model_type``;
a folder whose ``config.json`` names another model type is not M3. The registry must try this
family before MiniMax-M2 (a folder with neither template nor ``config.json`` holding M3's
tokens also passes M2's token rule).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from regen.core.sample import ToolCall
from regen.targets.family import (
    Family,
    Parsers,
    Thinking,
    ThinkState,
    TokenizerFacts,
    arguments_json,
)
from regen.targets.minimax_m2 import BOS, END, ROLE, VOCAB_SIZE

NS = "]<]minimax[>["
OPEN, CLOSE = "<mm:think>", "</mm:think>"
CALLS_OPEN = f"{NS}<tool_call>"
CALLS_CLOSE = f"{NS}</tool_call>"
INVOKE = f'{NS}<invoke name="'
INVOKE_CLOSE = f"{NS}</invoke>"
ITEM = "item"
#: ``chat_template_kwargs.thinking_mode``: the modes that think (the default first), and off
SWITCH = "thinking_mode"
ENABLED, ADAPTIVE, DISABLED = "enabled", "adaptive", "disabled"
MODEL_TYPES = ("minimax_m3", "minimax_m3_vl")
#: what tells an M3 template from an M2 one (SGLang's ``_is_minimax_m3``)
TEMPLATE_MARKS = (OPEN, NS)
SPECIAL_TOKENS = (BOS, ROLE, END, OPEN, CLOSE, NS)
#: published ids: BOS and EOS as MiniMax-M2's (M3 configs name eos 200020); the think tokens'
#: ids (second-hand only) are left out
PUBLISHED_IDS: dict[str, int] = {ROLE: 200019, END: 200020, BOS: 200034}


def value_xml(value: object) -> str:
    """A value as M3 writes it: an object's members and a list's items as namespaced elements,
    a string as it is, any other scalar as JSON."""
    if isinstance(value, dict):
        return "".join(element(k, v) for k, v in value.items())
    if isinstance(value, list):
        return "".join(element(ITEM, v) for v in value)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def element(name: str, value: object) -> str:
    """``NS<name>{value}NS</name>``."""
    return f"{NS}<{name}>{value_xml(value)}{NS}</{name}>"


class MiniMaxM3Family(Family):
    """MiniMax-M3's thinking modes and calls (module docstring)."""

    def template_kwargs(self, thinking: Thinking) -> dict[str, object]:
        """``thinking_mode``: the mode asked for (``enabled`` for ``true``), ``disabled`` for
        ``false``."""
        return {SWITCH: self.effort(thinking) or DISABLED}

    def response_text(
        self,
        state: ThinkState,
        reasoning: str | None,
        content: str,
        tool_calls: Sequence[ToolCall] = (),
        finish_reason: str = "stop",
    ) -> str:
        """The base assembly, the pieces as they came; after a prompt that left the reasoning to
        the model (adaptive), empty reasoning is none (SGLang returns '' for a reply that
        opened no ``<mm:think>``)."""
        if state == "none" and not reasoning:
            reasoning = None
        return super().response_text(state, reasoning, content, tool_calls, finish_reason)

    def call_text(self, call: ToolCall) -> str:
        """One ``<invoke>`` block."""
        args = arguments_json(call.arguments)
        params = "".join(element(k, v) for k, v in (args.items() if isinstance(args, dict) else ()))
        return f'{INVOKE}{call.name}">{params}{INVOKE_CLOSE}\n'

    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        if not calls:
            return ""
        return f"{CALLS_OPEN}\n{''.join(self.call_text(c) for c in calls)}{CALLS_CLOSE}"

    def recognises(self, facts: TokenizerFacts) -> bool:
        """M2's framing tokens and M3's own evidence (module docstring)."""
        if not {BOS, ROLE, END} <= facts.tokens:
            return False
        if facts.model_type is not None:
            return facts.model_type in self.model_types
        if facts.chat_template:
            return any(mark in facts.chat_template for mark in TEMPLATE_MARKS)
        return {OPEN, CLOSE} <= facts.tokens


MINIMAX_M3 = MiniMaxM3Family(
    name="minimax_m3",
    title="MiniMax-M3",
    end_of_turn=END,
    special_tokens=SPECIAL_TOKENS,
    turn_open_tokens=(ROLE,),
    call_markers=(CALLS_OPEN, INVOKE),
    sglang=Parsers(tool="minimax-m3", reasoning="minimax-m3"),
    vllm=Parsers(tool="minimax_m3", reasoning="minimax_m3"),
    aux_shift="always",
    think=(OPEN, CLOSE),
    thinking_kwarg=SWITCH,
    efforts=(ENABLED, ADAPTIVE),
    published_ids=PUBLISHED_IDS,
    published_vocab=VOCAB_SIZE,
    model_types=MODEL_TYPES,
)
