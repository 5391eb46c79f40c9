"""Repairing a run directory (``regen verify --repair``): what a check found, fixed so that the
next ``regen verify`` is clean, and nothing intact discarded.

Owns no files of its own; it changes the files named in :mod:`regen.store.layout`, under the
run's lock (so never beside a live run). The rule: a small file that describes data is
rebuilt from that data whenever the data reads cleanly, and the file it replaces is moved to
``quarantine/`` for inspection; only data that does not verify is set aside:

- a damaged part (its bytes against its record, or by itself: footer and page checksums) and
  its record go to ``quarantine/``; the next run requests its samples again;
- a part record that is missing or does not parse, beside a part that verifies by itself, is
  rebuilt from the part (:func:`regen.store.doneset.read_done` with ``repair``);
- journal segments are folded into parts (a cut or unreadable line is an in-flight sample);
- the plan index (``plan/``), damaged or missing, is rebuilt from the sources the recorded
  manifest names (:func:`regen.plan.index.rebuild`, handed in by ``regen verify``), when
  they can be read here;
- ``checks.json`` that does not parse is moved aside: it is a shortcut (the key of the
  configuration checks an earlier session passed), and the next run repeats the checks and
  writes it again;
- ``progress.json`` is rewritten from the parts, the recorded plan and the failures
  (:func:`rewrite_progress`): every source's counters as the parts hold them, less the stale
  answers (:mod:`regen.store.stale`), its totals from the plan; a damaged one is rebuilt from
  scratch (name and model from ``run.json``).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from regen.core.errors import RegenError, RunDirError
from regen.sources import SourceSet, source_set
from regen.store import layout
from regen.store.counts import SourceCounts
from regen.store.doneset import DoneSet, read_done
from regen.store.failures import read_failures
from regen.store.lock import RunLock
from regen.store.parts import PartState, quarantine
from regen.store.planned import recorded_plan
from regen.store.progress import ProgressSnapshot, SourceProgress
from regen.store.run import new_session_id, read_manifest, read_manifest_data
from regen.store.rundir import RunDir
from regen.store.segments import recover
from regen.store.stale import current_counts, planned_totals, stale_answers

log = logging.getLogger(__name__)

#: writes plan/ again from the sources: (run dir, the recorded manifest's sources, --limit)
#: -> written
RebuildPlan = Callable[[RunDir, SourceSet, int | None], bool]


@dataclass(slots=True)
class Findings:
    """What a check found that a repair fixes."""

    bad_parts: list[PartState] = field(default_factory=list)
    #: why plan/ must be written again ("" when it is fine)
    plan_index: str = ""
    #: checks.json does not parse
    checks: bool = False
    #: the journal has cut or unreadable lines, or lines not yet in a part
    journal: bool = False


def repair(rd: RunDir, found: Findings, rebuild_plan: RebuildPlan | None = None) -> list[str]:
    """Fix what ``found`` lists and rewrite the counters (module docstring), under the run's
    lock (LockHeldError beside a live run); returns one line per thing done. ``rebuild_plan``
    writes plan/ again from the sources (:func:`regen.plan.index.rebuild`, which the store
    does not import: the plan sits above it); without it a damaged index is left to the next
    session, which rebuilds it."""

    session = new_session_id()
    out: list[str] = []
    with RunLock(rd, session, owner="regen verify --repair"):
        for st in found.bad_parts:
            moved = ", ".join(quarantine(rd, st)) or "nothing (it is gone)"
            out.append(f"{st.part}: {st.problem}; moved to {moved}")
        kept = recover(rd)
        if kept or found.journal:
            out.append(
                f"folded the journal into parts ({kept} samples kept, cut and unreadable "
                "lines dropped)"
            )
        done = read_done(rd, repair=True)
        out += [f"rebuilt {rel} from its part" for rel in done.records_rebuilt]
        if found.plan_index:
            out.append(_rebuild_index(rd, found.plan_index, rebuild_plan))
        if found.checks:
            moved = _set_aside(rd, layout.CHECKS)
            out.append(f"{layout.CHECKS} moved to {moved} (the next run repeats the checks)")
        out.append(rewrite_progress(rd, done, session=session))
    return out


def _set_aside(rd: RunDir, rel: str) -> str:
    dst = layout.quarantine_path(rel)
    rd.makedirs(layout.QUARANTINE_DIR)
    rd.delete(dst)
    rd.move(rel, dst)
    return dst


def _rebuild_index(rd: RunDir, why: str, rebuild: RebuildPlan | None) -> str:

    if rebuild is None:
        return f"{layout.PLAN_INDEX} ({why}) not rebuilt here: the next session rebuilds it"
    try:
        plan = layout.PLAN_FILE.read(rd)
        manifest = read_manifest(rd)
    except RunDirError as e:
        return f"{layout.PLAN_INDEX} not rebuilt: {e}"
    if plan is None or manifest is None:
        return f"{layout.PLAN_INDEX} not rebuilt: no {layout.PLAN} or {layout.MANIFEST}"
    if plan.manifest_dir:
        manifest = manifest.model_copy(update={"base_dir": plan.manifest_dir})
    for rel in (layout.PLAN_INDEX, layout.PLAN_SAMPLES):
        if rd.exists(rel):
            _set_aside(rd, rel)
    try:
        written = rebuild(rd, source_set(manifest), plan.limit)
    except (RegenError, OSError) as e:
        return f"{layout.PLAN_INDEX} ({why}) not rebuilt: the sources cannot be read here ({e})"
    if not written:
        return f"{layout.PLAN_INDEX} ({why}) not rebuilt (see the warning above)"
    return f"{layout.PLAN_INDEX} ({why}): rebuilt from the sources"


def rewrite_progress(rd: RunDir, done: DoneSet, *, session: str) -> str:
    """Rewrite progress.json from what is stored: per source, the latest answers of the done
    samples less the stale ones (counted as ``stale``), the plan's totals, the permanent
    failures of planned samples not done; nothing pending, nothing in flight. A damaged file is
    moved to quarantine/ and rebuilt (name and model from run.json). Returns what it did."""

    planned, _ = recorded_plan(rd)
    stale = stale_answers(rd, done, planned)
    counts = current_counts(done, stale)
    how = "rewrote"
    try:
        snap = layout.PROGRESS_FILE.read(rd)
    except RunDirError as e:
        moved = _set_aside(rd, layout.PROGRESS)
        log.warning("%s (moved to %s): rebuilt from the parts", e, moved)
        snap, how = None, "rebuilt (the damaged one is in quarantine/)"
    if snap is None:
        snap = _fresh_snapshot(rd, session)
        how = how if how != "rewrote" else "wrote"
    try:
        plan = layout.PLAN_FILE.read(rd)
    except RunDirError:
        plan = None
    totals = planned_totals(planned) if planned is not None else None
    names = list(plan.sources) if plan is not None else []
    names += [n for n in (*(totals or {}), *snap.sources, *counts) if n not in names]
    planned_ids = set(planned.column("id").to_pylist()) if planned is not None else None
    failed: dict[str, int] = {}
    for sid, f in read_failures(rd).items():
        if f.permanent and sid not in done and (planned_ids is None or sid in planned_ids):
            failed[f.source] = failed.get(f.source, 0) + 1
    sources: dict[str, SourceProgress] = {}
    for name in names:
        old = snap.sources.get(name)
        entry = plan.sources.get(name) if plan is not None else None
        if totals is not None:  # the recorded plan's
            total = totals.get(name, 0)
        else:
            total = entry.total if entry else (old.total if old else 0)
        regenerate = entry.regenerate if entry else (old.regenerate if old else True)
        sp = SourceProgress(total=total, regenerate=regenerate, failed=failed.get(name, 0),
                            stale=stale.sources.get(name) or SourceCounts())  # fmt: skip
        sp.add(counts.get(name) or SourceCounts())
        sources[name] = sp
    snap.sources = sources
    snap.in_flight = 0
    remaining = sum(sp.remaining for sp in sources.values())
    if remaining == 0:  # nobody runs it now (the lock was free): what is left decides
        snap.state = "finished"
    elif snap.state in ("running", "finished") or how != "rewrote":
        snap.state = "interrupted"  # samples to request again: the next run does them
    snap.updated_at = time.time()
    layout.PROGRESS_FILE.write(rd, snap)
    done_n = sum(sp.done for sp in sources.values())
    extra = f", {len(stale)} stale answers not counted" if len(stale) else ""
    return f"{how} {layout.PROGRESS} from the parts ({done_n} samples done{extra})"


def _fresh_snapshot(rd: RunDir, session: str) -> ProgressSnapshot:
    """A progress snapshot with no counters, named as the run is (run.json, else the
    manifest)."""
    name = model = ""
    started = 0.0
    try:
        run = layout.RUN_FILE.read(rd)
    except RunDirError:
        run = None
    if run is not None:
        name, model, started = run.name, run.model, run.created_at
    else:
        try:
            data = read_manifest_data(rd) or {}
        except RunDirError:
            data = {}
        name = str(data.get("name") or "")
        target = data.get("target")
        model = str((target.get("model") if isinstance(target, dict) else None) or "")
    now = time.time()
    return ProgressSnapshot(name=name, model=model, session=session, host=socket.gethostname(),
                            pid=os.getpid(), state="interrupted", run_started_at=started,
                            started_at=now, updated_at=now)  # fmt: skip
