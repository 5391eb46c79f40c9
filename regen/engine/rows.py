"""The training row: one Parquet row per regenerated assistant turn (or per native row).

Builds the row dicts of :mod:`regen.store.schema` (the columns and what each means).

The quality checks run where the row is built, in the actor (:func:`build_turn_row`, off the
event loop); whether the reasoning was closed (``think_closed``) comes from the server's ids
when the row has them (is ``</think>`` among the output ids), else from the local render
(``think_inserted``: the output had no ``</think>``, so all of it is checked as reasoning).

Server ids: when the server returned ``prompt_token_ids`` and ``output_token_ids`` those ARE
the row. A turn that finished normally (not ``length``) must end with the end-of-turn token for
the draft to learn where answers stop; SGLang may or may not include the stop token in the
returned output ids, so when the last output id is not the family's end-of-turn token (Kimi's
``<|im_end|>``; ``renderer.end_id``, or the tokenizer's eos) that token is appended with mask 1
and ``im_end_added`` is set. Truncated turns get nothing
appended. The local render is then a cross-check recorded in ``token_check``, made without the
tokenizer's encoder: the rendered prompt and reassembled response are compared with the server's
prompt and response ids decoded (one batch per sample); ids that decode to the rendered text
are a ``match`` even when a whole encode would have split the text otherwise.

Local rows (no server ids): the response is rebuilt from what the server's parsers returned
and re-tokenized here, so it cannot be proven equal to the tokens the model produced; every
local row says how far it can be trusted. Its length is compared with the server's
``completion_tokens``: allowed is equal, or one more when the row ends with an end-of-turn token
the server did not count (servers differ on counting the stop token); anything else is
``count_mismatch``. A row with tool calls is ``tool_calls_rebuilt`` even when the count agrees:
SGLang's kimi_k2 parsers re-serialize the call ids, drop whitespace inside the section and
text after it, and let the model switch to tools without ``</think>`` (tests/contract/
test_kimi_parsers.py; docs/format.md lists every case). ``count_unknown``: the server sent no
count. Only ``count_match`` (and ``match`` for server rows) is not counted as a problem by
``regen export``. ``reasoning`` and ``content`` hold the rendered split (a parser-less server's
content is split at ``</think>``, see regen.template.render).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from regen.core.chat import ToolCallJson
from regen.core.errors import RowError, TemplateError
from regen.core.result import TurnResult
from regen.core.sample import Message, Sample
from regen.quality import DEFAULT_CONFIG, NOT_CHECKED, Quality, QualityConfig, check_turn
from regen.targets import UNKNOWN
from regen.template.render import RenderedTurn, Renderer, TurnText, messages_json


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


#: one regenerated turn as the row builder takes it: (turn index, request messages, result)
TurnInput = tuple[int, Sequence[Message | Mapping[str, object]], TurnResult]


@dataclass(slots=True)
class PreparedTurn:
    """The tokenizer work of one turn, done by :func:`prepare_turns` for a whole sample: its
    local render (ids included for a local row, text only for a server row) or why it failed,
    and for a server row its ids (the end-of-turn token appended where missing) and their text."""

    local: RenderedTurn | TurnText | None
    render_error: TemplateError | None = None
    server_ids: tuple[list[int], list[int], bool] | None = None  #: prompt, response, added
    decoded: tuple[str, str] | None = None  #: the server's prompt and response ids, decoded


def build_rows(
    sample: Sample,
    turns: Sequence[TurnInput],
    renderer: Renderer,
    quality: QualityConfig = DEFAULT_CONFIG,
    settings: str | None = None,
) -> list[dict[str, Any]]:
    """The rows of a sample's regenerated turns, in order; the same rows as
    :func:`build_turn_row` on each turn, with the tokenizer work of all turns batched
    (:func:`prepare_turns`). The first turn that cannot become a row raises. ``settings``:
    the manifest's ``settings_id()``, recorded in every row."""
    prepared = prepare_turns(sample, turns, renderer)
    return [
        build_turn_row(sample, turn, msgs, res, renderer, quality, p, settings=settings)
        for (turn, msgs, res), p in zip(turns, prepared, strict=True)
    ]


