"""Planning a session: which samples still need work, and ``plan.json``.

:func:`plan_session` takes the manifest's samples (its :class:`~regen.sources.SourceSet`:
filtered, deduplicated, limited) and splits them into work to regenerate, native rows to store
as they are, and samples already done or failed permanently. :func:`write_plan` records the
per-source totals as ``plan.json`` (:class:`regen.store.layout.PlanRecord`, written through
the layout's file), which the dashboard reads for its expected turns per sample; ``plan/`` is
the plan index's (:mod:`regen.store.planned`).

Where the samples come from: given the run directory, a valid plan index
(:mod:`regen.store.planned`) answers which samples exist and where their rows are; the
done-set and the failures then select the work (:func:`regen.plan.select.select`), and
only unfinished rows are read (JSONL ones when dispatched). Without a valid index the sources
are read (:func:`regen.plan.index.iter_planned`: adapters, filters, dedup,
near-duplicates, limits), the work's bodies are spilled (:class:`regen.plan.packed.PackedSample`),
and the index is written for the next session, with one line saying why it was (re)built.

New attempts (``regen run --retry-flagged``): ``redo`` maps done samples to the attempt number
to request (:func:`regen.plan.attempts.select`); :func:`plan_session` queues them like any
other work, marked with that attempt (:func:`regen.plan.attempts.as_attempt`). Their bodies
are done samples' rows, which the index does not keep at hand: such a session reads the
sources (an explicit, occasional command; the index stays as it is).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from regen.core.sample import Sample
from regen.manifest import Source
from regen.plan.attempts import as_attempt
from regen.plan.bodies import IndexBodies
from regen.plan.index import IndexBuilder, iter_planned
from regen.plan.packed import PackedSample, QueueItems, Spill
from regen.plan.select import select
from regen.sources import SourceSet
from regen.store import layout
from regen.store.failures import FailureRecord
from regen.store.layout import PlanEntry, PlanRecord
from regen.store.planned import PlanIndex, open_index
from regen.store.rundir import RunDir

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SessionPlan:
    """This session's work."""

    todo: QueueItems  #: to regenerate (iterating yields PackedSamples); bodies in ``spill``
    native: list[Sample]  #: native rows still to store
    totals: dict[str, tuple[int, bool]]  #: {source: (samples planned, regenerate)}
    skipped_failed: int  #: recorded permanent failures left out (no --retry-failed)
    #: where the work's bodies wait: a spill file, or the sources through the plan index
    spill: Spill | IndexBodies = field(default_factory=Spill)
    indexed: bool = False  #: the plan came from the plan index
    retries: dict[str, int] = field(default_factory=dict)  #: new attempts queued per source
    redo: set[str] = field(default_factory=set)  #: the samples queued as new attempts

    def record(self, session: str) -> PlanRecord:
        """``plan.json`` of this plan."""
        per = self.todo.per_source()
        todo_n = {k: n for k, (n, _) in per.items()}
        todo_turns = {k: t for k, (_, t) in per.items()}
        native: dict[str, int] = {}
        for s in self.native:
            native[s.source] = native.get(s.source, 0) + 1
        return PlanRecord(
            session=session,
            planned_at=time.time(),
            sources={
                name: PlanEntry(
                    total=t,
                    regenerate=r,
                    native=native.get(name, 0),
                    regenerate_todo=todo_n.get(name, 0),
                    regenerate_turns=todo_turns.get(name, 0),
                )
                for name, (t, r) in self.totals.items()
            },
        )


def plan_session(
    sources: SourceSet,
    done: set[str],
    failures: dict[str, FailureRecord],
    *,
    limit: int | None = None,
    retry_failed: bool = False,
    redo: dict[str, int] | None = None,
    rd: RunDir | None = None,
    opened: tuple[PlanIndex | None, str] | None = None,
    stale: frozenset[str] = frozenset(),
) -> SessionPlan:
    """Split the samples of ``sources`` into work (regenerate), native rows and already-done.
    ``redo``: done samples requested again, with their new attempt number; those of ``stale``
    answer a source row that changed (regen.store.stale: native ones are stored again too, and
    they are not counted as ``retries``, which are the new attempts of flagged answers). The
    bodies of the work wait in a temporary file or in the sources (closed with the plan's
    ``spill``).

    With ``rd``, the plan index in it is used when valid (and no ``redo``), else written when
    missing or stale (module docstring); ``opened``: what
    :func:`regen.store.planned.open_index` returned for it, when the caller opened it
    already (while it read the done-set)."""

    redo = redo or {}
    skip = set() if retry_failed else {k for k, f in failures.items() if f.permanent}
    builder: IndexBuilder | None = None
    if rd is not None:
        index, why = opened if opened is not None else open_index(rd, sources, limit)
        if index is not None and not redo:
            return plan_from_index(index, done, skip, limit)
        builder = _index_builder(rd, sources, index, why)
    sorter = _Sorter(sources.sources, done, skip, redo, stale)
    read = 0
    try:
        for s in iter_planned(sources, limit):
            read += 1
            repeat = s.id in sorter.seen
            if builder is not None:
                builder.add(s, repeat=repeat)
            if repeat:
                log.warning("sample id %s appears twice; keeping the first", s.id)
                continue
            sorter.add(s)
    except BaseException:
        sorter.spill.close()
        if builder is not None:
            builder.discard()
        raise
    if builder is not None:
        builder.write(limit=limit, complete=limit is None or read < limit)
    return sorter.plan()


