"""KimiRenderer: one regenerated assistant turn as Kimi-format text, token ids and loss mask.

Owns no files. The prompt half is rendered by the target tokenizer's OWN chat template
(``apply_chat_template(messages, tools=..., add_generation_prompt=True, **template_kwargs)``),
so history turns look exactly as the server showed them (including the "trap" of CONTRACTS §1:
reasoning of history turns is dropped by the template, as at serving time).

The response half is reassembled from what the server returned, reading how the rendered
prompt ends (never assuming one template variant):

- prompt ends with ``<think>`` ("open", K2.5 thinking):
  ``{reasoning}</think>{content}{calls}<|im_end|>``
- prompt ends with ``</think>`` ("closed", K2.5 ``thinking=False``):
  ``{content}{calls}<|im_end|>``
- otherwise ("none", e.g. K2-Thinking, the model writes ``<think>`` itself):
  ``<think>{reasoning}</think>{content}{calls}<|im_end|>``, the think block only when the server
  returned reasoning (``reasoning is not None``).

A server without a reasoning parser (e.g. ``transformers serve``) returns ``reasoning=None`` and
the whole output as ``content``. After an "open" prompt the content then holds the reasoning, the
``</think>`` the model wrote, and the answer: it is split at the first ``</think>`` (reasoning
before, content after) so no second ``</think>`` is inserted. When such content has no
``</think>`` the delimiter is still inserted (the model's own output cannot be told apart) and
the turn is flagged ``think_inserted``. Content that itself holds ``<think>`` where the model
could not have written it (after an open or closed prompt, or next to returned reasoning) is
flagged ``content_has_think``. Flags travel in :attr:`RenderedTurn.flag`; ``regen.rows`` puts
them in the row's ``token_check`` so they are counted at export, never hidden.

``{calls}`` is Kimi's tool-call section: ``<|tool_calls_section_begin|>`` + per call
``<|tool_call_begin|>{id}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>`` +
``<|tool_calls_section_end|>`` (id defaults to ``functions.{name}:{index}``; arguments verbatim).
A truncated turn (``finish_reason == "length"``) gets no ``<|im_end|>``, and when it stopped
inside the reasoning (no content, no calls) no ``</think>`` either: only what the model produced
(unless the server's completion token count shows the cut came right after ``</think>``).

Prompt and response are tokenized separately (``add_special_tokens=False``) and concatenated, so
no token spans the boundary; the loss mask is 1 on the response tokens only.

Cost: :meth:`KimiRenderer.render_text` renders the texts only (the template and the response
assembly, no tokenizer); :meth:`KimiRenderer.tokenize` encodes many turns in one batch
(:mod:`regen.template.codec`: the Rust tokenizer when it is provably the same), and a prompt
that follows an earlier prompt of the same conversation reuses that prompt's ids where their
texts agree (:mod:`regen.template.extend`; the template is not trusted to be prefix-stable:
both are rendered and compared). :meth:`KimiRenderer.render_turn` is the one-turn form of both.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from regen.errors import TemplateError
from regen.sample import Message, ToolCall, stable_hash
from regen.template.codec import TokenCodec
from regen.template.extend import Boundaries, PromptIds

log = logging.getLogger(__name__)

ThinkState = Literal["open", "closed", "none"]
#: why a locally rendered response may hold tokens the model did not produce as rendered
RenderFlag = Literal["think_inserted", "content_has_think"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
IM_END = "<|im_end|>"
CALLS_BEGIN = "<|tool_calls_section_begin|>"
CALLS_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
CALL_ARGS = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"


@dataclass(slots=True)
class RenderedTurn:
    """One turn rendered locally: text halves, their token ids, and the prompt's think state."""

    prompt_text: str
    response_text: str
    prompt_ids: list[int]
    response_ids: list[int]
    think_state: ThinkState
    #: reasoning and content as rendered (after splitting a parser-less server's output)
    reasoning: str | None = None
    content: str = ""
    #: set when the response text holds a guess (see the module docstring)
    flag: RenderFlag | None = None

    @property
    def text(self) -> str:
        return self.prompt_text + self.response_text

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def loss_mask(self) -> list[int]:
        return [0] * len(self.prompt_ids) + [1] * len(self.response_ids)


