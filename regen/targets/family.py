"""A model family: everything one family of target models decides, in one record.

Owns no files. The rest of regen asks the family and never names a family's tokens:

- how a turn's response is assembled from what the server's parsers returned (reasoning,
  content, tool calls), after a generation prompt that left the reasoning open, closed it, or
  has none (:meth:`Family.response_text`);
- the end-of-turn token(s) (:attr:`Family.end_of_turn`, :meth:`Family.end_tokens`);
- its reasoning and tool-call markers (:attr:`Family.think`, :attr:`Family.call_markers`);
- the chat-template keyword that switches thinking, and the effort levels it takes where the
  family's thinking is an effort (:meth:`Family.template_kwargs`, :attr:`Family.efforts`);
- how its prompts are rendered where the engines encode them in Python rather than with a
  Jinja template (:meth:`Family.encode_prompt`);
- its special tokens (the run-vs-target check; the boundaries of prompt-id reuse) and the
  tokens that open a turn (a trained one means the loss mask covers the prompt);
- the SGLang and vLLM parser names (:attr:`Family.sglang`, :attr:`Family.vllm`);
- how SGLang's loader numbers the draft's aux layers (:attr:`Family.aux_shift`);
- its native-row format, where one exists (:attr:`Family.native_turn_tokens`).

The think-tag logic shared by every family that writes ``<think>…</think>`` (Kimi, Qwen3,
DeepSeek, GLM) is here; a family differs by its markers, its tool-call text and its end token.
A family whose answers are framed otherwise (GPT-OSS's harmony channels) overrides
:meth:`Family.response_text` and :meth:`Family.split_response`.

Reading the rendered prompt's tail decides the think state (never one template variant):

- ``open``: the prompt ends inside the reasoning (``…<think>``): the model writes the
  reasoning, the close marker, then the answer;
- ``closed``: the prompt closed it (thinking off: ``…<think></think>``): the answer only;
- ``none``: the model opens the reasoning itself, when it reasons at all.

A server without a reasoning parser returns ``reasoning=None`` and everything as content: after
an open prompt it is split at the first close marker; without one the marker is still inserted
and the turn flagged ``think_inserted``; content holding the open marker where the model could
not have written it is flagged ``content_has_think``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from regen.core import jsontext
from regen.core.errors import TemplateError
from regen.core.sample import ToolCall

ThinkState = Literal["open", "closed", "none"]
#: why a locally rendered response may hold tokens the model did not produce as rendered
RenderFlag = Literal["think_inserted", "content_has_think"]
#: how SGLang's model loader turns the draft's ``eagle_aux_hidden_state_layer_ids`` into the
#: layers it captures: +1 to each only when the first id is 1 (DeepSeek-V2 loader, Kimi-K2.5
#: delegates to it); +1 to each always (Llama, Qwen3, GLM loaders); +1 to each unless the
#: largest id equals the layer count, then none (SGLang 0.5.23 gpt_oss.py, GPT-OSS loader);
#: ``unsupported``: the loader captures no EAGLE-3 states at all (SGLang 0.5.23's DeepSeek-V4
#: and Kimi K3 models have no ``set_eagle3_layers_to_capture``: the server refuses to start)
AuxShift = Literal["first_is_one", "always", "unless_max_is_layers", "unsupported"]
#: thinking as a run asks for it (``sampling.thinking``): on or off, or one of the family's
#: effort levels (:attr:`Family.efforts`)
Thinking = bool | str
#: what an engine does with a history tool call's arguments that are not a JSON object
#: (regen.template.prepare): ``empty`` renders ``{}`` (vLLM), ``refuse`` refuses the request
#: (SGLang), ``keep`` renders the text as it came (SGLang's lenient encoders)
ArgumentsRule = Literal["empty", "refuse", "keep"]


@dataclass(frozen=True, slots=True)
class Parsers:
    """An engine's parser names for a family (the server's flags)."""

    tool: str | None  #: ``--tool-call-parser``
    reasoning: str | None  #: ``--reasoning-parser`` (None: the family does not reason)


@dataclass(frozen=True, slots=True)
class TokenizerFacts:
    """What recognising a family reads of a tokenizer directory, without loading it."""

    chat_template: str  #: the default template ('' when none)
    tokens: frozenset[str]  #: added / special tokens (their text)
    model_type: str | None  #: ``config.json``'s ``model_type`` where the folder has one
    #: ``tokenizer_config.json``'s ``response_template`` (None: none;
    #: regen.targets.response_template)
    response_template: Mapping[str, object] | None = field(default=None, hash=False, compare=False)


@dataclass(frozen=True, repr=False)
class Family:
    """One model family (see the module docstring). Instances live in :mod:`regen.targets`."""

    #: the name a manifest's ``target.family`` gives
    name: str
    #: who it is, for people ("Kimi K2 / K2.5 / K2.6")
    title: str
    #: the token that ends an answer (appended to server ids that lack an end token)
    end_of_turn: str
    #: special tokens of its chat format (checked against the training target's tokenizer)
    special_tokens: tuple[str, ...]
    #: tokens that open a turn: one trained (loss mask 1) means the mask covers prompt framing
    turn_open_tokens: tuple[str, ...]
    #: tokens that open a tool call in its output (a reply's content holding one: an unparsed
    #: call)
    call_markers: tuple[str, ...]
    #: the SGLang and vLLM parser names
    sglang: Parsers
    vllm: Parsers
    #: how SGLang's loader numbers the aux layers (see :data:`AuxShift`)
    aux_shift: AuxShift
    #: reasoning markers (None: the family does not reason in tags)
    think: tuple[str, str] | None = ("<think>", "</think>")
    #: the chat-template keyword that switches thinking (None: no switch)
    thinking_kwarg: str | None = None
    #: other tokens that end an answer besides :attr:`end_of_turn`
    other_ends: tuple[str, ...] = ()
    #: turn tokens every native (pre-tokenized) row must hold; None: no native rows
    native_turn_tokens: tuple[str, ...] | None = None
    #: the published tokenizer's ids of :attr:`special_tokens`, and its size (a run checked
    #: against a training target whose tokenizer is not at hand)
    published_ids: Mapping[str, int] = field(default_factory=dict)
    published_vocab: int | None = None
    #: ``config.json`` model types of the family (one hint among the tokens and template)
    model_types: tuple[str, ...] = ()
    #: its published tokenizer runs its own Python code (servers need --trust-remote-code)
    remote_code: bool = False
    #: what SGLang does with a history call's arguments that are not a JSON object: its Jinja
    #: path refuses the request; the encoders of some families keep the text
    #: (``serving_chat.py`` ``strict_tool_call_arguments``)
    sglang_arguments: ArgumentsRule = "refuse"
    #: the effort levels its thinking takes, the default (``thinking: true``) first; () where
    #: thinking is only on or off
    efforts: tuple[str, ...] = ()

    #: the ``--tokenizer-mode`` vLLM serves the family with (None: its default, the HF
    #: tokenizer and its Jinja template): the families it encodes in Python, and Mistral's
    #: ``hf`` (else mistral_common renders, without the template)
    vllm_tokenizer_mode: ClassVar[str | None] = None

    def __repr__(self) -> str:
        return f"Family({self.name!r})"

    # -- serving ------------------------------------------------------------------------------
    def effort(self, thinking: Thinking) -> str | None:
        """The effort level ``thinking`` asks for: the level it names, the default level for
        ``True``, None for ``False`` or a family without levels; ValueError naming the levels
        for a level the family does not take."""
        if isinstance(thinking, bool):
            return self.efforts[0] if thinking and self.efforts else None
        if thinking not in self.efforts:
            known = ", ".join(self.efforts) or "none: thinking is on or off"
            raise ValueError(f"{thinking!r} is not a thinking effort of {self.title} ({known})")
        return thinking

    def template_kwargs(self, thinking: Thinking) -> dict[str, object]:
        """``chat_template_kwargs`` that switch thinking on or off ({} without a switch); an
        effort level (:meth:`effort`) switches it on."""
        self.effort(thinking)  # a level the family does not take is refused here
        return {} if self.thinking_kwarg is None else {self.thinking_kwarg: bool(thinking)}

    def request_fields(self, thinking: Thinking) -> dict[str, object]:
        """Top-level request fields the family needs besides ``chat_template_kwargs`` ({}:
        none): the thinking switch where an engine reads it only there, and
        ``skip_special_tokens: false`` where its markers are special tokens a parser needs."""
        return {}

    # -- the prompt ---------------------------------------------------------------------------
    @property
    def encodes_prompts(self) -> bool:
        """Whether the engines render this family's prompts with a Python encoder of their own
        instead of a Jinja template (then :meth:`encode_prompt` is regen's)."""
        return False

    def encode_prompt(
        self,
        messages: list[dict[str, object]],
        tools: list[dict[str, object]] | None,
        kwargs: Mapping[str, object],
        engine: str,
    ) -> str:
        """The generation prompt as the engine called ``engine`` encodes it, from the messages
        and tools as it prepared them (regen.template.prepare) and the template kwargs."""
        raise TemplateError(f"the {self.title} family renders its prompts with a chat template")

    def sglang_flags(self) -> list[str]:
        """SGLang's server flags for the family's parsers."""
        return _parser_flags(self.sglang, auto_tool_choice=False)

    def vllm_flags(self) -> list[str]:
        """vLLM's server flags for the family's parsers (tool calls need auto tool choice), and
        its tokenizer mode where it has one (:attr:`vllm_tokenizer_mode`)."""
        mode = self.vllm_tokenizer_mode
        tokenizer = [] if mode is None else ["--tokenizer-mode", mode]
        return [*_parser_flags(self.vllm, auto_tool_choice=True), *tokenizer]

    def served_variant(self, engine: str | None) -> Family | None:
        """The family as the engine called ``engine`` makes the model write it by default, where
        that differs from the model's own format (None: it does not). vLLM 0.32 constrains
        tool calls with a grammar of its parser's format (``VLLM_ENFORCE_STRICT_TOOL_CALLING``,
        on by default), which is not always the model's own (GLM-4.5: GLM-4.7's calls). A
        server row's cross-check accepts either form: the server's setting is not visible."""
        return None

    def end_tokens(self) -> tuple[str, ...]:
        """Every token that ends an answer."""
        return (self.end_of_turn, *self.other_ends)

    def boundary_tokens(self) -> tuple[str, ...]:
        """Special tokens a prompt may be cut after (regen.template.extend keeps those that
        split the tokenizer's input)."""
        think = self.think or ()
        return tuple(dict.fromkeys((*self.end_tokens(), *self.special_tokens, *think)))

    # -- recognition --------------------------------------------------------------------------
    def recognises(self, facts: TokenizerFacts) -> bool:
        """Whether a tokenizer is of this family: its own tokens are all there (a family that
        shares its tokens with another also reads the template or ``model_type``)."""
        return set(self.special_tokens) <= facts.tokens

    # -- the response -------------------------------------------------------------------------
    def think_state(self, prompt_text: str) -> ThinkState:
        """Whether the rendered generation prompt left the reasoning open, closed it, or has
        none."""
        if self.think is None:
            return "none"
        tail = prompt_text.rstrip()
        if tail.endswith(self.think[0]):
            return "open"
        if tail.endswith(self.think[1]):
            return "closed"
        return "none"

    def split_response(
        self, state: ThinkState, reasoning: str | None, content: str
    ) -> tuple[str | None, str, RenderFlag | None]:
        """Reasoning, content and a flag for a response after a prompt in ``state`` (module
        docstring: a parser-less server's content is split at the close marker)."""
        if self.think is None:
            return reasoning, content, None
        opener, closer = self.think
        flag: RenderFlag | None = None
        if state == "open" and reasoning is None:
            if closer in content:
                reasoning, _, content = content.partition(closer)
            else:
                flag = "think_inserted"
        if opener in content and (state != "none" or reasoning is not None):
            flag = "content_has_think"
        return reasoning, content, flag

    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        """The text of a turn's tool calls as the model writes them ('' when none)."""
        if calls:
            raise TemplateError(f"the {self.title} family has no tool-call format")
        return ""

    def end_text(self, calls: Sequence[ToolCall]) -> str:
        """The end-of-turn text of an answer (with or without tool calls)."""
        return self.end_of_turn

    def answer_text(self, content: str, calls: Sequence[ToolCall], end: str) -> str:
        """What follows the reasoning: the content, the calls, the end."""
        return f"{content}{self.tool_calls_text(calls, content)}{end}"

    def response_text(
        self,
        state: ThinkState,
        reasoning: str | None,
        content: str,
        tool_calls: Sequence[ToolCall] = (),
        finish_reason: str = "stop",
    ) -> str:
        """The text the model produced after a prompt in ``state``. A truncated turn
        (``length``) gets no end token, and one cut inside its reasoning no close marker."""
        truncated = finish_reason == "length"
        end = "" if truncated else self.end_text(tool_calls)
        cut_in_reasoning = truncated and not content and not tool_calls
        if self.think is None:
            if reasoning:
                raise TemplateError(f"the {self.title} family does not reason in tags, but the "
                                    "server returned reasoning")  # fmt: skip
            return self.answer_text(content, tool_calls, end)
        opener, closer = self.think
        if state == "open":
            if cut_in_reasoning:
                return reasoning or ""
            return f"{reasoning or ''}{closer}{self.answer_text(content, tool_calls, end)}"
        if state == "closed":
            if reasoning:
                raise TemplateError(
                    f"the prompt closed {opener} (thinking off) but the server returned "
                    "reasoning; check chat_template_kwargs against the server's reasoning parser"
                )
            return self.answer_text(content, tool_calls, end)
        if reasoning is None:
            return self.answer_text(content, tool_calls, end)
        if cut_in_reasoning:
            return f"{opener}{reasoning}"
        return f"{opener}{reasoning}{closer}{self.answer_text(content, tool_calls, end)}"

    def cut_close(self) -> str | None:
        """The close marker a turn cut in its reasoning may have produced last (None: none)."""
        return None if self.think is None else self.think[1]


def _parser_flags(parsers: Parsers, *, auto_tool_choice: bool) -> list[str]:
    flags: list[str] = []
    if parsers.tool is not None:
        flags += ["--enable-auto-tool-choice"] if auto_tool_choice else []
        flags += ["--tool-call-parser", parsers.tool]
    if parsers.reasoning is not None:
        flags += ["--reasoning-parser", parsers.reasoning]
    return flags


def arguments_json(arguments: str) -> object:
    """A call's arguments as JSON data (the string itself when it is not JSON)."""
    try:
        return jsontext.loads(arguments)
    except ValueError:
        return arguments