def server_ids(result: TurnResult, renderer: Renderer) -> tuple[list[int], list[int], bool]:
    """A server row's prompt and response ids, the family's end-of-turn token appended to a
    turn that finished normally without one (see the module docstring), and whether it was."""
    prompt_ids = list(result.prompt_token_ids or ())
    response_ids = list(result.output_token_ids or ())
    ended = bool(response_ids) and response_ids[-1] in renderer.end_ids
    if not result.unfinished and not ended and renderer.end_id is not None:
        response_ids.append(renderer.end_id)
        return prompt_ids, response_ids, True
    return prompt_ids, response_ids, False


def prepare_turns(
    sample: Sample, turns: Sequence[TurnInput], renderer: Renderer
) -> list[PreparedTurn]:
    """Render every turn as text (template and response assembly, no encode); then, in one
    batch each, encode the local turns (each prompt reusing the ids of the sample's previous
    local prompt where the texts agree, regen.template.extend) and decode the server turns'
    ids (their check compares texts: a server row needs no encode)."""
    tools = sample.tools or None
    out: list[PreparedTurn] = []
    for _, msgs, res in turns:
        try:
            text = renderer.render_text(
                msgs,
                tools,
                reasoning=res.reasoning,
                content=res.content,
                tool_calls=res.tool_calls,
                finish_reason=res.finish_reason,
                completion_tokens=res.completion_tokens,
                engine=res.engine,
            )
            out.append(PreparedTurn(text))
        except TemplateError as e:
            out.append(PreparedTurn(None, e))
        if res.prompt_token_ids is not None and res.output_token_ids is not None:
            out[-1].server_ids = server_ids(res, renderer)
            if out[-1].local is not None:
                renderer.settle_text(out[-1].local)  # type: ignore[arg-type]
    local = [p for p in out if p.server_ids is None and p.local is not None]
    rendered = renderer.tokenize(
        [p.local for p in local],  # type: ignore[misc]
        [None, *range(len(local) - 1)][: len(local)],
    )
    for p, r in zip(local, rendered, strict=True):
        p.local = r
    server = [p for p in out if p.server_ids is not None]
    seqs = [ids for p in server for ids in p.server_ids[:2]]  # type: ignore[index]
    texts = iter(renderer.codec.decode_many(seqs))
    for p in server:
        p.decoded = (next(texts), next(texts))
    return out


def build_turn_row(
    sample: Sample,
    turn: int,
    request_messages: Sequence[Message | Mapping[str, object]],
    result: TurnResult,
    renderer: Renderer,
    quality: QualityConfig = DEFAULT_CONFIG,
    prepared: PreparedTurn | None = None,
    *,
    settings: str | None = None,
) -> dict[str, Any]:
    """The training row of one regenerated assistant turn (see the module docstring), its
    quality checked with ``quality``'s thresholds; ``prepared``: its tokenizer work done
    already (:func:`build_rows`); ``settings``: the manifest's ``settings_id()``."""
    if prepared is None:
        prepared = prepare_turns(sample, [(turn, request_messages, result)], renderer)[0]
    if prepared.server_ids is not None:
        tokens = server_tokens(prepared, result, renderer)
    else:
        tokens = local_tokens(prepared, result, renderer)
    if not tokens.response_ids:
        raise TemplateError(f"{sample.id} turn {turn}: empty response, nothing to train on")
    answer = Answer.of(prepared.local, result)
    checked = answer.check(request_messages, sample.tools or None, result.finish_reason,
                           think_closed=tokens.think_closed, config=quality)  # fmt: skip
    return {
        "sample_id": sample.id,
        "source": sample.source,
        "turn": turn,
        "messages": messages_json(request_messages),
        "tools": json.dumps(sample.tools, ensure_ascii=False) if sample.tools else None,
        "reasoning": answer.reasoning,
        "content": answer.content,
        "tool_calls": json.dumps(answer.calls, ensure_ascii=False),
        "finish_reason": result.finish_reason,
        "truncated": result.truncated,
        **tokens.columns(result),
        "reasoning_tokens": result.reasoning_tokens,
        "cached_tokens": result.cached_tokens,
        "model": result.model,
        "endpoint": result.endpoint,
        "token_source": tokens.source,
        "token_check": tokens.check,
        "im_end_added": tokens.im_end_added,
        "template_hash": renderer.template_hash,
        **_served(result),
        "created_at": _now(),
        "attempt": sample.attempt,
        **checked.columns(),
        "content_hash": sample.content_hash,
        "settings": settings,
        "family": renderer.family.name if renderer.family is not None else UNKNOWN,
        "cut_saved": result.cut_saved,
    }


