"""Checking a run directory (``regen verify``), and the cheap check before export and train.

Owns no files of its own; with ``repair`` it changes the ones named in
:mod:`regen.store.layout` (under the run's lock, so never beside a live run).

:func:`verify_run` checks, and names every problem it finds:

- every part: its bytes against its record (size, sha256), readable, row count as recorded,
  schema as documented (``regen.rows.SCHEMA``; a part written before ``regen.rows.ADDED_COLUMNS``
  lacks those, which is noted, not a problem); a part without a record is read and noted;
- no ``(sample_id, turn, attempt)`` stored twice across parts (a sample answered again by
  ``regen run --retry-flagged`` has its turns once per attempt);
- every stored sample id in the plan (the samples the latest session planned: from the plan
  index when it is valid, else re-read from the manifest and the plan record; skipped with a
  note when the sources cannot be read here);
- the progress counters per source equal what the parts (plus unfolded journal lines) hold;
- every journal segment parseable (a cut last line is an in-flight sample: named, not lost).

``repair`` (refused while a live run holds the lock): damaged parts and their records go to
``quarantine/`` (their samples are requested again by the next run), missing records are
written, journal segments are folded into parts (cut lines dropped), and the progress
counters are rewritten from what is stored.

:func:`cheap_problems` is the footer-only check (one listing, each part's footer) that
``regen export`` and ``regen train`` run first.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from regen.errors import RegenError, RunDirError
from regen.store import layout
from regen.store.counts import SourceCounts
from regen.store.doneset import DoneSet, fold_part
from regen.store.parts import PartState, footer_problem, inspect_part, list_parts, quarantine
from regen.store.run import read_manifest
from regen.store.rundir import RunDir
from regen.store.segments import recover, scan_journal

log = logging.getLogger(__name__)

#: columns read from every part by the full check
VERIFY_COLUMNS = (
    "sample_id",
    "source",
    "turn",
    "prompt_tokens",
    "completion_tokens",
    "finish_reason",
    "attempt",
    "quality_flags",
)


#: problem kinds that a fold of the journal repairs
JOURNAL_KINDS = frozenset({"journal_cut", "journal_unreadable"})


@dataclass(slots=True)
class Problem:
    """One thing wrong with a run directory."""

    kind: str  #: part_damaged, part_missing, record_damaged, schema, duplicate, not_in_plan,
    #: counts, journal_cut, journal_unreadable
    path: str  #: the file it is about (relative to the run directory)
    message: str

    def line(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass(slots=True)
class VerifyReport:
    """What :func:`verify_run` found (and did, with ``repair``)."""

    run_dir: str
    parts: int = 0  #: intact parts
    samples: int = 0  #: distinct samples in intact parts
    rows: int = 0
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  #: checks skipped, records written, ...
    repaired: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["clean"] = self.clean
        return d


def cheap_problems(rd: RunDir) -> list[str]:
    """Problems found from one listing of parts/ and each part's footer (no data read)."""
    out = []
    for st in list_parts(rd):
        why = st.record_problem or footer_problem(rd, st)
        if why:
            out.append(f"{st.part}: {why}")
    return out


def refuse_damaged(rd: RunDir, what: str) -> None:
    """RunDirError (one line) when the cheap check finds damage: ``what`` cannot go on."""
    problems = cheap_problems(rd)
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise RunDirError(
            f"{rd.uri} is damaged, {what} refused: {problems[0]}{more}; run "
            f"`regen verify {rd.uri} --repair`, then rerun the job to request the lost samples"
        )


def _schema_problem(st: PartState) -> str:
    from regen.rows import LATER_COLUMNS, SCHEMA

    if st.schema is None:
        return ""
    have = {f.name: f.type for f in st.schema}
    for added in LATER_COLUMNS:
        if not any(name in have for name in added.names):
            have.update({f.name: f.type for f in added})  # written before them: fine
    missing = [f.name for f in SCHEMA if f.name not in have]
    wrong = [
        f"{f.name} ({have[f.name]}, want {f.type})"
        for f in SCHEMA
        if f.name in have and have[f.name] != f.type
    ]
    extra = [n for n in have if n not in SCHEMA.names]
    bits = []
    if missing:
        bits.append(f"missing column(s) {missing}")
    if wrong:
        bits.append(f"wrong type(s) {wrong}")
    if extra:
        bits.append(f"unknown column(s) {extra}")
    return "; ".join(bits)


