"""Planning a session: which samples still need work, and ``plan.json``.

:func:`plan_session` reads the manifest's samples (filtered, deduplicated, limited) and splits
them into work to regenerate (spilled :class:`~regen.engine.schedule.PackedSample`), native rows
to store as they are, and samples already done or failed permanently. :func:`write_plan` records
the per-source totals as ``plan.json`` (:class:`regen.store.layout.PlanRecord`), which the
dashboard reads for its expected turns per sample.

New attempts (``regen run --retry-flagged``): ``redo`` maps done samples to the attempt number
to request (:func:`regen.engine.attempts.select`); :func:`plan_session` queues them like any
other work, marked with that attempt (:func:`regen.engine.attempts.as_attempt`).

Seam for a plan index: :func:`iter_planned` is the one place samples come from. An index of the
plan kept in the run directory (so that a resume reads only unfinished rows) replaces it by
yielding the same samples from there; :func:`plan_session` and everything after it stay. Such
an index must still yield the done samples named in ``redo`` (their bodies are what a new
attempt sends).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from regen.engine.schedule import PackedSample, Spill
from regen.manifest import Manifest
from regen.sample import Sample
from regen.store import layout
from regen.store.journal import FailureRecord
from regen.store.layout import PlanEntry, PlanRecord
from regen.store.rundir import RunDir

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Plan:
    """This session's work."""

    todo: list[PackedSample]  #: to regenerate; bodies in ``spill``
    native: list[Sample]  #: native rows still to store
    totals: dict[str, tuple[int, bool]]  #: {source: (samples planned, regenerate)}
    skipped_failed: int  #: recorded permanent failures left out (no --retry-failed)
    spill: Spill = field(default_factory=Spill)
    retries: dict[str, int] = field(default_factory=dict)  #: new attempts queued per source

    def record(self, session: str) -> PlanRecord:
        """``plan.json`` of this plan."""
        todo_n: dict[str, int] = {}
        todo_turns: dict[str, int] = {}
        for p in self.todo:
            todo_n[p.source] = todo_n.get(p.source, 0) + 1
            todo_turns[p.source] = todo_turns.get(p.source, 0) + p.turns_to_regenerate()
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


def native_check(manifest: Manifest) -> Callable[[Sample], str | None] | None:
    """The check of native rows against the target tokenizer's vocabulary (None: no native
    source)."""
    if not any(s.mode == "native" for s in manifest.sources):
        return None
    from regen.native import VocabInfo, validate_native

    vocab = VocabInfo.from_dir(
        manifest.resolve(manifest.target.tokenizer),
        trust_remote_code=manifest.target.trust_remote_code,
    )
    return lambda s: validate_native(s, vocab)


def iter_planned(manifest: Manifest, limit: int | None) -> Iterator[Sample]:
    """Every sample of the manifest in plan order (the seam for a plan index, see above)."""
    from regen.sources import read_samples

    samples: Iterator[Sample] = read_samples(manifest, None, native_check(manifest))
    return itertools.islice(samples, limit) if limit is not None else samples


def plan_session(
    manifest: Manifest,
    done: set[str],
    failures: dict[str, FailureRecord],
    *,
    limit: int | None = None,
    retry_failed: bool = False,
    redo: dict[str, int] | None = None,
) -> Plan:
    """Split the samples into work (regenerate), native rows and already-done. ``redo``: done
    samples requested again, with their new attempt number. The bodies of the work are spilled
    to a temporary file (closed with the plan)."""
    from regen.engine.attempts import as_attempt

    spill = Spill()
    todo: list[PackedSample] = []
    native: list[Sample] = []
    totals: dict[str, list[int | bool]] = {
        s.name: [0, s.mode == "regenerate"] for s in manifest.sources
    }
    seen: set[str] = set()
    skipped = 0
    redo = redo or {}
    retries: dict[str, int] = {}
    for s in iter_planned(manifest, limit):
        if s.id in seen:
            log.warning("sample id %s appears twice; keeping the first", s.id)
            continue
        seen.add(s.id)
        totals[s.source][0] += 1
        if s.id in done:
            if s.id in redo and s.mode == "regenerate":
                todo.append(PackedSample.pack(as_attempt(s, redo[s.id]), spill))
                retries[s.source] = retries.get(s.source, 0) + 1
            continue
        f = failures.get(s.id)
        if f is not None and f.permanent and not retry_failed:
            skipped += 1
            continue
        if s.mode == "native":
            native.append(s)
        else:
            todo.append(PackedSample.pack(s, spill))  # the plan of a big run stays small
    totals_ = {k: (int(v[0]), bool(v[1])) for k, v in totals.items()}
    return Plan(todo, native, totals_, skipped, spill, retries)


def write_plan(
    rd: RunDir, plan: Plan, session: str, manifest: Manifest, limit: int | None
) -> PlanRecord:
    """Record ``plan.json`` for this session (with what re-reading the plan needs)."""
    rec = plan.record(session)
    rec.manifest_dir = str(manifest.resolve("."))
    rec.limit = limit
    layout.PLAN_FILE.write(rd, rec)
    return rec
