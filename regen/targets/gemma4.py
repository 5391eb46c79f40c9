"""Gemma 4 (google/gemma-4-*-it: E2B, E4B, 26B-A4B, 31B; Google).

Owns no files. The format (the updated official gemma-4-31B-it chat template, vendored as
``regen/devkit/tokenizers/templates/gemma4.jinja``; SGLang 0.5.23
``function_call/gemma4_detector.py`` and ``parser/reasoning_parser.py``'s ``Gemma4Detector``;
vLLM 0.32 ``tool_parsers/gemma4_engine_tool_parser.py`` and
``reasoning/gemma4_engine_reasoning_parser.py``, both adapters of ``parser/gemma4.py``):

- a turn is ``<|turn>{role}\\n{body}<turn|>\\n`` (the model's role is ``model``); tools are
  declared in the system turn (``<|tool>declaration:…<tool|>``);
- thinking is switched by ``chat_template_kwargs.enable_thinking`` (default off). Off: the
  generation prompt ``<|turn>model\\n<|channel>thought\\n<channel|>`` closes the thought channel
  (state ``closed``); on: it ends ``<|turn>model\\n`` and the model opens the channel itself
  when it thinks (state ``none``). After tool results the template adds no generation prompt
  (the prompt ends ``<tool_response|>``, state ``none``); older templates that ended
  ``<|channel>thought\\n`` there leave it ``open``. The reasoning markers are the tokens
  ``<|channel>`` and ``<channel|>``; the model writes the label ``thought\\n`` after the opener
  (both engines drop it);
- an answer: ``<|channel>thought\\n{reasoning}\\n<channel|>`` when it thinks (the template writes
  the ``\\n`` before ``<channel|>``), the content, then per call
  ``<|tool_call>call:{name}{{{args}}}<tool_call|>`` with no separator;
- the arguments are Gemma's own syntax, not JSON: ``key:value`` pairs joined by ``,`` with
  unquoted keys; a string is ``<|"|>{text}<|"|>`` (no escaping), true/false and numbers are
  bare, an object is ``{k:v,…}``, a list ``[a,…]``; the template writes numbers as Jinja prints
  them (Python's ``str``: ``2``, ``2.5``);
- the answer ends with ``<turn|>``, or ``<|tool_response>`` after calls (the template writes
  that token after a call that has no result yet; the generation config stops on both and on
  ``<eos>``);
- SGLang's Gemma 4 loaders (``models/gemma4_causal.py``, ``gemma4_mm.py``) add 1 to every aux id.

What the rebuild cannot know and writes as the template or the parsers give it:

- key order: the template sorts keys (``dictsort``) when it renders history; both engines
  return the keys in the model's order (a dict in the order parsed), so the rebuild keeps the
  order it is given, which is the model's;
- bare values: SGLang types them by their text (``true``, ``2``, ``2.5``; any other bare word
  stays a string), vLLM returns every bare value as a string and types it by the tool's schema
  (a string the schema does not type comes back quoted: ``flag:true`` without a schema is
  rebuilt ``flag:<|"|>true<|"|>``); a number's spelling (``2.50``, ``1e3``) and whitespace
  inside the arguments are lost; JSON null (only vLLM's schema typing of a bare ``null``
  returns it) is written ``null``;
- the reasoning's last newline: vLLM strips the reasoning's trailing whitespace, SGLang keeps
  it; the rebuild writes one ``\\n`` before ``<channel|>`` when the reasoning does not end with
  one (a model that wrote none is rebuilt with one, by both engines);
- an empty thought channel (``<|channel>thought\\n<channel|>``): both servers report no
  reasoning, so it is rebuilt as no channel;
- content before a call: vLLM strips it, SGLang keeps it; text after the last call is dropped
  by both; a turn the model ended with ``<eos>`` is rebuilt with ``<turn|>``.

SGLang forces its reasoning parser open when ``enable_thinking`` is true: an answer with
thinking on that opens no thought channel comes back entirely as reasoning (its calls
unparsed), and its rebuild is wrong. vLLM reads such an answer as content.

The markers are special tokens. vLLM's parser asks the detokenizer to keep them; SGLang keeps
them for a ``gemma4`` / ``gemma4_unified`` model (``serving_chat.py`` ``is_gemma4``) or a request
with tools, so a text-only ``gemma4_text`` checkpoint would lose them: every request asks for
``skip_special_tokens: false`` (:meth:`Gemma4Family.request_fields`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from regen.core.errors import TemplateError
from regen.core.sample import ToolCall
from regen.targets.family import Family, Parsers, Thinking, ThinkState, arguments_json

TURN, TURN_END = "<|turn>", "<turn|>"
CHANNEL, CHANNEL_END = "<|channel>", "<channel|>"
CALL, CALL_END = "<|tool_call>", "<tool_call|>"
RESPONSE, RESPONSE_END = "<|tool_response>", "<tool_response|>"
TOOL, TOOL_END = "<|tool>", "<tool|>"
QUOTE = '<|"|>'
THINK_FLAG = "<|think|>"
EOS, BOS, PAD = "<eos>", "<bos>", "<pad>"
#: the label the model writes after the channel opener
THOUGHT = "thought\n"

#: Gemma 4 tokenizer ids (vocab 262144, transformers configuration_gemma4.py: pad 0, eos 1,
#: bos 2; the call tokens' 48/49 are in vLLM's tool_parsers/gemma4_utils.py; the others as
#: several independent third-party copies of the tokenizer give them)
PUBLISHED_IDS: dict[str, int] = {
    PAD: 0,
    EOS: 1,
    BOS: 2,
    TOOL: 46,
    TOOL_END: 47,
    CALL: 48,
    CALL_END: 49,
    RESPONSE: 50,
    RESPONSE_END: 51,
    QUOTE: 52,
    THINK_FLAG: 98,
    CHANNEL: 100,
    CHANNEL_END: 101,
    TURN: 105,
    TURN_END: 106,
}
VOCAB_SIZE = 262144
SPECIAL_TOKENS = (
    TURN, TURN_END, CHANNEL, CHANNEL_END, CALL, CALL_END, RESPONSE, RESPONSE_END, TOOL, TOOL_END,
    QUOTE, THINK_FLAG,
)  # fmt: skip


def value_text(value: object) -> str:
    """A value in Gemma's argument syntax (module docstring), keys in the order given."""
    if isinstance(value, str):
        return f"{QUOTE}{value}{QUOTE}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{value_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(value_text(v) for v in value) + "]"
    return str(value)