def planned_ids(rd: RunDir) -> tuple[set[str] | None, str]:
    """The sample ids of the latest plan, or (None, why not)."""
    from regen.store.planindex import iter_planned, open_index

    try:
        plan = layout.PLAN_FILE.read(rd)
        manifest = read_manifest(rd)
    except RunDirError as e:
        return None, str(e)
    if plan is None or manifest is None:
        return None, "no plan or manifest recorded yet"
    if plan.manifest_dir:
        manifest = manifest.model_copy(update={"base_dir": plan.manifest_dir})
    index, _ = open_index(rd, manifest, plan.limit)
    if index is not None:  # the plan index, when it still describes the sources
        return index.planned_ids(plan.limit), ""
    try:
        return {s.id for s in iter_planned(manifest, plan.limit)}, ""
    except (RegenError, OSError) as e:
        return None, f"the sources cannot be read here ({e})"


def verify_run(rd: RunDir, *, repair: bool = False, check_plan: bool = True) -> VerifyReport:
    """Check every file of the run directory (see the module docstring)."""
    rep = VerifyReport(run_dir=rd.uri)
    states = list_parts(rd)
    done = DoneSet()
    keys: Counter[tuple[str, int, int]] = Counter()
    key_part: dict[tuple[str, int, int], str] = {}
    bad: list[PartState] = []
    old_schema = 0
    for st in states:
        had_record = st.record is not None
        st.problem = st.record_problem or inspect_part(rd, st, columns=VERIFY_COLUMNS)
        if st.problem:
            kind = (
                "part_missing"
                if st.problem == "missing"
                else "record_damaged"
                if st.record_problem
                else "part_damaged"
            )
            n = f"{st.record.samples} samples" if st.record is not None else "its samples"
            rep.problems.append(Problem(kind, st.part, f"{st.problem} ({n} to request again)"))
            bad.append(st)
            continue
        schema = _schema_problem(st)
        if schema:
            rep.problems.append(Problem("schema", st.part, schema))
        old_schema += st.schema is not None and "attempt" not in st.schema.names
        fold_part(done, st, rd if repair else None)
        if not had_record:
            rep.notes.append(
                f"{st.part} has no record (written before records existed, or "
                "cut off right after its rename); its bytes read cleanly"
            )
            if repair:
                rep.repaired.append(f"wrote {layout.part_record_path(st.stem)}")
        rep.parts += 1
        for key in st.keys:
            keys[key] += 1
            key_part.setdefault(key, st.part)
    per_source = done.sources
    rep.samples = len(done)
    rep.rows = sum(c.rows for c in per_source.values())
    if old_schema:
        rep.notes.append(
            f"{old_schema} part(s) written before the attempt and quality columns: read as "
            "attempt 0 without flags"
        )
    for (sid, turn, attempt), n in sorted(keys.items()):
        if n > 1:
            rep.problems.append(
                Problem(
                    "duplicate",
                    key_part[(sid, turn, attempt)],
                    f"(sample_id, turn, attempt) ({sid!r}, {turn}, {attempt}) is stored {n} times",
                )
            )

    journal: dict[str, SourceCounts] = {}
    journal_ids = _check_journals(rd, rep, done.ids, journal)
    if check_plan:
        _check_plan(rd, rep, done.ids | journal_ids)
    _check_counts(rd, rep, per_source, journal)

    if repair and rep.problems:
        _repair(rd, rep, bad)
    return rep


