"""MiniMax-M2 (and M2.1 / M2.5 / M2.7, which share its format; MiniMax).

Owns no files. The format (the MiniMax-M2 chat template, vendored as
``regen/devkit/tokenizers/templates/minimax_m2.jinja``; SGLang 0.5.23
``function_call/minimax_m2.py`` (``minimax-m2``) and ``parser/reasoning_parser.py``'s
``minimax`` name (the Qwen3 detector, always forced into the reasoning); vLLM 0.32
``parser/minimax_m2.py``, which its ``minimax_m2`` tool and reasoning names select):

- the prompt starts ``]~!b[``; a message is ``]~b]{role}\\n{body}[e~[\\n`` (roles ``system``,
  ``user``, ``ai``, ``tool``); the generation prompt is ``]~b]ai\\n<think>\\n``: the model always
  thinks (no switch), the reasoning is open;
- an answer ``{reasoning}\\n</think>\\n\\n{content}``, then the calls, then ``[e~[``;
- the calls ``\\n<minimax:tool_call>\\n`` + per call ``<invoke name="{name}">\\n`` + per argument
  ``<parameter name="{k}">{v}</parameter>\\n`` + ``</invoke>\\n``, then ``</minimax:tool_call>``;
  the leading newline is written even after empty content; arguments in their own order, a
  string value as it is, any other as JSON;
- the template writes the history's reasoning (only after the last user message) and content
  as they are;
- SGLang's MiniMax-M2 loader adds 1 to every aux id.

What the engines give back (tests/targets/test_minimax_m2_contract.py): SGLang keeps the
reasoning's trailing newline and all of the content's whitespace, vLLM rstrips the reasoning
and strips the content before calls; SGLang trims the newlines around a value and reads values
by the tool's schema (any schema that admits ``null`` makes every value None, and so does the
text ``null``/``none``/``nil``), vLLM keeps values verbatim and coerces them by the schema;
text after the calls SGLang appends to the content, vLLM drops. The rebuild writes the
template's whitespace: the reasoning without its trailing newlines, the content after
``\\n\\n`` (stripped before calls).

Recognition: M2's tokens, a template that writes ``<minimax:tool_call>`` (MiniMax-M3's, which
shares the framing tokens, writes namespaced tags instead) and no other ``model_type`` than
``minimax_m2``. A folder with neither template nor ``config.json`` but M3's tokens (which
include M2's) is both families' by these rules: the registry must try
:mod:`regen.targets.minimax_m3` first (M3 builds on this module, so this one cannot ask it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from regen.core.sample import ToolCall
from regen.targets.family import Family, Parsers, ThinkState, TokenizerFacts, arguments_json

BOS = "]~!b["
ROLE = "]~b]"
END = "[e~["
OPEN, CLOSE = "<think>", "</think>"
CALLS_OPEN = "<minimax:tool_call>"
CALLS_CLOSE = "</minimax:tool_call>"
INVOKE = "<invoke name="
#: what follows the reasoning's close marker before the content
AFTER_THINK = "\n\n"

#: published ids: BOS and EOS are transformers' ``MiniMaxM2Config`` defaults (vocab 200064);
#: the role token's is the M2.7 generation config's ``bos_token_id`` (second-hand); the think
#: and call tokens' ids have no first-hand source and are left out
PUBLISHED_IDS: dict[str, int] = {ROLE: 200019, END: 200020, BOS: 200034}
VOCAB_SIZE = 200064
SPECIAL_TOKENS = (BOS, ROLE, END, OPEN, CLOSE, CALLS_OPEN, CALLS_CLOSE)
MODEL_TYPES = ("minimax_m2",)


def value_text(value: object) -> str:
    """A parameter value as the template writes it (strings as they are, else JSON)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class MiniMaxM2Family(Family):
    """MiniMax-M2's answer framing (module docstring)."""

    def call_text(self, call: ToolCall) -> str:
        """One ``<invoke>`` block."""
        args = arguments_json(call.arguments)
        params = "".join(
            f'<parameter name="{k}">{value_text(v)}</parameter>\n'
            for k, v in (args.items() if isinstance(args, dict) else ())
        )
        return f'{INVOKE}"{call.name}">\n{params}</invoke>\n'

    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        if not calls:
            return ""
        return f"\n{CALLS_OPEN}\n{''.join(self.call_text(c) for c in calls)}{CALLS_CLOSE}"

    def response_text(
        self,
        state: ThinkState,
        reasoning: str | None,
        content: str,
        tool_calls: Sequence[ToolCall] = (),
        finish_reason: str = "stop",
    ) -> str:
        """The base assembly over the template's whitespace (module docstring): the
        reasoning ``…\\n`` (the opener ``<think>\\n`` where the prompt has none), the content
        after ``\\n\\n``, stripped before calls."""
        cut = finish_reason == "length" and not content and not tool_calls
        block = reasoning is not None and state != "closed"
        if block:
            reasoning = self.reasoning_body(state, reasoning or "", cut)
        body = content.strip() if tool_calls else content
        if block and not cut:
            body = f"{AFTER_THINK}{body.lstrip(chr(10))}"
        return super().response_text(state, reasoning, body, tool_calls, finish_reason)

    def reasoning_body(self, state: ThinkState, reasoning: str, cut: bool) -> str:
        """The reasoning between the markers as the template writes it (a cut one ends where
        the model stopped)."""
        lead = "" if state == "open" else "\n"
        if cut:
            return f"{lead}{reasoning}"
        return f"{lead}{reasoning.rstrip(chr(10))}\n"

    def recognises(self, facts: TokenizerFacts) -> bool:
        """M2's tokens, no other model type, and a template (where there is one) that writes
        ``<minimax:tool_call>`` (module docstring)."""
        if not super().recognises(facts):
            return False
        if facts.model_type is not None and facts.model_type not in self.model_types:
            return False
        return not facts.chat_template or CALLS_OPEN in facts.chat_template


MINIMAX_M2 = MiniMaxM2Family(
    name="minimax_m2",
    title="MiniMax-M2 / M2.1 / M2.5 / M2.7",
    end_of_turn=END,
    special_tokens=SPECIAL_TOKENS,
    turn_open_tokens=(ROLE,),
    call_markers=(CALLS_OPEN, INVOKE),
    sglang=Parsers(tool="minimax-m2", reasoning="minimax"),
    vllm=Parsers(tool="minimax_m2", reasoning="minimax_m2"),
    aux_shift="always",
    published_ids=PUBLISHED_IDS,
    published_vocab=VOCAB_SIZE,
    model_types=MODEL_TYPES,
)
