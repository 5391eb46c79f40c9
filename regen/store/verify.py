"""Checking a run directory (``regen verify``), and the cheap check before export and train.

Owns no files of its own; with ``repair`` it changes the ones named in
:mod:`regen.store.layout` through :mod:`regen.store.repair` (under the run's lock, so never
beside a live run), then checks again: a repair converges, and never discards intact data.

:func:`verify_run` checks, and names every problem it finds (its kind in brackets):

- every part: its bytes against its record (size, sha256), readable, row count as recorded
  (``part_damaged``, ``part_missing``); a part without a record, or with one that does not
  parse (``record_damaged``), is read whole and checked by itself (its footer's counts, every
  page's checksum: regen.store.parts): such a part is intact, only its record is rebuilt;
  schema as documented (``schema``; ``regen.store.schema.SCHEMA``; a part written before a later
  column group, ``regen.store.schema.LATER_COLUMNS``, lacks it, which is fine);
- no ``(sample_id, turn, attempt)`` stored twice across parts (``duplicate``; a sample
  answered again by ``regen run --retry-flagged`` has its turns once per attempt);
- the plan index (``plan_index``): the plan the latest session recorded
  (:func:`regen.store.planned.recorded_plan`) is intact, or missing where a session planned;
  stored answers it no longer wants are noted (:mod:`regen.store.stale`: not counted, never
  exported, not a problem), and so are sources that changed since it was recorded;
- progress.json (``progress``, ``counts``): it parses, and per source its samples done, flagged
  and stale equal what the parts (plus unfolded journal lines) hold, stale answers apart;
- every journal segment parseable (``journal_cut``, ``journal_unreadable``: a cut last line is
  an in-flight sample: named, not lost);
- checks.json parses (``checks``);
- manifest.yaml is a manifest and lock.json a lock record (``manifest``, ``lock``): no repair
  rebuilds either from the parts, so a damaged one stays a problem for a person to decide
  (``--repair`` refuses to start beside a damaged lock: it cannot tell whose it is).

``repair`` fixes each (regen.store.repair): damaged parts quarantined (their samples are
requested again by the next run), records, the plan index and progress.json rebuilt from what
they describe, the journal folded, a damaged checks.json moved aside.

:func:`cheap_problems` is the footer-only check (one listing, each part's footer) that
``regen export`` and ``regen train`` run first.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import asdict, dataclass, field

import pyarrow as pa

from regen.core.errors import RunDirError
from regen.sources import source_set
from regen.store import layout
from regen.store.counts import SourceCounts
from regen.store.doneset import DoneSet, fold_part, replaced_samples
from regen.store.lock import lock_damage, read_lock, why_gone
from regen.store.parts import (
    CHECK_COLUMNS,
    PartState,
    footer_problem,
    inspect_part,
    list_parts,
)
from regen.store.planned import open_index, recorded_plan
from regen.store.repair import Findings, RebuildPlan
from regen.store.repair import repair as fix
from regen.store.run import read_manifest
from regen.store.rundir import RunDir
from regen.store.schema import ADDED_COLUMNS, LATER_COLUMNS, SCHEMA
from regen.store.segments import scan_journal
from regen.store.stale import StaleSet, current_counts, stale_answers

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Problem:
    """One thing wrong with a run directory."""

    kind: str  #: part_damaged, part_missing, record_damaged, schema, duplicate, plan_index,
    #: progress, counts, journal_cut, journal_unreadable, checks, manifest, lock (module
    #: docstring)
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
    #: what is wrong (after ``repair``: what is still wrong)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  #: checks skipped, stale answers, ...
    repaired: list[str] = field(default_factory=list)
    #: with ``repair``: the problems found before it
    found: list[Problem] = field(default_factory=list)
    #: intact parts without a record (a repair writes one)
    missing_records: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, object]:
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


def verify_run(
    rd: RunDir,
    *,
    repair: bool = False,
    check_plan: bool = True,
    rebuild_plan: RebuildPlan | None = None,
) -> VerifyReport:
    """Check every file of the run directory (see the module docstring); with ``repair``, fix
    what can be fixed (:mod:`regen.store.repair`; a damaged plan index only with
    ``rebuild_plan``) and check again: ``problems`` are then what is left (empty when the
    repair converged)."""
    rep, found = _check(rd, check_plan=check_plan)
    if repair and (why := lock_damage(rd)) is not None:
        raise RunDirError(f"{rd.uri}/{layout.LOCK}: {why}; --repair takes the lock, so {LOCK_FIX}")
    if repair and (rep.problems or found.bad_parts or rep.missing_records):
        rep.repaired = fix(rd, found, rebuild_plan)
        after, _ = _check(rd, check_plan=check_plan)
        rep.found = rep.problems
        rep.problems, rep.notes = after.problems, after.notes
        rep.parts, rep.samples, rep.rows = after.parts, after.samples, after.rows
    return rep


def _check(rd: RunDir, *, check_plan: bool) -> tuple[VerifyReport, Findings]:
    """The checks, writing nothing: the report, and what a repair would fix."""

    rep = VerifyReport(run_dir=rd.uri)
    found = Findings()
    states = list_parts(rd)
    for st in states:
        st.problem = inspect_part(rd, st, columns=CHECK_COLUMNS)
    done = _check_parts(states, rep, found)
    journal: dict[str, SourceCounts] = {}
    found.journal = _check_journals(rd, rep, journal)
    planned, why = recorded_plan(rd)  # the counters leave its stale answers out, plan check or not
    stale = stale_answers(rd, done, planned)
    if check_plan:
        _check_plan(rd, rep, planned, why, stale, found)
    _check_counts(rd, rep, current_counts(done, stale), stale, journal, bool(states))
    found.checks = _check_checks(rd, rep)
    _check_for_a_person(rd, rep)
    return rep, found


def _check_parts(states: list[PartState], rep: VerifyReport, found: Findings) -> DoneSet:
    """The inspected parts: a damaged or missing one is a problem (and a repair's to quarantine),
    an intact one has its record and schema checked and is folded into the done-set returned;
    then the row keys stored twice."""
    done = DoneSet(replaceable=replaced_samples(st for st in states if not st.problem))
    keys: Counter[tuple[str, int, int]] = Counter()
    key_part: dict[tuple[str, int, int], str] = {}
    old_schema = 0
    for st in states:
        if st.problem:
            kind = "part_missing" if st.problem == "missing" else "part_damaged"
            lost = f"{st.record.samples} samples" if st.record is not None else "its samples"
            rep.problems.append(Problem(kind, st.part, f"{st.problem} ({lost} to request again)"))
            found.bad_parts.append(st)
            continue
        _check_record(st, rep)
        schema = _schema_problem(st)
        if schema:
            rep.problems.append(Problem("schema", st.part, schema))
        old_schema += st.schema is not None and ADDED_COLUMNS.names[0] not in st.schema.names
        fold_part(done, st)
        rep.parts += 1
        for key in st.keys:
            keys[key] += 1
            key_part.setdefault(key, st.part)
    rep.samples = len(done)
    rep.rows = sum(c.rows for c in done.sources.values())
    if old_schema:
        rep.notes.append(
            f"{old_schema} part(s) written before the attempt and quality columns: read as "
            "attempt 0 without flags"
        )
    for (sid, turn, attempt), n in sorted(keys.items()):
        if n > 1:
            where = key_part[(sid, turn, attempt)]
            what = f"(sample_id, turn, attempt) ({sid!r}, {turn}, {attempt}) is stored {n} times"
            rep.problems.append(Problem("duplicate", where, what))
    return done


def _check_record(st: PartState, rep: VerifyReport) -> None:
    """An intact part's record: one that does not parse is a problem (``record_damaged``), a
    missing one a note; both are rebuilt from the part by a repair."""
    if st.record_problem:
        rep.problems.append(
            Problem(
                "record_damaged",
                layout.part_record_path(st.stem),
                f"{st.record_problem}; its part reads cleanly by itself (footer counts, "
                "page checksums): --repair rebuilds the record from it",
            )
        )
    elif st.record is None:
        rep.missing_records.append(st.part)
        rep.notes.append(
            f"{st.part} has no record (written before records existed, or cut off right "
            "after its rename); its bytes read cleanly: --repair writes one"
        )


def _check_for_a_person(rd: RunDir, rep: VerifyReport) -> None:
    """manifest.yaml and lock.json: what no repair rebuilds from the parts (a damaged one is a
    problem a person decides; ``manifest``, ``lock``)."""
    try:
        read_manifest(rd)
    except RunDirError as e:
        rep.problems.append(Problem("manifest", layout.MANIFEST, f"{e}; {MANIFEST_FIX}"))
    if (why := lock_damage(rd)) is not None:
        rep.problems.append(Problem("lock", layout.LOCK, f"{why}; {LOCK_FIX}"))


#: what a person does about a damaged manifest.yaml (no repair rebuilds it)
MANIFEST_FIX = (
    "no repair rebuilds it, a person decides: the next `regen run MANIFEST --out RUN` writes "
    "it again from the manifest given (or restore it from a copy)"
)
#: ... and about a damaged lock.json
LOCK_FIX = (
    "no repair rebuilds it, a person decides: regen cannot tell whose it is; once no run "
    "uses the directory, delete it"
)


def _check_journals(rd: RunDir, rep: VerifyReport, pending: dict[str, SourceCounts]) -> bool:
    """Journal segments: cut or unreadable lines; adds the counters of complete lines not yet
    in a part (what a resume folds in) to ``pending``. True when a fold would change
    something (a line to drop, or one to fold)."""
    parts = set(rd.list(layout.PARTS_DIR))
    fold = False
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
        fold = fold or bool(seg.cut_tail or seg.bad_lines or seg.samples)
        if f"{stem}{layout.PART_SUFFIX}" not in parts:
            for s in seg.samples:
                pending.setdefault(s.source, SourceCounts()).add(s.counts())
    return fold


def _check_plan(
    rd: RunDir,
    rep: VerifyReport,
    planned: pa.Table | None,
    why: str,
    stale: StaleSet,
    found: Findings,
) -> None:
    """The recorded plan (plan/, ``planned``; ``why`` not, when None): intact, the stored
    answers it no longer wants (``stale``), and whether the sources changed since."""

    if planned is None:
        try:
            planned_before = layout.PLAN_FILE.read(rd) is not None
        except RunDirError as e:
            rep.notes.append(f"sample ids not checked against the plan: {e}")
            return
        if why or planned_before:
            found.plan_index = why or "missing"
            rep.problems.append(
                Problem(
                    "plan_index",
                    layout.PLAN_INDEX,
                    f"{why or 'missing'}: the stored answers cannot be checked against the plan "
                    "(nor told stale by export); --repair rebuilds it from the sources",
                )
            )
        else:
            rep.notes.append("sample ids not checked against the plan: no plan recorded yet")
        return
    if len(stale):
        again = (
            "; the next `regen run` answers the rows changed in place again"
            if stale.ids("changed")
            else ""
        )
        rep.notes.append(
            f"{stale.describe()}: kept in their parts, not counted as done, never exported{again}"
        )
    try:
        plan = layout.PLAN_FILE.read(rd)
        manifest = read_manifest(rd)
    except RunDirError:
        return
    if plan is not None and manifest is not None:
        if plan.manifest_dir:
            manifest = manifest.model_copy(update={"base_dir": plan.manifest_dir})
        index, changed = open_index(rd, source_set(manifest), plan.limit)
        if index is None and changed:
            rep.notes.append(
                f"the sources changed since the latest session planned ({changed}): the next "
                "`regen run` plans again (answers of edited rows are then stale)"
            )


def _check_counts(
    rd: RunDir,
    rep: VerifyReport,
    per_source: dict[str, SourceCounts],
    stale: StaleSet,
    journal: dict[str, SourceCounts],
    stored: bool,
) -> None:
    """progress.json against what is stored: per source, samples done, flagged and stale."""

    try:
        snap = layout.PROGRESS_FILE.read(rd)
    except RunDirError as e:
        rep.problems.append(
            Problem("progress", layout.PROGRESS, f"{e}; --repair rebuilds it from the parts")
        )
        return
    if snap is None:
        if stored:
            rep.problems.append(
                Problem(
                    "progress",
                    layout.PROGRESS,
                    "missing beside stored parts (status and the dashboard read the run as "
                    "empty); --repair rebuilds it from the parts",
                )
            )
        return
    lock = read_lock(rd)
    if lock is not None and not why_gone(lock):
        rep.notes.append(
            f"a live run holds the directory (session {lock.session}): counts not compared"
        )
        return
    stale_by_source = stale.sources
    for name in sorted(set(snap.sources) | set(per_source)):
        sp = snap.sources.get(name)
        have = SourceCounts()
        for held in (per_source, journal):
            have.add(held.get(name) or SourceCounts())
        gone = stale_by_source.get(name) or SourceCounts()
        for what, counted, holds in (
            ("samples counted done", sp.done if sp else 0, have.done),
            ("flagged samples counted", sp.flagged if sp else 0, have.flagged),
            ("stale answers counted", sp.stale.done if sp else 0, gone.done),
        ):
            if counted != holds:
                rep.problems.append(
                    Problem(
                        "counts",
                        layout.PROGRESS,
                        f"source {name!r}: {counted} {what}, the parts and journal hold {holds}",
                    )
                )


def _check_checks(rd: RunDir, rep: VerifyReport) -> bool:
    """checks.json parses (or is absent); True when it does not."""
    data = rd.read_bytes(layout.CHECKS)
    if data is None:
        return False
    try:
        layout.CHECKS_FILE.parse(data)
    except RunDirError as e:
        rep.problems.append(
            Problem(
                "checks",
                layout.CHECKS,
                f"{e}; a shortcut only: --repair moves it aside and the next run repeats the "
                "configuration checks",
            )
        )
        return True
    return False
