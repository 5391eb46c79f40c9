"""Which rows an export writes: the latest plan, the settings id, the rows' keys, the answers
that collapsed (:func:`collapsed_rows`: one answer given to many prompts of a source, the
``collapsed`` flag, decided here across rows, from the answers' text regen.export.run reads),
and the drop rules in their order (:func:`select_rows`; regen.export.run's docstring lists
them), with the stats of what was read, kept and dropped. Reads the run directory's parts
(their key columns); owns no files.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from regen.core.errors import ConfigError, RunDirError
from regen.export.settings import DATA_COLUMNS, ExportSettings
from regen.manifest import Dedup
from regen.quality.collapse import FLAG as COLLAPSED
from regen.quality.collapse import (
    NUM_PERM,
    SHINGLE,
    CollapseFinder,
    NearIndex,
    answer_text,
    prompt_key,
)
from regen.quality.config import QualityConfig
from regen.store import layout
from regen.store.layout import ExportFormat, ExportStats, FlagStats, SourceExportStats
from regen.store.planned import recorded_plan
from regen.store.rundir import RunDir
from regen.store.schema import ADDED_COLUMNS, ANSWER_COLUMNS, SCHEMA

log = logging.getLogger(__name__)


#: token_check values that are not a problem (regen.engine.rows); every other value is counted as
#: one
TOKEN_CHECKS_OK = frozenset({"match", "count_match", "server_only"})


#: the drop reason of a locally rendered row whose token_check is not in TOKEN_CHECKS_OK: its
#: tokens cannot be shown to be the ones the model produced (a server-id row always is)
UNPROVEN = "unproven_tokens"


#: drop reasons that lose no training data: another attempt or copy of the row is kept, or the
#: bench keeps the sample; every other reason counts towards :func:`drop_share`
KEPT_ELSEWHERE = frozenset({"superseded", "duplicate", "holdout"})


KEY_COLUMNS = (
    "sample_id",
    "source",
    "turn",
    "truncated",
    "num_tokens",
    "loss_tokens",
    "token_source",
    "token_check",
    "attempt",
    "quality_flags",
    "content_hash",
    "settings",
)


@dataclass(slots=True)
class Part:
    """One Parquet part: where its rows start in the global row numbering, its row groups."""

    name: str
    path: str
    start: int
    group_rows: list[int]


def drop_share(dropped: dict[str, int], rows_read: int) -> float:
    """Share of the rows an export could train on that it dropped (reasons of
    :data:`KEPT_ELSEWHERE` are neither)."""
    elsewhere = sum(n for reason, n in dropped.items() if reason in KEPT_ELSEWHERE)
    lost = sum(n for reason, n in dropped.items() if reason not in KEPT_ELSEWHERE)
    candidates = rows_read - elsewhere
    return lost / candidates if candidates > 0 else 0.0


def check_drop_share(stats: ExportStats, max_share: float) -> None:
    """ConfigError (one line: the share, the reasons, how to go on) when the export dropped
    more than ``max_share`` of the rows it could train on."""
    dropped = dict(stats.dropped)
    share = drop_share(dropped, stats.rows_read)
    if share <= max_share:
        return
    lost = {k: v for k, v in dropped.items() if k not in KEPT_ELSEWHERE}
    reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(lost.items(), key=lambda kv: -kv[1]))
    raise ConfigError(
        f"the export of {stats.run_dir} drops {sum(lost.values()):,} of the rows it could "
        f"train on ({share:.0%} > {max_share:.0%}: {reasons}); look at them with `regen export "
        "--only-flagged --format conversations`, or accept it with --allow-drops "
        "(export.max_drop_share)",
        field="export.max_drop_share",
    )


def current_plan(rd: RunDir) -> pa.Table | None:
    """The latest plan (regen.store.planned.recorded_plan); None with a warning when the run
    directory has none (stale answers cannot be told apart then); a damaged one is refused."""
    planned, why = recorded_plan(rd)
    if why:
        raise RunDirError(
            f"{rd.uri} is damaged, export refused: {why}; run `regen verify {rd.uri} --repair` "
            "(it rebuilds the plan index from the sources)"
        )
    if planned is None:
        log.warning("%s has no plan index (%s): answers of source rows edited since cannot be "
                    "told apart; `regen verify --repair` writes it", rd.uri,
                    layout.PLAN_INDEX)  # fmt: skip
    return planned


def check_setting(rd: RunDir, setting: str) -> None:
    """``setting`` is a settings id of the run (run.json ``settings``), else ConfigError."""
    run = layout.RUN_FILE.read(rd)
    known = sorted(run.settings) if run is not None else []
    if setting not in known:
        have = ", ".join(known) or "none recorded"
        raise ConfigError(
            f"--setting {setting!r} is not a settings id of {rd.uri} (it has: {have}; "
            "`regen status` shows each one's rows)",
            field="setting",
        )


def not_current(table: pa.Table, planned: pa.Table | None, setting: str | None) -> list[str]:
    """Per row, why it does not count ("" when it does): ``not_planned`` and ``stale`` against
    the recorded plan, ``other_setting`` against ``setting`` (module docstring)."""
    n = table.num_rows
    out = [""] * n
    if planned is not None and n:
        ids = table.column("sample_id")
        idx = pc.index_in(ids, value_set=planned.column("id"))
        want = planned.column("content_hash").take(pc.fill_null(idx, 0)) if len(planned) else None
        have = table.column("content_hash").to_pylist()
        pos = idx.to_pylist()
        wanted = want.to_pylist() if want is not None else []
        for i in range(n):
            if pos[i] is None:
                out[i] = "not_planned"
            elif have[i] is not None and have[i] != wanted[i]:
                out[i] = "stale"
    if setting is not None:
        made = table.column("settings").to_pylist()
        kinds = table.column("token_source").to_pylist()
        for i in range(n):
            if not out[i] and made[i] != setting and kinds[i] != "native":
                out[i] = "other_setting"
    return out


def read_keys(rd: RunDir, fmt: ExportFormat, stats: ExportStats) -> tuple[list[Part], pa.Table]:
    """The parts (name order) and the key columns of all their rows, concatenated."""
    names = [n for n in rd.list(layout.PARTS_DIR) if layout.part_stem(n) is not None]
    needed = set(KEY_COLUMNS + DATA_COLUMNS[fmt]) - {*ADDED_COLUMNS.names,
                                                       *ANSWER_COLUMNS.names}  # fmt: skip
    parts: list[Part] = []
    tables = []
    start = 0
    for name in names:
        path = rd.path(f"{layout.PARTS_DIR}/{name}")
        try:
            with rd.fs.open_input_file(path) as f:
                pf = pq.ParquetFile(f)
                missing = sorted(needed - set(pf.schema_arrow.names))
                if missing:
                    raise RunDirError(f"{rd.uri}: part {name} lacks column(s) {missing}")
                groups = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
                have = [c for c in KEY_COLUMNS if c in pf.schema_arrow.names]
                tables.append(with_added_columns(pf.read(columns=have)))
        except (OSError, pa.ArrowInvalid) as e:
            raise RunDirError(f"{rd.uri}: cannot read part {name}: {e}") from e
        parts.append(Part(name, path, start, groups))
        start += tables[-1].num_rows
    stats.parts = len(tables)
    if not tables:
        log.warning("%s: no Parquet parts under %s/", rd.uri, layout.PARTS_DIR)
        return parts, _empty(list(KEY_COLUMNS))
    return parts, pa.concat_tables(tables, promote_options="permissive")


def latest_attempts(table: pa.Table) -> dict[str, int]:
    """The latest attempt of every sample answered more than once (others: 0)."""
    latest: dict[str, int] = {}
    sids = table.column("sample_id").to_pylist()
    for sid, a in zip(sids, table.column("attempt").to_pylist(), strict=True):
        if a and a > latest.get(sid, 0):
            latest[sid] = a
    return latest


def _empty(columns: list[str]) -> pa.Table:
    return SCHEMA.empty_table().select(columns)


def with_added_columns(table: pa.Table) -> pa.Table:
    """``table`` of a part written before ADDED_COLUMNS with the key ones filled in (attempt 0,
    no flags); other tables come back as they are."""
    if "attempt" not in table.column_names:
        table = table.append_column("attempt", pa.array([0] * table.num_rows, pa.int32()))
    if "quality_flags" not in table.column_names:
        empty = pa.array([[]] * table.num_rows, pa.list_(pa.string()))
        table = table.append_column("quality_flags", empty)
    for name in ANSWER_COLUMNS.names:  # unknown: null
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, pa.string()))
    return table


#: columns the collapse check reads of each answer (besides the key columns)
ANSWER_TEXT_COLUMNS = ["reasoning", "content", "tool_calls"]
#: collapsed groups named in the log per export
LOGGED_GROUPS = 5


def collapse_candidates(
    table: pa.Table,
    latest: dict[str, int],
    why_not: list[str] | None = None,
    min_prompts: int = 1,
) -> set[int]:
    """The rows the collapse check compares: each sample's latest answer, current
    (:func:`not_current`), regenerated (native rows have no answer text), the first copy of a
    (sample, turn, attempt), of a source with at least ``min_prompts`` such rows (a smaller one
    cannot collapse: its text is not read)."""
    sids = table.column("sample_id").to_pylist()
    sources = table.column("source").to_pylist()
    turns = table.column("turn").to_pylist()
    attempts = table.column("attempt").to_pylist()
    kinds = table.column("token_source").to_pylist()
    seen: set[tuple[str, int, int]] = set()
    out = []
    for i, sid in enumerate(sids):
        a = attempts[i] or 0
        if kinds[i] == "native" or a < latest.get(sid, 0) or (why_not is not None and why_not[i]):
            continue
        if (sid, turns[i], a) in seen:
            continue
        seen.add((sid, turns[i], a))
        out.append(i)
    per_source = Counter(sources[i] for i in out)
    return {i for i in out if per_source[sources[i]] >= min_prompts}


def collapse_finder(config: QualityConfig) -> CollapseFinder:
    """A :class:`CollapseFinder` with ``config``'s thresholds whose near matching is the
    prompts' (:class:`regen.sources.neardup.NearDuplicates`, one index per source)."""

    def near() -> NearIndex:
        from regen.sources.neardup import NearDuplicates  # numpy and rensa: only when used

        dedup = Dedup(threshold=config.collapse_similarity, shingle=SHINGLE, num_perm=NUM_PERM)
        return NearDuplicates(dedup)

    return CollapseFinder(config, near)