def arguments_text(arguments: str) -> str:
    """A call's JSON arguments in Gemma's syntax, without the braces (a string that is no JSON
    object is written as it is, as the template writes string arguments)."""
    args = arguments_json(arguments)
    if isinstance(args, dict):
        return value_text(args)[1:-1]
    return arguments if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


class Gemma4Family(Family):
    """Gemma 4's thought channel and calls (module docstring)."""

    def request_fields(self, thinking: Thinking) -> dict[str, object]:
        """``skip_special_tokens: false``: the thought-channel and call markers are special
        tokens (module docstring)."""
        self.effort(thinking)
        return {"skip_special_tokens": False}

    def think_state(self, prompt_text: str) -> ThinkState:
        """``closed`` after ``<|channel>thought\\n<channel|>`` (thinking off), ``open`` after an
        opened channel (``<|channel>`` with or without its label), else ``none``."""
        tail = prompt_text.rstrip()
        if tail.endswith(CHANNEL_END):
            return "closed"
        if tail.endswith((CHANNEL, CHANNEL + THOUGHT.rstrip())):
            return "open"
        return "none"

    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        return "".join(f"{CALL}call:{c.name}{{{arguments_text(c.arguments)}}}{CALL_END}"
                       for c in calls)  # fmt: skip

    def end_text(self, calls: Sequence[ToolCall]) -> str:
        """``<|tool_response>`` after calls, ``<turn|>`` after an answer."""
        return RESPONSE if calls else TURN_END

    def response_text(
        self,
        state: ThinkState,
        reasoning: str | None,
        content: str,
        tool_calls: Sequence[ToolCall] = (),
        finish_reason: str = "stop",
    ) -> str:
        """The thought channel (when there is reasoning), the content, the calls, the end token
        (none when truncated; a turn cut in its reasoning has no ``<channel|>``)."""
        truncated = finish_reason == "length"
        end = "" if truncated else self.end_text(tool_calls)
        answer = f"{content}{self.tool_calls_text(tool_calls)}{end}"
        if state == "closed":
            if reasoning:
                raise TemplateError(
                    "the prompt closed the thought channel (thinking off) but the server "
                    "returned reasoning; check enable_thinking"
                )
            return answer
        head = "" if state == "open" else f"{CHANNEL}{THOUGHT}"
        if state == "none" and not reasoning:
            return answer
        if truncated and not content and not tool_calls:
            return f"{head}{reasoning or ''}"
        return f"{head}{thought_body(reasoning or '')}{CHANNEL_END}{answer}"


def thought_body(reasoning: str) -> str:
    """The reasoning with the one ``\\n`` the template writes before ``<channel|>``."""
    return reasoning if not reasoning or reasoning.endswith("\n") else f"{reasoning}\n"


GEMMA4 = Gemma4Family(
    name="gemma4",
    title="Gemma 4",
    end_of_turn=TURN_END,
    special_tokens=SPECIAL_TOKENS,
    turn_open_tokens=(TURN,),
    call_markers=(CALL,),
    sglang=Parsers(tool="gemma4", reasoning="gemma4"),
    vllm=Parsers(tool="gemma4", reasoning="gemma4"),
    aux_shift="always",
    think=(CHANNEL, CHANNEL_END),
    thinking_kwarg="enable_thinking",
    other_ends=(RESPONSE, EOS),
    published_ids=PUBLISHED_IDS,
    published_vocab=VOCAB_SIZE,
    model_types=("gemma4", "gemma4_text", "gemma4_unified"),
)