def plan_from_index(
    index: PlanIndex, done: set[str], skip: set[str], limit: int | None
) -> SessionPlan:
    """The plan from a valid plan index: its bodies read from the sources when dispatched."""
    bodies = IndexBodies(index)
    try:
        got = select(index, bodies, done, skip, limit)
    except BaseException:
        bodies.close()
        raise
    log.info("plan from %s: %d samples, %d to regenerate", layout.PLAN_INDEX,
             index.record.samples, len(got.todo))  # fmt: skip
    return SessionPlan(got.todo, got.native, got.totals, got.skipped_failed, bodies, True)


def _index_builder(
    rd: RunDir, sources: SourceSet, index: PlanIndex | None, why: str
) -> IndexBuilder | None:
    """The sources are read: the plan index to write on the way (None: it stays as it is,
    when it is valid and only new attempts made it unusable), with one line saying why."""
    if index is not None:
        log.info("new attempts of done samples: reading the sources (%s stays as it is)",
                 layout.PLAN_INDEX)  # fmt: skip
        return None
    if why:
        log.warning("%s is not used (%s): reading the sources; it is written again",
                    layout.PLAN_INDEX, why)  # fmt: skip
    else:
        log.info("no plan index yet: reading the sources (%s is written for the next "
                 "session)", layout.PLAN_INDEX)  # fmt: skip
    return IndexBuilder(rd, sources)


class _Sorter:
    """Sorts the samples read from the sources into this session's work: to regenerate
    (bodies spilled), native rows to store, done (unless requested again) and failed
    permanently (left out)."""

    def __init__(
        self,
        sources: Sequence[Source],
        done: set[str],
        skip: set[str],
        redo: dict[str, int],
        stale: frozenset[str],
    ) -> None:
        self.done, self.skip, self.redo, self.stale = done, skip, redo, stale
        self.spill = Spill()
        self.todo: list[PackedSample] = []
        self.native: list[Sample] = []
        self.totals: dict[str, list[int | bool]] = {
            s.name: [0, s.mode == "regenerate"] for s in sources
        }
        self.seen: set[str] = set()  #: ids taken (a repeated id keeps the first)
        self.skipped = 0
        self.retries: dict[str, int] = {}
        self.queued: set[str] = set()  #: done samples queued again

    def add(self, s: Sample) -> None:
        """Take one sample (the first of its id)."""
        self.seen.add(s.id)
        self.totals[s.source][0] += 1
        if s.id in self.done:
            self._again(s)
        elif s.id in self.skip:
            self.skipped += 1
        elif s.mode == "native":
            self.native.append(s)
        else:
            self.todo.append(PackedSample.pack(s, self.spill))  # the plan of a big run stays small

    def _again(self, s: Sample) -> None:
        """A done sample: queued as a new attempt when requested (``redo``), else left."""
        if s.id in self.redo and s.mode == "regenerate":
            self.todo.append(PackedSample.pack(as_attempt(s, self.redo[s.id]), self.spill))
            if s.id not in self.stale:
                self.retries[s.source] = self.retries.get(s.source, 0) + 1
            self.queued.add(s.id)
        elif s.id in self.stale and s.id in self.redo:  # a native row changed: stored again
            self.native.append(as_attempt(s, self.redo[s.id]))
            self.queued.add(s.id)

    def plan(self) -> SessionPlan:
        return SessionPlan(
            QueueItems.of(self.todo),
            self.native,
            {k: (int(v[0]), bool(v[1])) for k, v in self.totals.items()},
            self.skipped,
            self.spill,
            retries=self.retries,
            redo=self.queued,
        )


def write_plan(
    rd: RunDir, plan: SessionPlan, session: str, manifest_dir: Path, limit: int | None
) -> PlanRecord:
    """Record ``plan.json`` for this session, with what re-reading the plan needs: the folder
    the manifest's relative paths resolve against (:attr:`SourceSet.base_dir`) and ``limit``."""
    rec = plan.record(session)
    rec.manifest_dir = str(manifest_dir)
    rec.limit = limit
    layout.PLAN_FILE.write(rd, rec)
    return rec
