"""The schema of a training row: the columns of every Parquet part under ``RUN_DIR/parts/``.

Written by ``regen.store``, read by ``regen.export`` and the monitor; built by
:mod:`regen.engine.rows`; docs/format.md explains it for users; ``regen.store.layout`` owns the
files. Row dicts are JSON-native (they also travel as journal lines), one key per column:

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
finish_reason      string/null         ``stop``, ``length``, ``tool_calls``, ...; ``loop``: regen
                                       closed the stream, the answer looped; null: native
truncated          bool                finish_reason == "length"
text               string/null         the row as the target template's text (prompt
                                       + response); null for native rows (no
                                       tokenizer at hand)
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
cut_saved          int32/null          a turn regen cut because it looped while it streamed
                                       (``finish_reason`` ``loop``, regen.quality.loop): the
                                       tokens the cut spared the server (``max_tokens`` less
                                       the ``completion_tokens`` streamed, regen's own count:
                                       the usage chunk never came). Null for every other row
                                       and parts written before the column
=================  ==================  ========================================================

``attempt`` and the quality columns are the :data:`ADDED_COLUMNS`: a part written before them
lacks them and is still read (no flags, attempt 0); a row dict without them (a journal line of
such a session, folded on resume) gets them from :func:`upgrade_row` (its turn checked then).
Likewise the :data:`PROVENANCE_COLUMNS` (engine, engine_version, ended), the
:data:`ANSWER_COLUMNS` (content_hash, settings) and the :data:`FAMILY_COLUMNS` (family): a
part written before them lacks them (read as null), and :func:`upgrade_row` gives a row dict
without them nulls; and the :data:`LOOP_COLUMNS` (cut_saved) the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import pyarrow as pa

from regen.core.errors import RowError
from regen.core.jsontext import JsonValue
from regen.quality import COLUMNS as QUALITY_COLUMNS
from regen.quality import check_row

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
#: columns a part written before issue 43 lacks (nullable; see the module docstring)
LOOP_COLUMNS: pa.Schema = pa.schema([pa.field("cut_saved", pa.int32())])
#: the column groups added after the first schema: a part may lack each group as a whole
LATER_COLUMNS: tuple[pa.Schema, ...] = (
    ADDED_COLUMNS, PROVENANCE_COLUMNS, ANSWER_COLUMNS, FAMILY_COLUMNS, LOOP_COLUMNS,
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
        *LOOP_COLUMNS,
    ]
)
COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)
#: one row dict: a value for each of :data:`COLUMNS`, JSON-native (module docstring)
Row: TypeAlias = dict[str, JsonValue]
TOKEN_SOURCES = ("server", "local", "native")


def upgrade_row(row: Row) -> Row:
    """A row dict from before :data:`ADDED_COLUMNS` with them filled in: attempt 0 and its
    turn checked now (:func:`regen.quality.check_row`; native rows not checked). Rows that have
    them come back as they are. A row without the :data:`PROVENANCE_COLUMNS` or the
    :data:`ANSWER_COLUMNS` gets nulls (unknown)."""
    nullable = (
        *PROVENANCE_COLUMNS.names, *ANSWER_COLUMNS.names, *FAMILY_COLUMNS.names,
        *LOOP_COLUMNS.names,
    )  # fmt: skip
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


def rows_to_table(rows: Sequence[Row]) -> pa.Table:
    """Rows as a table of :data:`SCHEMA` (rows from before the added columns upgraded, see
    :func:`upgrade_row`); a row with missing or unknown keys is refused."""
    want = set(COLUMNS)
    upgraded = [upgrade_row(r) for r in rows]
    for i, row in enumerate(upgraded):
        keys = set(row)
        if keys != want:
            missing, extra = sorted(want - keys), sorted(keys - want)
            raise RowError(
                "row_schema",
                f"row {i} ({row.get('sample_id')!r}): missing {missing}, unknown {extra}",
            )
    try:
        return pa.Table.from_pylist(upgraded, schema=SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        raise RowError("row_schema", f"rows do not fit regen.store.schema.SCHEMA: {e}") from e
