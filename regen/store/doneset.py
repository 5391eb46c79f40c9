"""The done-set: which samples are stored, read from the intact parts. Owns no files.

A sample is done when its ``sample_id`` appears in an intact part (:mod:`regen.store.parts`).
On resume every part is checked against its record (size, sha256 of its bytes, row count); a
damaged, unreadable or missing part is reported in one warning and quarantined, and its
samples are requested again (:func:`read_done`). A sample's answer is the rows of its highest
attempt (0 for its first, n for the n-th new attempt of ``regen run --retry-flagged``); the
counters of a new attempt are the difference from the answer it replaces, recomputed here
from the parts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from regen.store import layout
from regen.store.counts import SCALAR_COUNTS, SourceCounts, count_rows
from regen.store.layout import PartRecord
from regen.store.parts import (
    PartState,
    SourceCountsKey,
    damage_message,
    inspect_part,
    list_parts,
    part_ids,
    quarantine,
    rows_attempt,
    set_aside_record,
    source_totals,
)
from regen.store.rundir import RunDir
from regen.store.schema import Row

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class FlaggedAnswer:
    """The latest answer of a sample when it carries quality flags (a --retry-flagged
    candidate), with its counters (compact: one per flagged sample is held)."""

    source: str
    attempt: int
    counts: tuple[int, ...]  #: SCALAR_COUNTS values
    flags: tuple[tuple[str, int], ...]  #: rows per flag

    @classmethod
    def of(cls, source: str, attempt: int, c: SourceCounts) -> FlaggedAnswer:
        return cls(source, attempt, tuple(getattr(c, n) for n in SCALAR_COUNTS),
                   tuple(sorted(c.flags.items())))  # fmt: skip

    def to_counts(self) -> SourceCounts:
        values: dict[str, object] = dict(zip(SCALAR_COUNTS, self.counts, strict=True))
        return SourceCounts.model_validate({**values, "flags": dict(self.flags)})

    @property
    def flag_names(self) -> frozenset[str]:
        return frozenset(f for f, n in self.flags if n > 0)


@dataclass(slots=True)
class DoneSet:
    """Sample ids stored in intact parts, with per-source totals of their latest answers."""

    ids: set[str] = field(default_factory=set)
    sources: dict[str, SourceCounts] = field(default_factory=dict)
    parts: int = 0
    #: parts found damaged or missing (and quarantined when reading for a run)
    damaged: list[str] = field(default_factory=list)
    #: the latest attempt of every sample answered more than once (others: 0)
    attempts: dict[str, int] = field(default_factory=dict)
    #: samples whose latest answer carries a quality flag
    flagged: dict[str, FlaggedAnswer] = field(default_factory=dict)
    #: answers found that an intact part already replaced, or stored twice (not counted)
    stale: int = 0
    #: every part's rows were read: ``attempts`` and ``flagged`` are known (read_done(answers))
    answers: bool = True
    #: (sample_id, content_hash) of the counted answers, in the order they were counted (a
    #: later attempt after the answer it replaces): :meth:`answer_hashes`
    keys: list[pa.Table] = field(default_factory=list)
    #: records rebuilt from their parts (missing, or damaged and moved to quarantine/)
    records_rebuilt: list[str] = field(default_factory=list)
    #: samples a later part answers again (:func:`replaced_samples`): the counters of their
    #: answers are kept in ``kept`` until replaced, so a new attempt counts as the difference
    replaceable: set[str] = field(default_factory=set)
    kept: dict[str, SourceCounts] = field(default_factory=dict)

    def __contains__(self, sample_id: object) -> bool:
        return sample_id in self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def answer_hashes(self) -> pa.Table:
        """``(sample_id, content_hash)`` of every done sample's latest answer (content_hash
        null: its rows were written before the column)."""
        if not self.keys:
            return pa.table({"sample_id": pa.array([], pa.string()),
                             "content_hash": pa.array([], pa.string())})  # fmt: skip
        table = pa.concat_tables(self.keys)
        last = pc.ScalarAggregateOptions(skip_nulls=False)
        out = table.group_by("sample_id", use_threads=False).aggregate(
            [("content_hash", "last", last)]
        )
        return out.rename_columns(["sample_id", "content_hash"])

    def add(self, source: str, sample_id: str, rows: Iterable[Row]) -> None:
        """Count one stored answer of a sample (its rows)."""
        rows = list(rows)
        self.add_answer(source, sample_id, rows_attempt(rows), count_rows(rows))

    def add_answer(
        self, source: str, sample_id: str, attempt: int, counts: SourceCounts
    ) -> SourceCounts | None:
        """Count one stored answer (``counts``: its rows' own, done 1): the first answer of a
        sample, or a later attempt that replaces the latest one so far. Returns what it added
        to the totals (a later attempt: the difference), or None when it changes nothing (an
        older or repeated attempt)."""
        added = counts
        if sample_id in self.ids:
            if attempt <= self.attempts.get(sample_id, 0):
                self.stale += 1
                return None
            flagged = self.flagged.pop(sample_id, None)
            old = self.kept.pop(sample_id, None)
            if old is None and flagged is not None:
                old = flagged.to_counts()
            added = counts.model_copy(deep=True)
            added.retried += 1
            if old is not None:
                added.add(old, -1)
            else:  # its answer's counters were not kept (read_done keeps them): done only
                log.warning("%s: attempt %d replaces an answer not counted here", sample_id,
                            attempt)  # fmt: skip
                added.done -= 1
        self.ids.add(sample_id)
        if attempt:
            self.attempts[sample_id] = attempt
        if sample_id in self.replaceable:
            self.kept[sample_id] = counts
        if counts.flagged:
            self.flagged[sample_id] = FlaggedAnswer.of(source, attempt, counts)
        self.sources.setdefault(source, SourceCounts()).add(added)
        return added


def read_done(rd: RunDir, *, repair: bool = False, answers: bool = False) -> DoneSet:
    """The done-set: every ``sample_id`` of the intact parts, with per-source counters of
    their latest answers (parts in name order, which is the order they were written).

    Every part is checked: a part with a record by its bytes (size, sha256) and its ids
    (:func:`part_ids`; its counters are the record's), or by reading its counter columns
    (:func:`inspect_part`) when it has no record, when a part of the run holds new attempts, or
    with ``answers`` (the flagged answers a ``--retry-flagged`` session selects from are
    then known: :attr:`DoneSet.flagged`). A damaged or missing part counts nothing and
    is named in one warning; with ``repair`` (a run resuming) it is moved to quarantine/ with
    its record, and an intact part without a record gets one.
    """
    done = DoneSet()
    states = list_parts(rd)
    # ids alone (the record's counters) tell a part of first answers; which samples are flagged
    # and which attempt replaces which need every part's rows: read them when asked
    # (``answers``) or when a part may hold new attempts (or has no record to say)
    answers = answers or any(
        st.record is None or any(c.retried for c in st.record.sources.values()) for st in states
    )

    def check(st: PartState) -> tuple[str, list[str] | None, pa.Table | None]:
        if answers or st.record is None:  # no record (or one that does not parse): read whole
            return inspect_part(rd, st), None, None
        return part_ids(rd, st)

    # reading and hashing release the GIL: parts are checked side by side, counted in order
    done.answers = answers
    with ThreadPoolExecutor(PART_READERS, thread_name_prefix="regen-parts") as ex:
        results = list(ex.map(check, states))
    done.replaceable = replaced_samples(states)
    for st, (problem, ids, keys) in zip(states, results, strict=True):
        st.problem = problem
        if not problem and ids is not None:
            if done.ids.isdisjoint(ids):  # first answers: counters from the record
                assert st.record is not None
                done.ids.update(ids)
                for source, c in st.record.sources.items():
                    done.sources.setdefault(source, SourceCounts()).add(c)
                if keys is not None:
                    done.keys.append(keys)
                done.parts += 1
                continue
            st.problem = inspect_part(rd, st)  # a sample stored twice: count it once
        if st.problem:
            done.damaged.append(damage_message(st))
            log.warning("%s: %s", rd.uri, done.damaged[-1])
            if repair:
                moved = quarantine(rd, st)
                if moved:
                    log.info("moved to %s", ", ".join(moved))
            continue
        if st.record_problem:
            log.warning("%s: %s; the part reads cleanly by itself: %s", rd.uri,
                        st.record_problem, "its record is rebuilt" if repair else
                        "`regen verify --repair` rebuilds its record")  # fmt: skip
        fold_part(done, st, rd if repair else None)
    return done


#: threads that check parts at once when the done-set is read
PART_READERS = min(8, os.cpu_count() or 1)


def replaced_samples(states: Iterable[PartState]) -> set[str]:
    """The samples an inspected part holds a new attempt of (their earlier answers are
    replaced: their counters are needed when the new attempt is counted)."""
    out: set[str] = set()
    for st in states:
        out.update(st.attempts)
    return out


def fold_part(done: DoneSet, st: PartState, repair_into: RunDir | None = None) -> None:
    """Count an intact, inspected part into ``done``; a part without a record gets one made
    from what it added (written when ``repair_into`` is given)."""
    added: dict[str, SourceCountsKey] = {}
    for sid, (source, c) in st.samples.items():
        net = done.add_answer(source, sid, st.attempts.get(sid, 0), c)
        if net is not None:
            added[sid] = (source, net)
    if added:
        done.keys.append(pa.table({
            "sample_id": pa.array(list(added), pa.string()),
            "content_hash": pa.array([st.hashes.get(sid) for sid in added], pa.string()),
        }))  # fmt: skip
    done.parts += 1
    if st.record is None and st.size is not None:
        st.record = PartRecord(stem=st.stem, rows=st.rows, samples=len(st.samples),
                               bytes=st.size, sha256=st.sha256,
                               sources=source_totals(added.values()))  # fmt: skip
        if repair_into is not None:
            if st.record_problem:
                moved = set_aside_record(repair_into, st)
                log.info("%s: its damaged record moved to %s", st.part, moved)
            layout.part_record_file(st.stem).write(repair_into, st.record)
            done.records_rebuilt.append(layout.part_record_path(st.stem))
            log.info("%s: wrote its record %s", st.part, layout.part_record_path(st.stem))