def collapsed_rows(
    answers: Iterable[tuple[list[int], pa.Table]],
    table: pa.Table,
    config: QualityConfig,
    where: str = "",
) -> set[int]:
    """The rows among ``answers`` (their numbers and :data:`ANSWER_TEXT_COLUMNS`, one row group
    at a time, in part order: the first answer of a near group leads it; regen.export.write.
    read_rows of :func:`collapse_candidates`) whose answer many distinct prompts of their
    source share (regen.quality.collapse, thresholds of ``config``). Logs the collapsed groups
    (``where``: the run directory)."""
    sids = table.column("sample_id").to_pylist()
    sources = table.column("source").to_pylist()
    turns = table.column("turn").to_pylist()
    hashes = table.column("content_hash").to_pylist()
    finder = collapse_finder(config)
    for found, rows in answers:
        cols = {c: rows.column(c).to_pylist() if c in rows.column_names else [None] * len(found)
                for c in ANSWER_TEXT_COLUMNS}  # fmt: skip
        for k, i in enumerate(found):
            text = answer_text(cols["reasoning"][k], cols["content"][k], cols["tool_calls"][k])
            finder.add(i, sources[i], prompt_key(hashes[i], sids[i], turns[i]), text)
    groups = finder.groups()
    out = finder.rows()
    if groups:
        log.warning(
            "%s: %d answer(s) given to %d or more distinct prompts of a source (%d rows, "
            "flagged %s): %s",
            where,
            len(groups),
            config.collapse_min_prompts,
            len(out),
            COLLAPSED,
            "; ".join(f"{g.source}: {g.prompts} prompts ({g.variants} variant(s)) {g.example!r}"
                      for g in groups[:LOGGED_GROUPS]),
        )  # fmt: skip
    return out


