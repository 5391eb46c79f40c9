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
from typing import Any

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
    source_totals,
)
from regen.store.rundir import RunDir

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
        return SourceCounts(**dict(zip(SCALAR_COUNTS, self.counts, strict=True)),
                            flags=dict(self.flags))  # fmt: skip

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

    def __contains__(self, sample_id: object) -> bool:
        return sample_id in self.ids

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, source: str, sample_id: str, rows: Iterable[dict[str, Any]]) -> None:
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
            old = self.flagged.pop(sample_id, None)
            added = counts.model_copy(deep=True)
            added.retried += 1
            if old is not None:
                added.add(old.to_counts(), -1)
            else:  # not a flagged answer: a --retry-flagged run never replaces one
                log.warning("%s: attempt %d replaces an unflagged answer", sample_id, attempt)
                added.done -= 1
        self.ids.add(sample_id)
        if attempt:
            self.attempts[sample_id] = attempt
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
        st.record is None or any(c.retried for c in st.record.sources.values())
        for st in states
        if not st.record_problem
    )

    def check(st: PartState) -> tuple[str, list[str] | None]:
        if st.record_problem:
            return st.record_problem, None
        if answers:
            return inspect_part(rd, st), None
        return part_ids(rd, st)

    # reading and hashing release the GIL: parts are checked side by side, counted in order
    done.answers = answers
    with ThreadPoolExecutor(PART_READERS, thread_name_prefix="regen-parts") as ex:
        for st, (problem, ids) in zip(states, ex.map(check, states), strict=True):
            st.problem = problem
            if not problem and ids is not None:
                if done.ids.isdisjoint(ids):  # first answers: counters from the record
                    assert st.record is not None
                    done.ids.update(ids)
                    for source, c in st.record.sources.items():
                        done.sources.setdefault(source, SourceCounts()).add(c)
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
            fold_part(done, st, rd if repair else None)
    return done


#: threads that check parts at once when the done-set is read
PART_READERS = min(8, os.cpu_count() or 1)


def fold_part(done: DoneSet, st: PartState, repair_into: RunDir | None = None) -> None:
    """Count an intact, inspected part into ``done``; a part without a record gets one made
    from what it added (written when ``repair_into`` is given)."""
    added: dict[str, SourceCountsKey] = {}
    for sid, (source, c) in st.samples.items():
        net = done.add_answer(source, sid, st.attempts.get(sid, 0), c)
        if net is not None:
            added[sid] = (source, net)
    done.parts += 1
    if st.record is None and st.size is not None:
        st.record = PartRecord(stem=st.stem, rows=st.rows, samples=len(st.samples),
                               bytes=st.size, sha256=st.sha256,
                               sources=source_totals(added.values()))  # fmt: skip
        if repair_into is not None:
            layout.part_record_file(st.stem).write(repair_into, st.record)
            log.info("%s: wrote its missing record %s", st.part, layout.part_record_path(st.stem))
