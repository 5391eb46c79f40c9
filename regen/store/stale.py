"""Stale answers: stored answers that the latest plan no longer wants. Owns no files.

The latest plan is what the last session recorded in plan/
(:func:`regen.store.planned.recorded_plan`: each planned sample's id and content hash). A
done sample's latest answer is stale when

- ``unplanned``: its sample is not in that plan. Its source row was edited (most adapters'
  ids hash the conversation, so an edited row is a new sample with a new id), removed, or
  filtered out, or a later session planned a smaller ``--limit``;
- ``changed``: its rows' ``content_hash`` (regen.engine.rows) differs from the plan's for the same
id:
  an adapter whose ids are the dataset's own unique ids (xlam, kimi_native) and a row edited in
  place. Rows written before the column have no hash: unknown, never stale by content.

Nothing stored is rewritten: a stale answer stays in its part, is not counted as done (the
progress file counts it as ``stale``, regen.store.progress), and is never exported. A resume
requests a ``changed`` sample again as a new attempt (regen.plan.attempts numbering: one
above its latest), whose rows answer the new content and replace the stale ones in every
count and in the export; an edited row with a new id is a new sample of the plan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from regen.store.counts import SourceCounts
from regen.store.doneset import DoneSet
from regen.store.parts import PartState, inspect_part, list_parts, part_ids
from regen.store.rundir import RunDir

Why = Literal["changed", "unplanned"]


@dataclass(slots=True)
class StaleAnswer:
    """One done sample whose latest answer the plan no longer wants."""

    source: str
    why: Why
    attempt: int = 0  #: the attempt of the stale answer
    counts: SourceCounts = field(default_factory=SourceCounts)  #: its rows' counters


@dataclass(slots=True)
class StaleSet:
    """The stale answers of a run directory, by sample id."""

    answers: dict[str, StaleAnswer] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.answers)

    def __contains__(self, sample_id: object) -> bool:
        return sample_id in self.answers

    def ids(self, why: Why | None = None) -> set[str]:
        return {k for k, a in self.answers.items() if why is None or a.why == why}

    @property
    def sources(self) -> dict[str, SourceCounts]:
        """Per source, the counters of its stale answers."""
        out: dict[str, SourceCounts] = {}
        for a in self.answers.values():
            out.setdefault(a.source, SourceCounts()).add(a.counts)
        return out

    def describe(self, limit: int = 3) -> str:
        """``2 stale answers (1 of a source row changed in place, 1 of a sample no longer
        planned: a, b)``."""
        changed, unplanned = sorted(self.ids("changed")), sorted(self.ids("unplanned"))
        bits = []
        if changed:
            bits.append(f"{len(changed)} of a source row changed in place")
        if unplanned:
            bits.append(f"{len(unplanned)} of a sample no longer planned")
        shown = sorted(self.answers)[:limit]
        more = f" (+{len(self) - limit} more)" if len(self) > limit else ""
        return f"{len(self)} stale answer(s) ({', '.join(bits)}: {', '.join(shown)}{more})"


def find_stale(done: DoneSet, planned: pa.Table) -> dict[str, Why]:
    """Which done samples' latest answers ``planned`` (``id``, ``content_hash``: a recorded
    plan) no longer wants, and why (module docstring)."""
    stored = done.answer_hashes()
    if not stored.num_rows:
        return {}
    in_plan = pc.is_in(stored.column("sample_id"), value_set=planned.column("id"))
    out: dict[str, Why] = dict.fromkeys(
        stored.filter(pc.invert(in_plan)).column("sample_id").to_pylist(), "unplanned"
    )
    joined = stored.filter(in_plan).join(
        planned.select(["id", "content_hash"]).rename_columns(["sample_id", "planned_hash"]),
        "sample_id",
    )
    differs = pc.and_(
        pc.is_valid(joined.column("content_hash")),
        pc.not_equal(joined.column("content_hash"), joined.column("planned_hash")),
    )
    for sid in joined.filter(pc.fill_null(differs, False)).column("sample_id").to_pylist():
        out[sid] = "changed"
    return out


def stale_answers(rd: RunDir, done: DoneSet, planned: pa.Table | None) -> StaleSet:
    """The stale answers of the run directory ``rd`` whose done-set is ``done`` (read from
    its intact parts), with each one's counters (the parts holding one are read again: only
    when there is a stale answer). ``planned`` None (no recorded plan): none known."""
    out = StaleSet()
    if planned is None:
        return out
    why = find_stale(done, planned)
    if not why:
        return out
    for sid, (source, attempt, counts) in _answers_of(rd, why).items():
        out.answers[sid] = StaleAnswer(source, why[sid], attempt, counts)
    return out


def _answers_of(rd: RunDir, wanted: Iterable[str]) -> dict[str, tuple[str, int, SourceCounts]]:
    """(source, attempt, counters) of the latest answer of each sample of ``wanted`` held by
    an intact part."""
    want = set(wanted)
    found: dict[str, tuple[str, int, SourceCounts]] = {}
    for st in list_parts(rd):
        if not _holds_any(rd, st, want):
            continue
        if inspect_part(rd, st):
            continue  # damaged since: nothing of it counts anyway
        for sid in want.intersection(st.samples):
            source, counts = st.samples[sid]
            attempt = st.attempts.get(sid, 0)
            if sid not in found or attempt > found[sid][1]:
                found[sid] = (source, attempt, counts)
    return found


def _holds_any(rd: RunDir, st: PartState, want: set[str]) -> bool:
    if st.record is None:
        return True  # read whole below
    problem, ids, _ = part_ids(rd, st)
    return not problem and not want.isdisjoint(ids)


def current_counts(done: DoneSet, stale: StaleSet) -> dict[str, SourceCounts]:
    """Per source, the counters of the done samples' latest answers less the stale ones: what
    the progress file counts as done (its ``stale`` holds the rest)."""
    out = {name: c.counts() for name, c in done.sources.items()}
    for name, c in stale.sources.items():
        out.setdefault(name, SourceCounts()).add(c, -1)
    return out


def planned_totals(planned: pa.Table) -> dict[str, int]:
    """Samples per source of a recorded plan."""
    counts = planned.column("source").value_counts().to_pylist()
    return {c["values"]: int(c["counts"]) for c in counts}