def _served(result: TurnResult) -> dict[str, Any]:
    """The row's columns on how the answer was served: engine, attempts, timings."""
    return {
        "engine": result.engine,
        "engine_version": result.engine_version,
        "ended": None,
        "attempts": result.attempts,
        "latency_s": float(result.latency_s),
        "ttft_s": result.ttft_s,
    }


@dataclass(slots=True)
class TurnTokens:
    """A turn's ids and text, and where they come from (see the module docstring)."""

    prompt_ids: list[int]
    response_ids: list[int]
    text: str
    source: str  #: ``token_source``: ``server`` or ``local``
    check: str  #: ``token_check``
    think_closed: bool | None  #: whether the output holds ``</think>`` (None: not known)
    im_end_added: bool = False

    def columns(self, result: TurnResult) -> dict[str, Any]:
        """The row's columns from ``text`` to ``completion_tokens`` (the server's counts when
        it sent them)."""
        input_ids = self.prompt_ids + self.response_ids
        return {
            "text": self.text,
            "input_ids": input_ids,
            "loss_mask": [0] * len(self.prompt_ids) + [1] * len(self.response_ids),
            "num_tokens": len(input_ids),
            "loss_tokens": len(self.response_ids),
            "prompt_tokens": result.prompt_tokens
            if result.prompt_tokens is not None
            else len(self.prompt_ids),
            "completion_tokens": result.completion_tokens
            if result.completion_tokens is not None
            else len(self.response_ids),
        }


def server_tokens(prepared: PreparedTurn, result: TurnResult, renderer: Renderer) -> TurnTokens:
    """A server row: the server's ids, held against the local render (``token_check``); its
    text is the render where they match, else the ids decoded."""
    assert prepared.server_ids is not None
    prompt_ids, response_ids, im_end_added = prepared.server_ids
    local = prepared.local
    close = renderer.think_close_id
    think_closed = None if close is None else close in result.output_token_ids  # type: ignore[operator]
    if local is None:
        # a target of no known family has no local render to hold the ids against
        check = "server_only" if renderer.family is None else "render_error"
        response_text = None
    else:
        assert prepared.decoded is not None
        check, response_text = server_check(local, prepared.decoded, result, renderer)
    if check == "match" and local is not None and response_text is not None:
        text = local.prompt_text + response_text
    else:
        text = renderer.decode(prompt_ids + response_ids)
    return TurnTokens(prompt_ids, response_ids, text, "server", check, think_closed, im_end_added)


def server_check(
    local: RenderedTurn | TurnText,
    decoded: tuple[str, str],
    result: TurnResult,
    renderer: Renderer,
) -> tuple[str, str | None]:
    """``token_check`` of a server row: its decoded prompt and response against the local
    render's (the response in the engine's default form too, when it has one); and the
    rendered response text compared."""
    p_ok = local.prompt_text == decoded[0]
    response_text: str | None = local.response_text
    if response_text != decoded[1]:  # the engine's default form, if it has one
        response_text = renderer.served_response(local, result)
    r_ok = response_text == decoded[1]
    check = {
        (True, True): "match",
        (False, True): "prompt_mismatch",
        (True, False): "response_mismatch",
        (False, False): "mismatch",
    }[(p_ok, r_ok)]
    return check, response_text


def local_tokens(prepared: PreparedTurn, result: TurnResult, renderer: Renderer) -> TurnTokens:
    """A local row: the render's ids, its length held against the server's count; raises the
    render's error when there is no render."""
    local = prepared.local
    if local is None:
        assert prepared.render_error is not None
        raise prepared.render_error
    assert isinstance(local, RenderedTurn)
    response_ids = local.response_ids
    check = local_check(
        local.flag,
        count_check(
            len(response_ids),
            result.completion_tokens,
            ends_with_end=bool(response_ids) and response_ids[-1] == renderer.end_id,
        ),
        has_tool_calls=bool(result.tool_calls),
    )
    think_closed = False if local.flag == "think_inserted" else None
    return TurnTokens(local.prompt_ids, response_ids, local.text, "local", check, think_closed)


