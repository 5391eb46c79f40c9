"""Renderer: one regenerated assistant turn as the target's text, token ids and loss mask.

Owns no files. The prompt half is rendered by the target tokenizer's OWN chat template
(``apply_chat_template(messages, tools=..., add_generation_prompt=True, **template_kwargs)``),
or by the template the server was started with (``target.chat_template``: ``--chat-template``),
or, for a family whose engines encode its prompts in Python (no Jinja template), by the
family's own encoder (:meth:`regen.targets.family.Family.encode_prompt`). The messages and tools
reach it as the engine that answered hands them over (:mod:`regen.template.prepare`: a history
call's arguments as the JSON object they hold, ...), so history turns look exactly as the server
showed them (for Kimi including the "trap" of CONTRACTS §1: reasoning of history turns is dropped
by the template, as at serving time).

The response half is reassembled from what the server returned by the target's model family
(:class:`regen.targets.family.Family`: its think markers, tool-call text and end token), after
reading how the rendered prompt ends (reasoning left open, closed, or none; never one template
variant). A target of no known family renders prompts but cannot assemble a response: asking
for it raises a TemplateError that says so (server ids make such a target work).

Flags (``think_inserted``, ``content_has_think``: the family module explains them) travel in
:attr:`RenderedTurn.flag`; ``regen.engine.rows`` puts them in the row's ``token_check`` so they are
counted at export, never hidden. A turn the model did not finish (``finish_reason`` ``length``,
or regen's ``loop`` cut: :func:`response_finish`) gets no end token, and when it stopped inside
the reasoning no close marker either: only what the model produced (unless the server's
completion token count shows the cut came right after it).

Prompt and response are tokenized separately (``add_special_tokens=False``) and concatenated, so
no token spans the boundary; the loss mask is 1 on the response tokens only. Special-token text
inside a reply (raw markup a parser left in content) is encoded as the tokenizer encodes it at
serving time: as the special token.

Cost: :meth:`Renderer.render_text` renders the texts only (the template and the response
assembly, no tokenizer); :meth:`Renderer.tokenize` encodes many turns in one batch
(:mod:`regen.template.codec`: the Rust tokenizer when it is provably the same), and a prompt
that follows an earlier prompt of the same conversation reuses that prompt's ids where their
texts agree (:mod:`regen.template.extend`; the template is not trusted to be prefix-stable:
both are rendered and compared). :meth:`Renderer.render_turn` is the one-turn form of both.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regen.core.errors import TemplateError
from regen.core.result import UNFINISHED, TurnResult
from regen.core.sample import Message, ToolCall, stable_hash
from regen.targets import Family, recognise_dir
from regen.targets.family import RenderFlag, ThinkState
from regen.template.codec import TokenCodec
from regen.template.extend import Boundaries, PromptIds
from regen.template.prepare import (
    SGLANG,
    ContentFormat,
    RenderArguments,
    loops_over_content,
    preparation,
)
from regen.template.tokenizer import load_tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RenderSetup:
    """What a run's renderers follow besides its manifest, as the driver found it: the
    tokenizer's class as resolved before (:func:`regen.template.tokenizer.class_spec`; None:
    AutoTokenizer resolves it) and how the run renders history tool-call arguments (run.json's
    ``render``: ``strings`` for a run started before they rendered as objects)."""

    tokenizer_class: str | None = None
    arguments: RenderArguments = "objects"


@dataclass(frozen=True, slots=True)
class RenderSettings:
    """What a run's renderer is made of, as the driver cut it from the manifest once
    (regen.engine.inputs): the target tokenizer's folder (absolute) and whether its own code
    may run, the target's family (None: none regen knows), the ``chat_template_kwargs`` of
    the local render, the text of the template the servers run (``target.chat_template``;
    None: the tokenizer's own) and the run's :class:`RenderSetup`."""

    tokenizer: Path
    family: Family | None
    trust_remote_code: bool = False
    template_kwargs: Mapping[str, object] = field(default_factory=dict)
    chat_template: str | None = None
    setup: RenderSetup = field(default_factory=RenderSetup)


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
    """One turn rendered as text only (:meth:`Renderer.render_text`); ``tokenize`` makes it
    a :class:`RenderedTurn`."""

    prompt_text: str
    response_text: str
    think_state: ThinkState
    reasoning: str | None
    content: str
    flag: RenderFlag | None
    #: cut (``length``) inside the reasoning: the close marker belongs to the response when the
    #: server's ``completion_tokens`` counts one token more than the response (see render_turn)
    cut_in_reasoning: bool = False
    completion_tokens: int | None = None
    #: the family's close marker of the reasoning (what a cut in the reasoning may end with)
    closer: str = ""

    @property
    def text(self) -> str:
        return self.prompt_text + self.response_text

    def settle(self, response_len: int) -> bool:
        """Append the close marker when the turn was cut in its reasoning and the server counted
        one token more than the ``response_len`` ids of the response: True when it did."""
        if self.cut_in_reasoning and self.completion_tokens == response_len + 1:
            self.response_text += self.closer
            self.cut_in_reasoning = False
            return True
        return False


def response_finish(reason: str) -> str:
    """The finish reason a family's response text is assembled with: a turn the model did not
    finish (:data:`regen.core.result.UNFINISHED`: cut by ``max_tokens`` or by regen's loop cut)
    is assembled as one cut by ``max_tokens``: no end-of-turn token."""
    return "length" if reason in UNFINISHED else reason


class Renderer:
    """Renders and tokenizes turns with a target tokenizer, its own chat template (or
    ``chat_template``: the one the server runs) and its model family (None: a family regen
    does not know, whose prompts render but whose responses cannot be assembled).
    ``arguments``: how history tool-call arguments reach the template (``objects``, as the
    engines hand them; ``strings``, as a run started before regen did so keeps rendering)."""

    def __init__(
        self,
        tokenizer: Any,
        template_kwargs: Mapping[str, object] | None = None,
        family: Family | None = None,
        *,
        chat_template: str | None = None,
        arguments: RenderArguments = "objects",
    ) -> None:
        self.tokenizer = tokenizer
        self.family = family
        self.template_kwargs: dict[str, object] = dict(template_kwargs or {})
        self.arguments: RenderArguments = arguments
        #: the template given in place of the tokenizer's (``--chat-template``; None: none)
        self.served_template = chat_template
        encoder = family is not None and family.encodes_prompts
        template = f"encoder:{family.name}" if encoder else self.chat_template  # type: ignore[union-attr]
        if not template:
            raise TemplateError("the tokenizer has no chat template")
        eos = getattr(tokenizer, "eos_token_id", None)
        if family is not None:
            end = self._token_id(family.end_of_turn)
            if end is None:
                raise TemplateError(f"the tokenizer has no {family.end_of_turn} token: not a "
                                    f"{family.title} tokenizer")  # fmt: skip
            ends = [end, *(self._token_id(t) for t in family.other_ends)]
        else:
            end, ends = eos, []
        #: id of the end-of-turn token appended to server ids that lack one (None: unknown)
        self.end_id: int | None = end
        #: id of the reasoning's close marker (None: no such token)
        self.think_close_id: int | None = (
            self._token_id(family.think[1]) if family is not None and family.think else None
        )
        #: ids that end a turn (the family's end tokens and the tokenizer's eos)
        self.end_ids: frozenset[int] = frozenset(i for i in (*ends, eos) if i is not None)
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
    def chat_template(self) -> str:
        """The Jinja template that renders prompts: the served one, else the tokenizer's (its
        default where it names several; '' when it has none)."""
        template = self.served_template or getattr(self.tokenizer, "chat_template", None)
        if isinstance(template, dict):  # named templates: the default one renders
            template = template.get("default") or next(iter(template.values()))
        return template or ""

    def _token_id(self, token: str) -> int | None:
        """The id of a special token, None when the tokenizer lacks it."""
        found = self.tokenizer.convert_tokens_to_ids(token)
        if found is None or found == getattr(self.tokenizer, "unk_token_id", None):
            return None
        return int(found)

    @property
    def prompts(self) -> PromptIds:
        """Prompt-id reuse across a conversation's turns (built on first use: it probes the
        tokenizer); its ``stats`` count how often each case applied."""
        if self._prompts is None:
            tokens = self.family.boundary_tokens() if self.family is not None else ()
            self._prompts = PromptIds(self.codec, Boundaries(self.codec, tokens))
        return self._prompts

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_dir(
        cls,
        path: str | os.PathLike[str],
        trust_remote_code: bool = False,
        template_kwargs: Mapping[str, object] | None = None,
        family: Family | None = None,
        *,
        chat_template: str | None = None,
    ) -> Renderer:
        """Load a local tokenizer directory (transformers; remote code only when allowed);
        ``family``: the target's, else the one the directory is recognised as."""
        family = family if family is not None else recognise_dir(Path(path))
        return cls(load_tokenizer(path, trust_remote_code), template_kwargs, family,
                   chat_template=chat_template)  # fmt: skip

    @classmethod
    def of(cls, settings: RenderSettings) -> Renderer:
        """The renderer of a run (:class:`RenderSettings`): its target tokenizer, loaded as its
        setup says, the template the servers run (else the tokenizer's), template kwargs and
        family."""
        setup = settings.setup
        tok = load_tokenizer(settings.tokenizer, settings.trust_remote_code,
                             setup.tokenizer_class)  # fmt: skip
        return cls(tok, dict(settings.template_kwargs), settings.family,
                   chat_template=settings.chat_template, arguments=setup.arguments)  # fmt: skip

    # -- text and ids -------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; nothing added around it."""
        return self.codec.encode_many([text])[0]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept."""
        return self.codec.decode_many([ids])[0]

    def render_prompt(
        self,
        messages: Sequence[Message | Mapping[str, object]],
        tools: Sequence[Mapping[str, object]] | None = None,
        engine: str | None = None,
    ) -> str:
        """The generation prompt for the next assistant turn, as the template (or the family's
        encoder) renders it on the engine called ``engine`` (regen.template.prepare; None: no
        engine known). ArgumentsError where that engine refuses the request."""
        prep = preparation(engine, self.arguments)
        fam = self.family
        rule = fam.sglang_arguments if fam is not None and prep.name == SGLANG else None
        template = "" if fam is not None and fam.encodes_prompts else self.chat_template
        content: ContentFormat = "openai" if template and loops_over_content(template) else "string"
        msgs = prep.messages(messages, content, rule)
        served_tools = prep.tools(tools)
        if not template:  # the family's encoder renders (Renderer checked it has one)
            return fam.encode_prompt(msgs, served_tools, self.template_kwargs, prep.name)  # type: ignore[union-attr]
        if self.served_template and prep.name == SGLANG:  # how SGLang reads --chat-template
            template = template.strip("\n").replace("\\n", "\n")
        try:
            text = self.tokenizer.apply_chat_template(
                msgs,
                tools=served_tools,
                chat_template=template,
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
        messages: Sequence[Message | Mapping[str, object]],
        tools: Sequence[Mapping[str, object]] | None,
        *,
        reasoning: str | None,
        content: str,
        tool_calls: Sequence[ToolCall] = (),
        finish_reason: str = "stop",
        completion_tokens: int | None = None,
        engine: str | None = None,
    ) -> TurnText:
        """Prompt (template) + reassembled response, as text (see :meth:`render_turn`);
        ``engine``: the engine that answered (how it hands the template the request)."""
        fam = self.family
        if fam is None:
            raise TemplateError(
                "the target's model family is unknown: its responses cannot be assembled here "
                "(docs/targets.md: set target.family, or serve it with token ids)"
            )
        finish_reason = response_finish(finish_reason)
        prompt = self.render_prompt(messages, tools, engine)
        state = fam.think_state(prompt)
        reasoning, content, flag = fam.split_response(state, reasoning, content)
        if flag is not None:
            log.debug("rendered turn flagged %s (after a %r prompt)", flag, state)
        response = fam.response_text(state, reasoning, content, tool_calls, finish_reason)
        closer = fam.cut_close()
        cut = (
            finish_reason == "length"
            and reasoning is not None
            and not content
            and not tool_calls
            and state != "closed"
            and closer is not None
        )
        return TurnText(prompt, response, state, reasoning, content, flag, cut, completion_tokens,
                        closer or "")  # fmt: skip

    def served_response(self, turn: TurnText | RenderedTurn, result: TurnResult) -> str | None:
        """The response in the form the answering engine makes the family write by default,
        where that differs from its own (:meth:`regen.targets.family.Family.served_variant`;
        None: it does not): a server row's cross-check accepts either."""
        fam = self.family.served_variant(result.engine) if self.family is not None else None
        if fam is None:
            return None
        finish = response_finish(result.finish_reason)
        return fam.response_text(turn.think_state, turn.reasoning, turn.content,
                                 result.tool_calls, finish)  # fmt: skip

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
        messages: Sequence[Message | Mapping[str, object]],
        tools: Sequence[Mapping[str, object]] | None,
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


def messages_json(messages: Sequence[Message | Mapping[str, object]]) -> str:
    """The request messages as a JSON array of OpenAI message dicts."""
    msgs = [m.to_openai() if isinstance(m, Message) else m for m in messages]
    return json.dumps(msgs, ensure_ascii=False)
