"""Export a run directory's rows for SpecForge: the stage, reading its settings whole
(:class:`regen.export.settings.ExportSettings`) and returning its stats
(:class:`regen.store.layout.ExportStats`, written as ``OUT/stats.json``).

First the cheap check of the run directory (:func:`regen.store.verify.refuse_damaged`: each
part's footer against its record; skipped with ``check=False`` by a caller that ran it on the
same handle, ``regen train``); a damaged directory is refused with one line pointing to
``regen verify --repair``. Then reads every Parquet part of the run directory (schema
``regen.store.schema.SCHEMA``; names in :mod:`regen.store.layout`) through its pyarrow
filesystem, and writes to ``OUT`` (local path or pyarrow URI; file names from the layout
too)::

    OUT/
      shard-00000.jsonl ...        fmt="pretokenized": one {"input_ids": [...], "loss_mask": [...]}
                                   per line (compact JSON), SpecForge's ``data.prompts_path``
      conversations-00000.jsonl    fmt="conversations": {"id", "conversations": [...], "tools"?}
                                   per line, SpecForge's ``data.train_data_path``
      stats.json                   what was kept and dropped, rows and tokens per source
      holdout.jsonl                with ``holdout`` N > 0: the held-out samples' prompts for
                                   ``regen bench`` (regen.store.holdout format); removed by
                                   an export without a holdout

Rules, in this order: only each sample's latest answer counts (rows of an earlier attempt,
kept in the run directory when ``regen run --retry-flagged`` or a changed source row answered
the sample again, are dropped as ``superseded``); only the samples of the latest plan count,
each with the content it planned (regen.store.stale: the rows of a sample the plan no longer
holds are dropped as ``not_planned``, those whose ``content_hash`` is not the planned one as
``stale``: both answer a source row that was edited or left the plan); with ``setting`` ID,
only the rows that settings id made (the ``settings`` column; ``regen run --force`` can mix
settings) and native rows (no setting makes them) count, the others are dropped as
``other_setting``; rows are deduplicated by (sample_id, turn, attempt) (first in
part-name order wins); every row of a held-out sample is dropped (below); rows carrying a
quality flag of ``drop_flags`` are dropped as ``flagged`` (default
:data:`regen.quality.DEFAULT_DROP_FLAGS`; stats.json counts rows, tokens and loss tokens per
flag, a row with two such flags under each; ``collapsed`` is not stored in rows but decided
here when ``drop_flags`` holds it: :func:`regen.export.select.collapsed_rows` compares the
latest answers' text and flags those many distinct prompts of a source share); a locally rendered
row whose ``token_check`` cannot show it is the model's tokens (not ``count_match``: a rebuilt
tool call, a count that differs or is unknown, a guessed ``</think>``) is dropped as
``unproven_tokens`` unless ``keep_unproven`` (server-id rows always are the model's tokens);
then truncated rows (finish_reason "length") are dropped unless kept, rows longer than
``max_length`` tokens are dropped (never cut: a cut row would change its mask), rows without
a single loss token are dropped (SpecForge would skip them silently). Parts written before
the attempt and quality columns read as attempt 0 without flags.

``only_flagged`` inverts the flag rule for inspection: only the latest answers' rows carrying a
flag of ``drop_flags`` are written (nothing else is dropped), and the conversations variant
writes one record per such row (not per sample), with its ``turn``, ``attempt`` and
``quality_flags`` (``collapsed`` added to those of a collapsed row). Dropped rows always stay
in the run directory. The kept rows are sorted by (sample_id, turn) and shuffled with
``random.Random(seed)``, so the output depends only on the rows and the seed, never on part
order. Shards are consecutive slices of that one order:
concatenating them in name order gives the single file SpecForge 0.2.0 reads
(``data.prompts_path`` is one path); ``shard_rows=0`` writes one shard. Native rows come out
byte-identical to their input ids and mask. Earlier shards of the same format in OUT are removed.

Memory stays bounded at any run size: only the key columns (sample id, turn, source, lengths,
flags) of all rows are held to decide dedup, drops and order; the heavy columns are then read
one Parquet row group at a time and each kept row's JSON line is spilled to a local temporary
bucket file by its output position (``WINDOW_ROWS`` positions per bucket), and the shards are
written bucket by bucket through an output stream (temp name, then rename). Each part is read
twice (keys, then data) and nothing else (with a holdout, the row groups holding the held-out
first turns once more, for their messages; with ``collapsed`` in ``drop_flags``, the row groups
holding the latest answers of a source with at least ``quality.collapse_min_prompts`` of them
once more, for their reasoning, content and tool calls only: about 16 bytes per row, plus
~0.5 KB per distinct long answer, are held for the check).

**Held-out samples** (``holdout`` N): per source, the N samples with the smallest
:func:`holdout_rank` (a sha256 of the seed and the sample id: the same samples on every machine
and every re-export of the same rows, whatever their order) are kept out of the shards, all
their turns. Each becomes one line of ``holdout.jsonl``: the request of its first regenerated
turn exactly as the run sent it (system prompt, user message, tools; for a sample whose first
regenerated turn is a later one, the dataset's history before it). Later turns are not sent
to the bench: their history holds this target's own earlier answers, and one prompt per sample
keeps every sample's weight in its source's acceptance equal (a sample answered more than once
is held out by its latest answer's rows). Native sources (pre-tokenized
rows, no messages to send) are not held out; a source keeps at least half of its samples for
training (a warning says when that cuts its holdout below N).

The conversations variant has one record per sample (its highest kept turn): the request
messages of that turn plus the regenerated assistant message, with ``reasoning_content`` on
assistant messages (SpecForge's thinking parser reads it; its default parser keeps only role,
content and tool_calls, and its template route drops history reasoning and inserts its own
default system prompt, so prefer the pre-tokenized export). Native rows cannot be expressed as
conversations and are counted as ``not_convertible``.
"""