@dataclass(slots=True)
class TurnText:
    """One turn rendered as text only (:meth:`KimiRenderer.render_text`); ``tokenize`` makes it
    a :class:`RenderedTurn`."""

    prompt_text: str
    response_text: str
    think_state: ThinkState
    reasoning: str | None
    content: str
    flag: RenderFlag | None
    #: cut (``length``) inside the reasoning: ``</think>`` belongs to the response when the
    #: server's ``completion_tokens`` counts one token more than the response (see render_turn)
    cut_in_reasoning: bool = False
    completion_tokens: int | None = None

    @property
    def text(self) -> str:
        return self.prompt_text + self.response_text

    def settle(self, response_len: int) -> bool:
        """Append ``</think>`` when the turn was cut in its reasoning and the server counted one
        token more than the ``response_len`` ids of the response: True when it did."""
        if self.cut_in_reasoning and self.completion_tokens == response_len + 1:
            self.response_text += THINK_CLOSE
            self.cut_in_reasoning = False
            return True
        return False


#: special tokens of the chat format after which prompt ids may be reused (regen.template.extend)
BOUNDARY_TOKENS = (
    IM_END, "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", THINK_OPEN,
    THINK_CLOSE, CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_ARGS, CALL_END,
)  # fmt: skip


def tool_calls_section(calls: Sequence[ToolCall]) -> str:
    """Kimi's tool-call section for ``calls`` ('' when there are none)."""
    if not calls:
        return ""
    parts = [CALLS_BEGIN]
    for i, c in enumerate(calls):
        call_id = c.id or f"functions.{c.name}:{i}"
        parts.append(f"{CALL_BEGIN}{call_id}{CALL_ARGS}{c.arguments}{CALL_END}")
    parts.append(CALLS_END)
    return "".join(parts)


def think_state(prompt_text: str) -> ThinkState:
    """Whether the rendered generation prompt left ``<think>`` open, closed it, or has none."""
    tail = prompt_text.rstrip()
    if tail.endswith(THINK_OPEN):
        return "open"
    if tail.endswith(THINK_CLOSE):
        return "closed"
    return "none"


def split_response(
    state: ThinkState, reasoning: str | None, content: str
) -> tuple[str | None, str, RenderFlag | None]:
    """Reasoning, content and a flag for a response after a prompt in ``state``.

    After an "open" prompt, ``reasoning=None`` means the server had no reasoning parser: its
    content is split at the first ``</think>``; without one the turn is flagged
    ``think_inserted`` (``response_text`` will insert the delimiter). ``<think>`` inside content
    that the model could not have written as such is flagged ``content_has_think``.
    """
    flag: RenderFlag | None = None
    if state == "open" and reasoning is None:
        if THINK_CLOSE in content:
            reasoning, _, content = content.partition(THINK_CLOSE)
        else:
            flag = "think_inserted"
    if THINK_OPEN in content and (state != "none" or reasoning is not None):
        flag = "content_has_think"
    return reasoning, content, flag


def response_text(
    state: ThinkState,
    reasoning: str | None,
    content: str,
    tool_calls: Sequence[ToolCall] = (),
    finish_reason: str = "stop",
) -> str:
    """The text the model produced after a prompt in ``state`` (see the module docstring)."""
    calls = tool_calls_section(tool_calls)
    truncated = finish_reason == "length"
    end = "" if truncated else IM_END
    cut_in_reasoning = truncated and not content and not calls
    if state == "open":
        if cut_in_reasoning:
            return reasoning or ""
        return f"{reasoning or ''}{THINK_CLOSE}{content}{calls}{end}"
    if state == "closed":
        if reasoning:
            raise TemplateError(
                "the prompt closed <think> (thinking off) but the server returned reasoning; "
                "check chat_template_kwargs against the server's reasoning parser"
            )
        return f"{content}{calls}{end}"
    if reasoning is None:
        return f"{content}{calls}{end}"
    if cut_in_reasoning:
        return f"{THINK_OPEN}{reasoning}"
    return f"{THINK_OPEN}{reasoning}{THINK_CLOSE}{content}{calls}{end}"