def select_rows(
    table: pa.Table,
    settings: ExportSettings,
    stats: ExportStats,
    *,
    held: AbstractSet[str] = frozenset(),
    latest: dict[str, int] | None = None,
    why_not: list[str] | None = None,
    collapsed: AbstractSet[int] = frozenset(),
) -> list[int]:
    """Indices of the rows to write (the rows of ``held`` samples left out); fills the
    read/drop/keep numbers of ``stats``. ``latest``: each sample's latest attempt
    (:func:`latest_attempts`); ``why_not``: per row, why it does not count
    (:func:`not_current`; "" when it does); ``collapsed``: rows that carry the ``collapsed``
    flag besides their own (:func:`collapsed_rows`)."""
    rows = _KeyRows.of(table)
    selection = _Selection(
        rows, settings, stats, held=held, collapsed=collapsed, why_not=why_not,
        latest=latest_attempts(table) if latest is None else latest,
    )  # fmt: skip
    keep = [i for i in range(len(rows.sids)) if selection.keeps(i)]
    if settings.format == "conversations" and not settings.only_flagged:
        keep = selection.highest_turns(keep)
    selection.count_kept(keep)
    return keep


@dataclass(slots=True, frozen=True)
class _KeyRows:
    """The key columns :func:`select_rows` decides by, one Python list per column."""

    sids: list[str]
    attempts: list[int | None]
    flags: list[list[str] | None]
    turns: list[int]
    sources: list[str]
    truncated: list[bool]
    ntok: list[int]
    nloss: list[int]
    kinds: list[str]
    checks: list[str | None]
    made: list[str | None]  #: the ``settings`` column

    @classmethod
    def of(cls, table: pa.Table) -> _KeyRows:
        def col(name: str) -> list[Any]:
            return list(table.column(name).to_pylist())

        return cls(
            col("sample_id"), col("attempt"), col("quality_flags"), col("turn"), col("source"),
            col("truncated"), col("num_tokens"), col("loss_tokens"), col("token_source"),
            col("token_check"), col("settings"),
        )  # fmt: skip