@dataclass(slots=True)
class Answer:
    """What a turn answered, as the row holds it and the quality checks read it."""

    reasoning: str | None
    content: str
    calls: list[ToolCallJson]  #: the tool calls, OpenAI shape
    #: the output never wrote ``</think>`` (``think_inserted``): all of it is reasoning
    unclosed: bool

    @classmethod
    def of(cls, local: RenderedTurn | TurnText | None, result: TurnResult) -> Answer:
        """The rendered split when there is a render, else the server's."""
        return cls(
            reasoning=local.reasoning if local is not None else result.reasoning,
            content=local.content if local is not None else result.content,
            calls=[c.to_openai() for c in result.tool_calls],
            unclosed=local is not None and local.flag == "think_inserted",
        )

    def check(
        self,
        request_messages: Sequence[Message | Mapping[str, object]],
        tools: Sequence[Mapping[str, object]] | None,
        finish_reason: str | None,
        *,
        think_closed: bool | None,
        config: QualityConfig,
    ) -> Quality:
        """The quality checks of this answer (regen.quality.check_turn)."""
        return check_turn(
            [m.to_openai() if isinstance(m, Message) else m for m in request_messages],
            f"{self.reasoning or ''}{self.content}" if self.unclosed else self.reasoning,
            "" if self.unclosed else self.content,
            self.calls,
            tools,
            finish_reason,
            think_closed=think_closed,
            config=config,
        )


def count_check(
    response_len: int, completion_tokens: int | None, *, ends_with_end: bool
) -> str | None:
    """``count_match`` / ``count_mismatch`` for a local row; None without a server count.

    A row that ends with the end-of-turn token may be one token longer than the server's count.
    """
    if completion_tokens is None:
        return None
    if response_len == completion_tokens or (
        ends_with_end and response_len == completion_tokens + 1
    ):
        return "count_match"
    return "count_mismatch"


def local_check(flag: str | None, count: str | None, *, has_tool_calls: bool) -> str:
    """A local row's ``token_check`` (see the module docstring): the render flag, else a count
    mismatch, else ``tool_calls_rebuilt``, else ``count_unknown`` or ``count_match``."""
    if flag is not None:
        return flag
    if count == "count_mismatch":
        return count
    if has_tool_calls:
        return "tool_calls_rebuilt"
    return count or "count_unknown"


def native_row(sample: Sample, family: str | None = None) -> dict[str, Any]:
    """The row of a native sample: its ids and mask passed through unchanged; ``family``: the
    target's (recorded in the row).

    Validate it first (``regen.sources.native.validate_native``); this only checks the lengths.
    """
    ids, mask = sample.input_ids, sample.loss_mask
    if ids is None or mask is None or len(ids) != len(mask):
        raise RowError("length_mismatch", f"{sample.id}: input_ids and loss_mask differ")
    loss = sum(mask)
    return {
        "sample_id": sample.id,
        "source": sample.source,
        "turn": 0,
        "messages": "[]",
        "tools": None,
        "reasoning": None,
        "content": "",
        "tool_calls": "[]",
        "finish_reason": None,
        "truncated": False,
        "text": None,
        "input_ids": list(ids),
        "loss_mask": list(mask),
        "num_tokens": len(ids),
        "loss_tokens": loss,
        "prompt_tokens": len(ids) - loss,
        "completion_tokens": loss,
        "reasoning_tokens": None,
        "cached_tokens": None,
        "model": None,
        "endpoint": None,
        "token_source": "native",
        "token_check": None,
        "im_end_added": False,
        "template_hash": None,
        "engine": None,
        "engine_version": None,
        "ended": None,
        "attempts": 0,
        "latency_s": 0.0,
        "ttft_s": None,
        "created_at": _now(),
        "attempt": sample.attempt,
        **NOT_CHECKED.columns(),
        "content_hash": sample.content_hash,
        "settings": None,
        "family": family,
        "cut_saved": None,
    }