class KimiRenderer:
    """Renders and tokenizes turns with a target tokenizer and its own chat template."""

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs: dict[str, Any] = dict(template_kwargs or {})
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise TemplateError("the tokenizer has no chat template")
        if isinstance(template, dict):  # named templates: the default one renders
            template = template.get("default") or next(iter(template.values()))
        ids = [tokenizer.convert_tokens_to_ids(t) for t in (IM_END, THINK_OPEN, THINK_CLOSE)]
        if ids[0] is None or ids[0] == getattr(tokenizer, "unk_token_id", None):
            raise TemplateError(f"the tokenizer has no {IM_END} token: not a Kimi tokenizer")
        #: id of ``<|im_end|>``
        self.im_end_id: int = int(ids[0])
        #: id of ``</think>`` (None: the tokenizer has no such token)
        self.think_close_id: int | None = (
            None if ids[2] is None or ids[2] == getattr(tokenizer, "unk_token_id", None) else ids[2]
        )
        #: ids that end a turn (``<|im_end|>`` and the tokenizer's eos)
        self.end_ids: frozenset[int] = frozenset(
            i for i in (self.im_end_id, getattr(tokenizer, "eos_token_id", None)) if i is not None
        )
        #: number of ids (``len(tokenizer)``, added tokens included)
        self.vocab_size: int = len(tokenizer)
        #: hash of the chat template, template kwargs and vocab size (goes into rows/fingerprints)
        self.template_hash: str = stable_hash(
            {"template": template, "kwargs": self.template_kwargs, "vocab": self.vocab_size}
        )
        #: batched encode/decode (the Rust tokenizer when it gives the same ids)
        self.codec = TokenCodec(tokenizer)
        self._prompts: PromptIds | None = None

    @property
    def prompts(self) -> PromptIds:
        """Prompt-id reuse across a conversation's turns (built on first use: it probes the
        tokenizer); its ``stats`` count how often each case applied."""
        if self._prompts is None:
            self._prompts = PromptIds(self.codec, Boundaries(self.codec, BOUNDARY_TOKENS))
        return self._prompts

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_dir(
        cls,
        path: str | os.PathLike[str],
        trust_remote_code: bool = False,
        template_kwargs: dict[str, Any] | None = None,
    ) -> KimiRenderer:
        """Load a local tokenizer directory (transformers); remote code only when allowed."""
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as e:
            hint = "" if trust_remote_code else " (does it need target.trust_remote_code: true?)"
            raise TemplateError(f"cannot load tokenizer from {str(path)!r}: {e}{hint}") from e
        return cls(tok, template_kwargs)

    @classmethod
    def from_manifest(cls, manifest: Any) -> KimiRenderer:
        """The renderer a manifest asks for: its target tokenizer and template kwargs."""
        return cls.from_dir(
            manifest.resolve(manifest.target.tokenizer),
            trust_remote_code=manifest.target.trust_remote_code,
            template_kwargs=manifest.sampling.template_kwargs(),
        )

    # -- text and ids -------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; nothing added around it."""
        return self.codec.encode_many([text])[0]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept."""
        return self.codec.decode_many([ids])[0]

    def render_prompt(
        self,
        messages: Sequence[Message | dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The generation prompt for the next assistant turn, as the template renders it."""
        msgs = [m.to_openai() if isinstance(m, Message) else m for m in messages]
        try:
            text = self.tokenizer.apply_chat_template(
                msgs,
                tools=tools or None,
                add_generation_prompt=True,
                tokenize=False,
                **self.template_kwargs,
            )
        except Exception as e:  # jinja errors, raise_exception() in templates, bad shapes
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
        if not isinstance(text, str):
            raise TemplateError(f"chat template returned {type(text).__name__}, not text")
        return text

    def render_text(
        self,
        messages: Sequence[Message | dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        reasoning: str | None,
        content: str,
        tool_calls: Sequence[ToolCall] = (),
        finish_reason: str = "stop",
        completion_tokens: int | None = None,
    ) -> TurnText:
        """Prompt (template) + reassembled response, as text (see :meth:`render_turn`)."""
        prompt = self.render_prompt(messages, tools)
        state = think_state(prompt)
        reasoning, content, flag = split_response(state, reasoning, content)
        if flag is not None:
            log.debug("rendered turn flagged %s (after a %r prompt)", flag, state)
        response = response_text(state, reasoning, content, tool_calls, finish_reason)
        cut = (
            finish_reason == "length"
            and reasoning is not None
            and not content
            and not tool_calls
            and state != "closed"
        )
        return TurnText(prompt, response, state, reasoning, content, flag, cut, completion_tokens)

    def settle_text(self, turn: TurnText) -> TurnText:
        """``turn`` with the ``</think>`` a cut in the reasoning may have produced appended, as
        :meth:`tokenize` does, for callers that need the text only (encodes such a response)."""
        if turn.cut_in_reasoning:
            turn.settle(len(self.encode(turn.response_text)))
        return turn

    def tokenize(
        self, turns: Sequence[TurnText], before: Sequence[int | None] | None = None
    ) -> list[RenderedTurn]:
        """Token ids of many turns in one batch. ``before[i]``: the index in ``turns`` of the
        previous turn of the same conversation (its prompt ids may be reused, see
        :mod:`regen.template.extend`), or None."""
        if not turns:
            return []
        prompts = self.prompts
        plans = [
            prompts.plan(t.prompt_text, None if b is None else turns[b].prompt_text)
            for t, b in zip(turns, before or [None] * len(turns), strict=True)
        ]
        checks = [i for i, p in enumerate(plans) if p.keep is not None and prompts.checking(p.kind)]
        ids = self.codec.encode_many(
            [p.piece for p in plans]
            + [t.response_text for t in turns]
            + [turns[i].prompt_text for i in checks]
        )
        n = len(turns)
        whole = dict(zip(checks, ids[2 * n :], strict=True))
        prompt_ids: list[list[int]] = []
        for i, plan in enumerate(plans):
            b = before[i] if before else None
            got = prompts.assemble(plan, None if b is None else prompt_ids[b], ids[i])
            if got is None:  # the earlier ids lack the boundary the plan counted on
                got = self.codec.encode_many([turns[i].prompt_text])[0]
            elif i in whole:
                prompts.checked(plan.kind, got == whole[i])
                got = whole[i]
            prompts.stats[plan.kind] += 1
            prompt_ids.append(got)
        if not prompts.enabled and any(p.keep is not None for p in plans):
            # a reuse differed from a whole encode: nothing of this batch is reused
            prompt_ids = self.codec.encode_many([t.prompt_text for t in turns])
        response_ids = ids[n : 2 * n]
        cut = [i for i, t in enumerate(turns) if t.settle(len(response_ids[i]))]
        for i, got in zip(cut, self.codec.encode_many([turns[i].response_text for i in cut]),
                          strict=True):  # fmt: skip
            response_ids[i] = got
        return [
            RenderedTurn(
                prompt_text=t.prompt_text,
                response_text=t.response_text,
                prompt_ids=prompt_ids[i],
                response_ids=response_ids[i],
                think_state=t.think_state,
                reasoning=t.reasoning,
                content=t.content,
                flag=t.flag,
            )
            for i, t in enumerate(turns)
        ]

    def render_turn(
        self,
        messages: Sequence[Message | dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        **response: Any,
    ) -> RenderedTurn:
        """Prompt (template) + reassembled response, tokenized separately; ``response``: the
        keyword arguments of :meth:`render_text` (reasoning, content, tool_calls,
        finish_reason, completion_tokens).

        A turn cut (``length``) with reasoning but no content is ambiguous: the model may or
        may not have emitted ``</think>`` as its last token. When ``completion_tokens`` (the
        server's count) is given and says so, ``</think>`` is kept.
        """
        return self.tokenize([self.render_text(messages, tools, **response)])[0]


def messages_json(messages: Sequence[Message | dict[str, Any]]) -> str:
    """The request messages as a JSON array of OpenAI message dicts."""
    msgs = [m.to_openai() if isinstance(m, Message) else m for m in messages]
    return json.dumps(msgs, ensure_ascii=False)
