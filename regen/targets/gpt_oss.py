"""GPT-OSS (openai/gpt-oss-20b, gpt-oss-120b; OpenAI): the harmony format.

Owns no files. The format (the gpt-oss-120b chat template; openai_harmony's o200k_harmony
encoding; SGLang 0.5.23 ``function_call/gpt_oss_detector.py``, ``parser/harmony_parser.py`` and
``parser/reasoning_parser.py``'s ``GptOssDetector``; vLLM 0.32 ``parser/harmony.py``, the
``openai`` tool and ``openai_gptoss`` reasoning parsers being stubs it holds):

- a message is ``<|start|>{role}<|message|>{body}<|end|>``; an assistant message names its
  channel: ``<|start|>assistant<|channel|>{channel}<|message|>{body}``;
- the generation prompt is ``<|start|>assistant``; the model then writes one or more messages,
  each after the first opened by ``<|start|>assistant`` again:
  ``<|channel|>analysis<|message|>{reasoning}<|end|>`` (the reasoning, when it reasons),
  then ``<|channel|>final<|message|>{content}<|return|>`` (the answer), or for a call
  ``<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{arguments}<|call|>``
  (the model's order: recipient after the channel, one space before ``<|constrain|>``; the
  template writes earlier turns' calls as ``<|start|>assistant to=functions.{name}<|channel|>
  commentary json<|message|>``, which vLLM also reads and SGLang does not); text before a call
  is a commentary message without a recipient (``<|channel|>commentary<|message|>…<|end|>``),
  which both engines return as content;
- ``<|return|>`` and ``<|call|>`` stop generation (harmony's stop tokens for assistant actions,
  ids 200002 and 200012), so a turn holds at most one call; the template, too, writes one call
  per assistant message. Several calls are written as consecutive call messages, which both
  engines' parsers read, but a server never produces them;
- reasoning cannot be switched off: ``reasoning_effort`` (low, medium, high; the template's
  default medium) sets how much. Thinking on asks for ``medium``, thinking off for ``low``
  (SGLang and the local render read ``chat_template_kwargs.reasoning_effort``; vLLM renders
  harmony itself from the request's top-level ``reasoning_effort`` and ignores the kwarg);
- SGLang's GPT-OSS loader adds 1 to every aux id unless the largest equals the layer count.

The engines return the call arguments re-dumped by ``json.dumps`` (``", "`` and ``": "``
separators), so arguments written compact by the model are rebuilt with spaces. SGLang keeps
``<|call|>`` in the text (its detokenizer does not trim it for the ``gpt-oss`` tool parser) and
trims ``<|return|>``; its call detector needs ``<|start|>assistant<|channel|>commentary``, so a
call the model writes as its first message (no reasoning before it) is returned as content.
"""

from __future__ import annotations

from collections.abc import Sequence

from regen.core.sample import ToolCall
from regen.targets.family import Family, Parsers, RenderFlag, Thinking, ThinkState

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
END = "<|end|>"
RETURN = "<|return|>"
CALL = "<|call|>"
CONSTRAIN = "<|constrain|>"
#: what opens each assistant message after the first (the prompt wrote the first one's)
ASSISTANT = f"{START}assistant"
ANALYSIS = f"{CHANNEL}analysis{MESSAGE}"
FINAL = f"{CHANNEL}final{MESSAGE}"
#: a commentary message without a recipient: text the model writes before a call
PREAMBLE = f"{CHANNEL}commentary{MESSAGE}"
#: what a call's header holds, in either order of channel and recipient
CALL_MARK = " to=functions."

#: o200k_harmony ids (openai_harmony's HARMONY_GPT_OSS encoding); vocab 201088 (config.json)
PUBLISHED_IDS: dict[str, int] = {
    "<|startoftext|>": 199998,
    "<|endoftext|>": 199999,
    RETURN: 200002,
    CONSTRAIN: 200003,
    CHANNEL: 200005,
    START: 200006,
    END: 200007,
    MESSAGE: 200008,
    CALL: 200012,
}
VOCAB_SIZE = 201088
SPECIAL_TOKENS = (START, CHANNEL, MESSAGE, END, RETURN, CALL, CONSTRAIN)
#: the reasoning effort asked for with thinking on and off
EFFORT_ON, EFFORT_OFF = "medium", "low"


