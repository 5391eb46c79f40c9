"""The training row: one Parquet row per regenerated assistant turn (or per native row).

This module defines the schema of every Parquet part under ``RUN_DIR/parts/`` (written by
``regen.store``, read by ``regen.export`` and the monitor); docs/format.md explains it for users.
Row dicts are JSON-native (they also travel as journal lines), one key per column:

=================  ==================  ========================================================
column             type                meaning
=================  ==================  ========================================================
sample_id          string, required    stable sample id (``{source}:{id}``)
source             string, required    manifest source name
turn               int32, required     index of the regenerated assistant turn in the sample
                                       (0-based; native rows: 0)
messages           string (JSON)       the request messages of this turn (OpenAI dicts, incl.
                                       reasoning_content / tool_calls / tool results)
tools              string (JSON)/null  the tool declarations sent with the request
reasoning          string/null         reasoning the server returned (null: none returned)
content            string              content the server returned
tool_calls         string (JSON)       tool calls the server returned (OpenAI shape), ``[]``
finish_reason      string/null         ``stop``, ``length``, ``tool_calls``, ...; null: native
truncated          bool                finish_reason == "length"
text               string/null         the row as Kimi-format text (prompt + response);
                                       null for native rows (no tokenizer at hand)
input_ids          list<int32>, req.   prompt ids + response ids
loss_mask          list<int8>, req.    0 on the prompt, 1 on the response (same length)
num_tokens         int32, required     len(input_ids)
loss_tokens        int32, required     sum(loss_mask)
prompt_tokens      int32               server-reported prompt tokens, else the row's prompt
                                       length (native: count of mask 0)
completion_tokens  int32               server-reported completion tokens, else the row's
                                       response length (native: count of mask 1)
reasoning_tokens   int32/null          server-reported, when sent
cached_tokens      int32/null          server-reported prefix-cache hits, when sent
model              string/null         model name the server reported
endpoint           string/null         base URL of the endpoint that answered
token_source       string, required    ``server`` (the server's prompt/output ids are the row),
                                       ``local`` (rendered + tokenized here), ``native``
token_check        string/null         server rows: the local render compared with the
                                       server ids, as text: ``match``, ``prompt_mismatch``,
                                       ``response_mismatch``, ``mismatch``, ``render_error``;
                                       ``server_only``: the target's family is unknown, so
                                       nothing local to compare (the ids are the server's).
                                       local rows (first that applies): a render flag
                                       (``think_inserted``, ``content_has_think``, see
                                       regen.template.render), ``count_mismatch``,
                                       ``tool_calls_rebuilt``, ``count_unknown``,
                                       ``count_match`` (see below). Never null for a
                                       regenerated row; null for native rows
im_end_added       bool                server rows: ``<|im_end|>`` was appended because the
                                       server stopped without returning it (see below)
template_hash      string/null         Renderer.template_hash (template + kwargs + vocab)
engine             string/null         the engine that answered (``sglang``, ``vllm``,
                                       ``openai``: no known engine, regen.client.profiles);
                                       null for native rows
engine_version     string/null         the version that engine reported (null: none)
ended              string/null         on a sample's last row only: why its conversation
                                       ended before its last assistant turn (``turns: all``,
                                       regen.engine.turns: ``tool_call_name``,
                                       ``tool_call_arguments``, ``tool_call_count``,
                                       ``tool_calls_unexpected``, ``tool_calls_missing``);
                                       null when every turn was regenerated or the reply was
                                       cut (``truncated``)
attempts           int32               requests it took
latency_s          float64             request latency
ttft_s             float64/null        time to first token (streaming)
created_at         string, required    ISO-8601 UTC time the row was built
attempt            int32, required     0: the sample's first answer; n: its n-th new attempt
                                       (``regen run --retry-flagged``; every row of a sample's
                                       attempt carries the same number, the highest wins in
                                       export). Not ``attempts`` (requests one turn took)
quality_flags      list<string>, req.  regen.quality's flags of this turn (``[]``: clean);
q_*                                    and the measures behind them (regen.quality.COLUMNS,
                                       docs/quality.md); native rows are not checked
content_hash       string/null         ``Sample.content_hash`` of the source content the row
                                       answers (its conversation and tools; native: its ids
                                       and mask): a resume that reads another hash for the
                                       same sample knows the row is stale (the source row was
                                       edited) and answers it again as a new attempt. Null: a
                                       part written before the column (unknown, not stale)
settings           string/null         ``Manifest.settings_id()``: a short id of the target
                                       and sampling settings that made the row (``regen run
                                       --force`` can mix settings in one run; ``run.json``
                                       keeps what each id stands for, ``regen export
                                       --setting ID`` keeps one). Null for native rows (no
                                       setting makes them) and parts written before the column
family             string/null         the target's model family (regen.targets: ``kimi``,
                                       ``qwen3``, ...; ``unknown``: none regen knows, the row
                                       is the server's ids). Null: a part written before the
                                       column (a Kimi run: no other family existed)
=================  ==================  ========================================================

``attempt`` and the quality columns are the :data:`ADDED_COLUMNS`: a part written before them
lacks them and is still read (no flags, attempt 0); a row dict without them (a journal line of
such a session, folded on resume) gets them from :func:`upgrade_row` (its turn checked then).
Likewise the :data:`PROVENANCE_COLUMNS` (engine, engine_version, ended), the
:data:`ANSWER_COLUMNS` (content_hash, settings) and the :data:`FAMILY_COLUMNS` (family): a
part written before them lacks them (read as null), and :func:`upgrade_row` gives a row dict
without them nulls.
The quality checks run where the row is built, in the actor (:func:`build_turn_row`, off the
event loop); whether the reasoning was closed (``think_closed``) comes from the server's ids
when the row has them (is ``</think>`` among the output ids), else from the local render
(``think_inserted``: the output had no ``</think>``, so all of it is checked as reasoning).

Server ids: when the server returned ``prompt_token_ids`` and ``output_token_ids`` those ARE
the row. A turn that finished normally (not ``length``) must end with the end-of-turn token for
the draft to learn where answers stop; SGLang may or may not include the stop token in the
returned output ids, so when the last output id is not ``<|im_end|>`` (or the tokenizer's eos)
``<|im_end|>`` is appended with mask 1 and ``im_end_added`` is set. Truncated turns get nothing
appended. The local render is then a cross-check recorded in ``token_check``, made without the
tokenizer's encoder: the rendered prompt and reassembled response are compared with the server's
prompt and response ids decoded (one batch per sample); ids that decode to the rendered text
are a ``match`` even when a whole encode would have split the text otherwise.

Local rows (no server ids): the response is rebuilt from what the server's parsers returned
and re-tokenized here, so it cannot be proven equal to the tokens the model produced; every
local row says how far it can be trusted. Its length is compared with the server's
``completion_tokens``: allowed is equal, or one more when the row ends with a ``<|im_end|>``
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
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from regen.errors import RowError, TemplateError
from regen.quality import COLUMNS as QUALITY_COLUMNS
from regen.quality import DEFAULT_CONFIG, NOT_CHECKED, QualityConfig, check_row, check_turn
from regen.result import TurnResult
from regen.sample import Message, Sample
from regen.targets import UNKNOWN
from regen.template.render import RenderedTurn, Renderer, TurnText, messages_json

#: columns a part written before issue 15 lacks (see the module docstring)
ADDED_COLUMNS: pa.Schema = pa.schema(
    [pa.field("attempt", pa.int32(), nullable=False), *QUALITY_COLUMNS]
)
#: columns a part written before issue 22 lacks (nullable; see the module docstring)
PROVENANCE_COLUMNS: pa.Schema = pa.schema(
    [
        pa.field("engine", pa.string()),
        pa.field("engine_version", pa.string()),
        pa.field("ended", pa.string()),
    ]
)
#: columns a part written before issue 21 lacks (nullable; see the module docstring)
ANSWER_COLUMNS: pa.Schema = pa.schema(
    [
        pa.field("content_hash", pa.string()),
        pa.field("settings", pa.string()),
    ]
)
#: columns a part written before issue 30 lacks (nullable; see the module docstring)
FAMILY_COLUMNS: pa.Schema = pa.schema([pa.field("family", pa.string())])
#: the column groups added after the first schema: a part may lack each group as a whole
LATER_COLUMNS: tuple[pa.Schema, ...] = (
    ADDED_COLUMNS, PROVENANCE_COLUMNS, ANSWER_COLUMNS, FAMILY_COLUMNS,
)  # fmt: skip
SCHEMA: pa.Schema = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("turn", pa.int32(), nullable=False),
        pa.field("messages", pa.string()),
        pa.field("tools", pa.string()),
        pa.field("reasoning", pa.string()),
        pa.field("content", pa.string()),
        pa.field("tool_calls", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("truncated", pa.bool_()),
        pa.field("text", pa.string()),
        pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
        pa.field("num_tokens", pa.int32(), nullable=False),
        pa.field("loss_tokens", pa.int32(), nullable=False),
        pa.field("prompt_tokens", pa.int32()),
        pa.field("completion_tokens", pa.int32()),
        pa.field("reasoning_tokens", pa.int32()),
        pa.field("cached_tokens", pa.int32()),
        pa.field("model", pa.string()),
        pa.field("endpoint", pa.string()),
        pa.field("token_source", pa.string(), nullable=False),
        pa.field("token_check", pa.string()),
        pa.field("im_end_added", pa.bool_()),
        pa.field("template_hash", pa.string()),
        pa.field("attempts", pa.int32()),
        pa.field("latency_s", pa.float64()),
        pa.field("ttft_s", pa.float64()),
        pa.field("created_at", pa.string(), nullable=False),
        *ADDED_COLUMNS,
        *PROVENANCE_COLUMNS,
        *ANSWER_COLUMNS,
        *FAMILY_COLUMNS,
    ]
)
COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)
TOKEN_SOURCES = ("server", "local", "native")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


#: one regenerated turn as the row builder takes it: (turn index, request messages, result)
TurnInput = tuple[int, Sequence[Message | dict[str, Any]], TurnResult]


@dataclass(slots=True)
class PreparedTurn:
    """The tokenizer work of one turn, done by :func:`prepare_turns` for a whole sample: its
    local render (ids included for a local row, text only for a server row) or why it failed,
    and for a server row its ids (``<|im_end|>`` appended where missing) and their text."""

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
    if not result.truncated and not ended and renderer.end_id is not None:
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
    request_messages: Sequence[Message | dict[str, Any]],
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
    tools = sample.tools or None
    if prepared is None:
        prepared = prepare_turns(sample, [(turn, request_messages, result)], renderer)[0]
    local, render_error = prepared.local, prepared.render_error

    im_end_added = False
    if prepared.server_ids is not None:
        prompt_ids, response_ids, im_end_added = prepared.server_ids
        token_source = "server"
        close = renderer.think_close_id
        think_closed = None if close is None else close in result.output_token_ids
        if local is None:
            # a target of no known family has no local render to hold the ids against
            token_check = "server_only" if renderer.family is None else "render_error"
        else:
            assert prepared.decoded is not None
            p_ok = local.prompt_text == prepared.decoded[0]
            r_ok = local.response_text == prepared.decoded[1]
            token_check = {
                (True, True): "match",
                (False, True): "prompt_mismatch",
                (True, False): "response_mismatch",
                (False, False): "mismatch",
            }[(p_ok, r_ok)]
        text = local.text if token_check == "match" and local else None
        if text is None:
            text = renderer.decode(prompt_ids + response_ids)
    else:
        if local is None:
            assert render_error is not None
            raise render_error
        assert isinstance(local, RenderedTurn)
        prompt_ids, response_ids = local.prompt_ids, local.response_ids
        token_source, text = "local", local.text
        think_closed = False if local.flag == "think_inserted" else None
        token_check = local_check(
            local.flag,
            count_check(
                len(response_ids),
                result.completion_tokens,
                ends_with_end=bool(response_ids) and response_ids[-1] == renderer.end_id,
            ),
            has_tool_calls=bool(result.tool_calls),
        )

    input_ids = prompt_ids + response_ids
    if not response_ids:
        raise TemplateError(f"{sample.id} turn {turn}: empty response, nothing to train on")
    reasoning = local.reasoning if local is not None else result.reasoning
    content = local.content if local is not None else result.content
    calls = [c.to_openai() for c in result.tool_calls]
    # think_inserted: the output never wrote </think>, so all of it is reasoning
    unclosed = local is not None and local.flag == "think_inserted"
    checked = check_turn(
        [m.to_openai() if isinstance(m, Message) else m for m in request_messages],
        f"{reasoning or ''}{content}" if unclosed else reasoning,
        "" if unclosed else content,
        calls,
        tools,
        result.finish_reason,
        think_closed=think_closed,
        config=quality,
    )
    return {
        "sample_id": sample.id,
        "source": sample.source,
        "turn": turn,
        "messages": messages_json(request_messages),
        "tools": json.dumps(tools, ensure_ascii=False) if tools else None,
        "reasoning": reasoning,
        "content": content,
        "tool_calls": json.dumps(calls, ensure_ascii=False),
        "finish_reason": result.finish_reason,
        "truncated": result.truncated,
        "text": text,
        "input_ids": input_ids,
        "loss_mask": [0] * len(prompt_ids) + [1] * len(response_ids),
        "num_tokens": len(input_ids),
        "loss_tokens": len(response_ids),
        "prompt_tokens": result.prompt_tokens
        if result.prompt_tokens is not None
        else len(prompt_ids),
        "completion_tokens": result.completion_tokens
        if result.completion_tokens is not None
        else len(response_ids),
        "reasoning_tokens": result.reasoning_tokens,
        "cached_tokens": result.cached_tokens,
        "model": result.model,
        "endpoint": result.endpoint,
        "token_source": token_source,
        "token_check": token_check,
        "im_end_added": im_end_added,
        "template_hash": renderer.template_hash,
        "engine": result.engine,
        "engine_version": result.engine_version,
        "ended": None,
        "attempts": result.attempts,
        "latency_s": float(result.latency_s),
        "ttft_s": result.ttft_s,
        "created_at": _now(),
        "attempt": sample.attempt,
        **checked.columns(),
        "content_hash": sample.content_hash,
        "settings": settings,
        "family": renderer.family.name if renderer.family is not None else UNKNOWN,
    }


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

    Validate it first (``regen.native.validate_native``); this only checks the lengths.
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
    }


def upgrade_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row dict from before :data:`ADDED_COLUMNS` with them filled in: attempt 0 and its
    turn checked now (:func:`regen.quality.check_row`; native rows not checked). Rows that have
    them come back as they are. A row without the :data:`PROVENANCE_COLUMNS` or the
    :data:`ANSWER_COLUMNS` gets nulls (unknown)."""
    nullable = (*PROVENANCE_COLUMNS.names, *ANSWER_COLUMNS.names, *FAMILY_COLUMNS.names)
    if all(name in row for name in ADDED_COLUMNS.names) and all(name in row for name in nullable):
        return row
    out = dict(row)
    for name in nullable:
        out.setdefault(name, None)
    if all(name in row for name in ADDED_COLUMNS.names):
        return out
    out.setdefault("attempt", 0)
    if any(name not in row for name in QUALITY_COLUMNS.names):
        out.update(check_row(row).columns())
    return out


def rows_to_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Rows as a table of :data:`SCHEMA` (rows from before the added columns upgraded, see
    :func:`upgrade_row`); a row with missing or unknown keys is refused."""
    want = set(COLUMNS)
    rows = [upgrade_row(r) for r in rows]
    for i, row in enumerate(rows):
        keys = set(row)
        if keys != want:
            missing, extra = sorted(want - keys), sorted(keys - want)
            raise RowError(
                "row_schema",
                f"row {i} ({row.get('sample_id')!r}): missing {missing}, unknown {extra}",
            )
    try:
        return pa.Table.from_pylist(list(rows), schema=SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        raise RowError("row_schema", f"rows do not fit regen.rows.SCHEMA: {e}") from e


def token_check_counts(rows: Sequence[dict[str, Any]]) -> Counter[str]:
    """How many rows have each token_check value (mismatches are counted, never hidden)."""
    return Counter(r["token_check"] for r in rows if r.get("token_check") is not None)