@dataclass(slots=True)
class _Selection:
    """The drop rules of one export applied row by row (regen.export.run's docstring has their
    order), counted in ``stats`` and per source as they go."""

    rows: _KeyRows
    settings: ExportSettings
    stats: ExportStats
    held: AbstractSet[str]
    collapsed: AbstractSet[int]
    why_not: list[str] | None
    latest: dict[str, int]
    dropped: Counter[str] = field(default_factory=Counter)
    per_source: defaultdict[str, SourceExportStats] = field(
        default_factory=lambda: defaultdict(SourceExportStats)
    )
    seen: set[tuple[str, int, int]] = field(default_factory=set)

    def keeps(self, i: int) -> bool:
        """Whether row ``i`` is written (counted as read, and as dropped with its reason)."""
        src = self.per_source[self.rows.sources[i]]
        src.rows_read += 1
        check = self.rows.checks[i]
        if check is not None:
            self.stats.token_check[check] = self.stats.token_check.get(check, 0) + 1
            if check not in TOKEN_CHECKS_OK:
                self.stats.token_check_problems += 1
        reason = self._reason(i, src)
        if reason is not None:
            self._drop(reason, src)
        return reason is None

    def _reason(self, i: int, src: SourceExportStats) -> str | None:
        """Why row ``i`` is dropped (None: it is kept): the rules in their order."""
        r, sid = self.rows, self.rows.sids[i]
        key = (sid, r.turns[i], r.attempts[i] or 0)
        flags = [*(r.flags[i] or ()), COLLAPSED] if i in self.collapsed else r.flags[i] or ()
        hit = [f for f in flags if f in self.settings.drop_flags]
        if key[2] < self.latest.get(sid, 0):
            return "superseded"
        if self.why_not is not None and self.why_not[i]:
            return self.why_not[i]
        if key in self.seen:
            return "duplicate"
        self.seen.add(key)
        if self.settings.only_flagged:
            if hit:
                _count_flags(self.stats, src, hit, r.ntok[i], r.nloss[i])
            return None if hit else "not_flagged"
        if r.truncated[i]:
            src.truncated_seen += 1
        if sid in self.held:
            return "holdout"
        if hit:
            _count_flags(self.stats, src, hit, r.ntok[i], r.nloss[i])
            return "flagged"
        return self._row_rule(i)

    def _row_rule(self, i: int) -> str | None:
        """The rules of the row itself: its tokens, its end, its length, its loss, its kind."""
        r, s = self.rows, self.settings
        if not s.keep_unproven and unproven(r.kinds[i], r.checks[i]):
            return UNPROVEN
        if r.truncated[i] and s.drop_truncated:
            return "truncated"
        if s.max_length is not None and r.ntok[i] > s.max_length:
            return "too_long"
        if not r.nloss[i]:
            return "no_loss_tokens"
        if s.format == "conversations" and r.kinds[i] == "native":
            return "not_convertible"
        return None

    def _drop(self, reason: str, src: SourceExportStats) -> None:
        self.dropped[reason] += 1
        src.dropped[reason] = src.dropped.get(reason, 0) + 1

    def highest_turns(self, keep: list[int]) -> list[int]:
        """Of ``keep``, each sample's highest turn (the conversations format: one record per
        sample); the others dropped as ``earlier_turn``."""
        sids, turns = self.rows.sids, self.rows.turns
        best: dict[str, int] = {}
        for i in keep:
            if sids[i] not in best or turns[i] > turns[best[sids[i]]]:
                best[sids[i]] = i
        chosen = set(best.values())
        for i in keep:
            if i not in chosen:
                self._drop("earlier_turn", self.per_source[self.rows.sources[i]])
        return [i for i in keep if i in chosen]

    def count_kept(self, keep: list[int]) -> None:
        """The written rows' numbers, per source and in all, and the drops into ``stats``."""
        r, stats = self.rows, self.stats
        for i in keep:
            src = self.per_source[r.sources[i]]
            src.rows += 1
            src.tokens += r.ntok[i]
            src.loss_tokens += r.nloss[i]
            stats.token_source[r.kinds[i]] = stats.token_source.get(r.kinds[i], 0) + 1
            which = r.made[i] or ("native" if r.kinds[i] == "native" else "unknown")
            stats.settings[which] = stats.settings.get(which, 0) + 1
        stats.rows_read = len(r.sids)
        stats.rows_written = len(keep)
        stats.tokens = sum(r.ntok[i] for i in keep)
        stats.loss_tokens = sum(r.nloss[i] for i in keep)
        stats.mask_coverage = coverage(stats.loss_tokens, stats.tokens)
        for src in self.per_source.values():
            src.mask_coverage = coverage(src.loss_tokens, src.tokens)
        stats.dropped = dict(sorted(self.dropped.items()))
        stats.sources = dict(sorted(self.per_source.items()))


def coverage(loss_tokens: int, tokens: int) -> float:
    """The share of loss tokens, as stats.json records it (6 digits)."""
    return round(loss_tokens / tokens, 6) if tokens else 0.0


def unproven(token_source: str, token_check: str | None) -> bool:
    """A locally rendered row whose token_check cannot show it is the model's tokens."""
    return token_source == "local" and token_check not in TOKEN_CHECKS_OK


def _count_flags(
    stats: ExportStats, src: SourceExportStats, flags: list[str], tokens: int, loss_tokens: int
) -> None:
    for f in flags:
        stats.flags.setdefault(f, FlagStats()).add(tokens, loss_tokens)
        src.flags.setdefault(f, FlagStats()).add(tokens, loss_tokens)