def call_header(name: str) -> str:
    """The channel header of a call to the function ``name``."""
    return f"{CHANNEL}commentary to=functions.{name} {CONSTRAIN}json{MESSAGE}"


class HarmonyFamily(Family):
    """The harmony channels (module docstring)."""

    def template_kwargs(self, thinking: Thinking) -> dict[str, object]:
        """``reasoning_effort``: the level asked for; medium with thinking on, low with it off
        (harmony cannot switch reasoning off)."""
        return {"reasoning_effort": self.effort(thinking) or EFFORT_OFF}

    def request_fields(self, thinking: Thinking) -> dict[str, object]:
        """The same effort as a top-level field: vLLM renders harmony itself from it and
        ignores the template kwarg (module docstring)."""
        return self.template_kwargs(thinking)

    def think_state(self, prompt_text: str) -> ThinkState:
        """``open`` when the prompt opened the analysis message, else ``none`` (the model
        opens it itself); a prompt never closes the reasoning."""
        return "open" if prompt_text.rstrip().endswith(ANALYSIS) else "none"

    def split_response(
        self, state: ThinkState, reasoning: str | None, content: str
    ) -> tuple[str | None, str, RenderFlag | None]:
        """As returned; content holding a channel marker (harmony framing no parser took
        apart) is flagged ``content_has_think``."""
        return reasoning, content, "content_has_think" if CHANNEL in content else None

    def end_text(self, calls: Sequence[ToolCall]) -> str:
        """``<|call|>`` after a call, ``<|return|>`` after the answer."""
        return CALL if calls else RETURN

    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        """The calls as messages that follow an earlier one, each ended by ``<|call|>``."""
        return "".join(f"{ASSISTANT}{call_header(c.name)}{c.arguments}{CALL}" for c in calls)

    def cut_close(self) -> str | None:
        """``<|end|>``: what ends the analysis message."""
        return END

    def response_text(
        self,
        state: ThinkState,
        reasoning: str | None,
        content: str,
        tool_calls: Sequence[ToolCall] = (),
        finish_reason: str = "stop",
    ) -> str:
        """The messages the model wrote after ``<|start|>assistant``: the analysis (when it
        reasoned), then the answer or a preamble and the calls. A truncated turn's last message
        has no end token; one cut in its reasoning has no answer."""
        parts = self.messages(state, reasoning, content, tool_calls)
        truncated = finish_reason == "length"
        if truncated and not content and not tool_calls:
            parts = parts[:1] if parts and parts[0][0] != FINAL else []
        texts = [f"{head}{body}{end}" for head, body, end in parts]
        if truncated and parts:
            head, body, _ = parts[-1]
            texts[-1] = f"{head}{body}"
        return ASSISTANT.join(texts)

    def messages(
        self, state: ThinkState, reasoning: str | None, content: str, calls: Sequence[ToolCall]
    ) -> list[tuple[str, str, str]]:
        """(header, body, end token) of each message; the first header is '' after a prompt
        that opened the analysis."""
        parts: list[tuple[str, str, str]] = []
        if state == "open" or reasoning:
            parts.append(("" if state == "open" else ANALYSIS, reasoning or "", END))
        if calls:
            if content:
                parts.append((PREAMBLE, content, END))
            parts += [(call_header(c.name), c.arguments, CALL) for c in calls]
        else:
            parts.append((FINAL, content, RETURN))
        return parts


GPT_OSS = HarmonyFamily(
    name="gpt_oss",
    title="GPT-OSS (harmony)",
    end_of_turn=RETURN,
    special_tokens=SPECIAL_TOKENS,
    # every harmony framing token also occurs inside a produced answer (``<|start|>assistant``
    # opens each message after the analysis), so none tells a trained prompt apart
    turn_open_tokens=(),
    call_markers=(CALL_MARK,),
    sglang=Parsers(tool="gpt-oss", reasoning="gpt-oss"),
    vllm=Parsers(tool="openai", reasoning="openai_gptoss"),
    aux_shift="unless_max_is_layers",
    # SGLang's GptOssDetector's own markers: what opens and closes the analysis message
    think=(ANALYSIS, END),
    thinking_kwarg="reasoning_effort",
    efforts=(EFFORT_ON, "low", "high"),
    other_ends=(CALL,),
    published_ids=PUBLISHED_IDS,
    published_vocab=VOCAB_SIZE,
    model_types=("gpt_oss",),
)