from __future__ import annotations

import json
import logging
import random
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from regen.export.holdout import choose_holdout, write_holdout
from regen.export.select import (
    ANSWER_TEXT_COLUMNS,
    Part,
    check_drop_share,
    check_setting,
    collapse_candidates,
    collapsed_rows,
    current_plan,
    latest_attempts,
    not_current,
    read_keys,
    select_rows,
)
from regen.export.settings import ExportSettings
from regen.export.write import ordered_lines, read_rows, remove_old_shards
from regen.quality.collapse import FLAG as COLLAPSED
from regen.store import layout
from regen.store.layout import ExportStats
from regen.store.rundir import RunDir
from regen.store.verify import refuse_damaged

log = logging.getLogger(__name__)


def export_run(
    rd: RunDir, out: str, settings: ExportSettings | None = None, *, check: bool = True
) -> ExportStats:
    """Export every row of the run directory ``rd`` to ``out`` with ``settings`` (their
    defaults when None; see the module docstring). ``check``: run the cheap damage check first
    (False: the caller ran it on the same handle)."""
    s = settings if settings is not None else ExportSettings()
    rd.require()
    if check:
        refuse_damaged(rd, "export")
    planned = current_plan(rd)
    if s.setting is not None:
        check_setting(rd, s.setting)
    stats = ExportStats.of(rd.uri, str(out), s)
    chosen = _choose(rd, s, stats, planned)
    if s.max_drop_share is not None and not s.only_flagged:
        check_drop_share(stats, s.max_drop_share)
    _write_shards(rd, RunDir.open(out, create=True), chosen, s, stats)
    _log_export(stats, out)
    return stats


@dataclass(slots=True, frozen=True)
class _Chosen:
    """What an export writes: the rows in their output order, and what it holds out."""

    parts: list[Part]
    table: pa.Table  #: the key columns of every row (regen.export.select.read_keys)
    order: list[int]  #: the rows written, in output order
    #: per source, the held-out samples and the row of each one's first turn (choose_holdout)
    held: dict[str, dict[str, int]]
    collapsed: set[int]  #: the rows whose answer collapsed (the ``collapsed`` flag)