def _check_journals(
    rd: RunDir, rep: VerifyReport, stored: set[str], pending: dict[str, SourceCounts]
) -> set[str]:
    """Journal segments: cut or unreadable lines; returns the ids of complete lines not yet
    in a part (what a resume folds in) and adds their counters to ``pending``."""
    parts = set(rd.list(layout.PARTS_DIR))
    out: set[str] = set()
    for name in rd.list(layout.JOURNAL_DIR):
        stem = layout.segment_stem(name)
        if stem is None:
            continue
        rel = layout.segment_path(stem)
        seg = scan_journal(rd.read_bytes(rel) or b"")
        if seg.cut_tail:
            rep.problems.append(
                Problem(
                    "journal_cut",
                    rel,
                    f"last line cut ({seg.cut_tail} bytes): an in-flight sample, requested again",
                )
            )
        for n in seg.bad_lines:
            rep.problems.append(
                Problem(
                    "journal_unreadable",
                    rel,
                    f"line {n} is unreadable; its sample is requested again",
                )
            )
        if f"{stem}{layout.PART_SUFFIX}" not in parts:
            out |= {s.sample_id for s in seg.samples if s.sample_id not in stored}
            for s in seg.samples:
                pending.setdefault(s.source, SourceCounts()).add(s.counts())
    return out


def _check_plan(rd: RunDir, rep: VerifyReport, ids: set[str]) -> None:
    planned, why = planned_ids(rd)
    if planned is None:
        rep.notes.append(f"sample ids not checked against the plan: {why}")
        return
    extra = sorted(ids - planned)
    if extra:
        shown = ", ".join(extra[:5]) + (f" (+{len(extra) - 5} more)" if len(extra) > 5 else "")
        rep.problems.append(
            Problem(
                "not_in_plan",
                layout.PARTS_DIR,
                f"{len(extra)} stored sample id(s) are not in the plan: {shown}",
            )
        )


def _check_counts(
    rd: RunDir,
    rep: VerifyReport,
    per_source: dict[str, SourceCounts],
    journal: dict[str, SourceCounts],
) -> None:
    from regen.store.lock import read_lock, why_gone

    try:
        snap = layout.PROGRESS_FILE.read(rd)
    except RunDirError as e:
        rep.problems.append(Problem("counts", layout.PROGRESS, str(e)))
        return
    if snap is None:
        return
    lock = read_lock(rd)
    if lock is not None and not why_gone(lock):
        rep.notes.append(
            f"a live run holds the directory (session {lock.session}): counts not compared"
        )
        return
    for name, sp in snap.sources.items():
        have = SourceCounts()
        for held in (per_source, journal):
            have.add(held.get(name) or SourceCounts())
        for what, counted, held in (
            ("samples counted done", sp.done, have.done),
            ("flagged samples counted", sp.flagged, have.flagged),
        ):
            if counted != held:
                rep.problems.append(
                    Problem(
                        "counts",
                        layout.PROGRESS,
                        f"source {name!r}: {counted} {what}, the parts and journal hold {held}",
                    )
                )


def _repair(rd: RunDir, rep: VerifyReport, bad: list[PartState]) -> None:
    from regen.store.doneset import read_done
    from regen.store.lock import RunLock
    from regen.store.run import new_session_id

    with RunLock(rd, new_session_id(), owner="regen verify --repair"):
        for st in bad:
            moved = ", ".join(quarantine(rd, st)) or "nothing (it is gone)"
            rep.repaired.append(f"{st.part}: {st.problem}; moved to {moved}")
        kept = recover(rd)
        if kept or any(p.kind in JOURNAL_KINDS for p in rep.problems):
            rep.repaired.append(
                f"folded the journal into parts ({kept} samples kept, cut and "
                "unreadable lines dropped)"
            )
        done = read_done(rd, repair=True)
        _rewrite_counters(rd, done)
        rep.repaired.append(
            f"rewrote the progress counters from the parts ({len(done)} samples done)"
        )


def _rewrite_counters(rd: RunDir, done: DoneSet) -> None:
    """The progress file's counters as the parts hold them (its totals and failures kept;
    nothing pending, no new attempt to go)."""
    snap = layout.PROGRESS_FILE.read(rd)
    if snap is None:
        return
    for name, sp in snap.sources.items():
        fresh = sp.model_copy(update={**dict(SourceCounts()), "pending": SourceCounts(),
                                      "retrying": 0})  # fmt: skip
        fresh.add(done.sources.get(name) or SourceCounts())
        snap.sources[name] = fresh
    if snap.state == "running":
        snap.state = "interrupted"  # nobody runs it: the lock was free
    layout.PROGRESS_FILE.write(rd, snap)