def _choose(rd: RunDir, s: ExportSettings, stats: ExportStats, planned: pa.Table | None) -> _Chosen:
    """The rows to write (the drop rules of regen.export.select, counted in ``stats``), sorted
    by (sample_id, turn) and shuffled with the seed, and the samples held out."""
    parts, table = read_keys(rd, s.format, stats)
    latest = latest_attempts(table)
    why_not = not_current(table, planned, s.setting)
    # --only-flagged lists what the export drops: nothing is held out of that listing
    held = {} if s.only_flagged else choose_holdout(table, s.holdout, s.seed, latest, why_not)
    collapsed: set[int] = set()
    if COLLAPSED in s.drop_flags:  # the answers' text: one more read of their row groups
        wanted = collapse_candidates(table, latest, why_not, s.quality.collapse_min_prompts)
        if wanted:
            answers = read_rows(rd, parts, wanted, ANSWER_TEXT_COLUMNS)
            collapsed = collapsed_rows(answers, table, s.quality, rd.uri)
    order = select_rows(
        table,
        s,
        stats,
        held={sid for first in held.values() for sid in first},
        latest=latest,
        why_not=why_not,
        collapsed=collapsed,
    )
    sids, turns = table.column("sample_id").to_pylist(), table.column("turn").to_pylist()
    order.sort(key=lambda i: (sids[i], turns[i]))
    random.Random(s.seed).shuffle(order)
    return _Chosen(parts, table, order, held, collapsed)


def _write_shards(
    rd: RunDir, dest: RunDir, chosen: _Chosen, s: ExportSettings, stats: ExportStats
) -> None:
    """The shards of ``chosen`` into ``dest`` (earlier shards of the format removed), then
    holdout.jsonl and stats.json."""
    remove_old_shards(dest, s.format)
    order, ntok = chosen.order, chosen.table.column("num_tokens").to_pylist()
    size = s.shard_rows or max(len(order), 1)
    flag_collapsed = s.only_flagged and s.format == "conversations"
    with tempfile.TemporaryDirectory(prefix="regen-export-") as spill:
        lines = ordered_lines(rd, chosen.parts, order, s.format, Path(spill),
                              inspect=s.only_flagged)  # fmt: skip
        for n, start in enumerate(range(0, len(order), size)):
            rows = order[start : start + size]
            name = layout.shard_name(s.format, n)
            with dest.atomic_writer(name) as f:
                for i in rows:
                    line = next(lines)
                    if flag_collapsed and i in chosen.collapsed:
                        line = _with_flag(line, COLLAPSED)
                    f.write((line + "\n").encode("utf-8"))
            tokens = sum(ntok[i] for i in rows)
            stats.shards.append({"file": name, "rows": len(rows), "tokens": tokens})
    write_holdout(rd, dest, chosen.parts, chosen.held, stats)
    stats.created_at = datetime.now(UTC).isoformat(timespec="seconds")
    layout.EXPORT_STATS_FILE.write(dest, stats)


def _log_export(stats: ExportStats, out: str) -> None:
    """What was written; a warning when the rows mix settings ids."""
    log.info(
        "exported %d of %d rows (%d tokens, mask coverage %.3f) to %s in %d shard(s)",
        stats.rows_written,
        stats.rows_read,
        stats.tokens,
        stats.mask_coverage,
        out,
        len(stats.shards),
    )
    made = [k for k in stats.settings if k not in ("native", "unknown")]
    if len(made) > 1:
        log.warning("the written rows mix %d settings (regen run --force): %s; keep one with "
                    "--setting ID", len(made), ", ".join(f"{k} {stats.settings[k]:,} rows"
                                                         for k in made))  # fmt: skip


def _with_flag(line: str, flag: str) -> str:
    """An inspection record (one JSON line) with ``flag`` added to its ``quality_flags``: a
    flag decided at export is in no stored row."""
    rec = json.loads(line)
    rec["quality_flags"] = [*(rec.get("quality_flags") or []), flag]
    return json.dumps(rec, ensure_ascii=False, separators=(",", ":"))
