"""``RunView``: a run directory read for its numbers, tick after tick.

Reads, per refresh tick, three small files of the run directory and nothing else (files
named in :mod:`regen.store.layout`): the progress snapshot (regen.store.progress), the lock
(LockRecord) and run.json (RunRecord). Once (retried while absent) it reads the manifest, for
the per-source ``output_tokens`` planning assumption (used for sources that have no finished
sample yet), together with the plan (PlanRecord) for the expected regenerated turns per
sample. Every ``RECONCILE_EVERY_S`` (and on the first tick; ``regen status`` reads once) it
also lists ``parts/`` — one listing call, never a Parquet file — and reads the record of each
part it has not seen yet (records never change, so each is read once): what vanished from the
parts is subtracted (regen.status.files).

The one module of regen.status that touches files (all through :class:`regen.store.RunDir`).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from regen.core.errors import RunDirError
from regen.status.files import PartsCheck, RunFiles, deficit
from regen.status.numbers import compute
from regen.status.rates import DEFAULT_OUTPUT_TOKENS
from regen.status.records import RunNumbers
from regen.store import RunDir, layout
from regen.store.counts import SourceCounts
from regen.store.layout import PartRecord
from regen.store.lock import read_lock, why_gone
from regen.store.progress import VERSION as PROGRESS_VERSION
from regen.store.progress import SourceProgress
from regen.store.run import read_manifest_data

log = logging.getLogger(__name__)

#: seconds between two listings of parts/ by a refreshing view
RECONCILE_EVERY_S = 30.0


class RunView:
    """A read-only view of a run directory, opened once and read every tick."""

    def __init__(
        self, uri: RunDir | str | os.PathLike[str], *, reconcile_every_s: float = RECONCILE_EVERY_S
    ) -> None:
        """``uri``: the run directory, or the handle its command opened (passed on, not opened
        again). ``reconcile_every_s``: how often reads list parts/ (the first read always
        does)."""
        rd = uri if isinstance(uri, RunDir) else RunDir.open(os.fspath(uri), create=False)
        self.rd = rd.require()
        self.uri = self.rd.uri  #: a local path made absolute (every message names it so)
        self.reconcile_every_s = reconcile_every_s
        self._assumptions: dict[str, tuple[int, int]] | None = None
        self._turns: dict[str, float] = {}
        self._records: dict[str, PartRecord] = {}
        self._last_check: PartsCheck | None = None
        self._checked_at: float | None = None

    @property
    def assumptions(self) -> dict[str, tuple[int, int]]:
        """Per-source output_tokens from the manifest: read once (retried while it is absent).

        The plan's turns per sample are read at the same moment (see :attr:`turns`).
        """
        if self._assumptions is None:
            try:
                data = read_manifest_data(self.rd)
            except RunDirError as e:
                log.warning("%s", e)
                data = {}
            if data is None:
                return {}
            self._assumptions, last = _source_assumptions(data)
            try:
                plan = layout.PLAN_FILE.read(self.rd)
            except RunDirError as e:
                log.warning("%s", e)
                plan = None
            self._turns = _turns_per_sample(plan, last)
        return self._assumptions

    @property
    def turns(self) -> dict[str, float]:
        """Expected regenerated turns per sample, per source (read with the assumptions)."""
        self.assumptions  # noqa: B018 - loads both
        return self._turns

    def check_parts(self) -> PartsCheck:
        """List parts/ (one call) and compare with the part records (each read once)."""
        sizes = self.rd.sizes(layout.PARTS_DIR)
        stored: dict[str, SourceCounts] = {}
        damaged: list[str] = []
        known = True
        recorded: set[str] = set()
        for name in sizes:
            stem = layout.record_stem(name)
            if stem is None:
                continue
            recorded.add(stem)
            rec = self._records.get(stem)
            if rec is None:
                try:
                    rec = layout.part_record_file(stem).read(self.rd)
                except RunDirError as e:
                    damaged.append(f"{layout.part_record_path(stem)}: {e}")
                    continue
                if rec is None:
                    continue
                self._records[stem] = rec
            part = layout.part_path(stem)
            size = sizes.get(f"{stem}{layout.PART_SUFFIX}")
            if size is None:
                damaged.append(f"{part}: missing ({rec.samples} samples)")
            elif size != rec.bytes:
                damaged.append(f"{part}: {size} bytes, its record says {rec.bytes}")
            else:
                for src, c in rec.sources.items():
                    stored.setdefault(src, SourceCounts()).add(c)
        for name in sizes:
            stem = layout.part_stem(name)
            if stem is not None and stem not in recorded:
                known = False  # being written, or from before records: cannot tell
        return PartsCheck(stored if known else None, damaged)

    def read(self) -> RunFiles:
        """Read the progress file, the lock and run.json (and list parts/ when due)."""
        error = ""
        try:
            progress = layout.PROGRESS_FILE.read(self.rd)
        except RunDirError as e:  # damaged: unknown, never an empty run
            progress, error = None, f"{e}: run `regen verify {self.uri} --repair`"
            other = (self.rd.read_json(layout.PROGRESS) or {}).get("version", PROGRESS_VERSION)
            if other != PROGRESS_VERSION:  # not damage: a newer (or older) writer's format
                error = (f"{layout.PROGRESS} was written by another regen version (format "
                         f"{other!r}; this one reads {PROGRESS_VERSION}): read it with that "
                         "version")  # fmt: skip
        run = layout.RUN_FILE.read(self.rd)
        lock = read_lock(self.rd)
        if progress is None and not error and run is None and not self.rd.exists(layout.MANIFEST):
            raise RunDirError(
                f"{self.uri!r} is not a run directory (no {layout.RUN}, {layout.PROGRESS})"
            )
        now = time.monotonic()
        due = self._checked_at is None or now - self._checked_at >= self.reconcile_every_s
        if due or (error and self._last_check is None):
            fresh = self.check_parts()  # listed after the progress file was read: see deficit
            fresh.deficit = deficit(progress, fresh.stored)
            self._last_check = fresh
            self._checked_at = now
        check = self._last_check
        lost = progress is None and not error and check is not None and bool(check.stored)
        if lost and (lock is None or why_gone(lock)):  # no session about to write it
            error = (f"{layout.PROGRESS} is missing beside stored parts: run "
                     f"`regen verify {self.uri} --repair`")  # fmt: skip
        files = RunFiles(progress=progress, lock=lock, run=run, parts=check,
                         progress_error=error)  # fmt: skip
        if error:
            files.fallback = self._from_records()
        return files

    def _from_records(self) -> dict[str, SourceProgress]:
        """Per source, what the part records of the last listing hold, with plan.json's totals
        (what status shows while the progress file is damaged)."""
        check = self._last_check
        if check is None or check.stored is None:
            return {}
        try:
            plan = layout.PLAN_FILE.read(self.rd)
        except RunDirError:
            plan = None
        entries = plan.sources if plan is not None else {}
        out: dict[str, SourceProgress] = {}
        for name in [*entries, *(n for n in check.stored if n not in entries)]:
            entry = entries.get(name)
            sp = SourceProgress(total=entry.total if entry else 0,
                                regenerate=entry.regenerate if entry else True,
                                pending=None)  # fmt: skip
            sp.add(check.stored.get(name) or SourceCounts())
            out[name] = sp
        return out

    def numbers(self, now: float | None = None, **kw: Any) -> RunNumbers:
        """Read and compute in one go."""
        return compute(
            self.read(),
            now=time.time() if now is None else now,
            assumptions=self.assumptions,
            turns=self.turns,
            uri=self.uri,
            **kw,
        )


def _source_assumptions(data: dict[str, Any]) -> tuple[dict[str, tuple[int, int]], set[str]]:
    """Per source, ``output_tokens`` (low, high) and whether it says ``turns: last``, from the
    manifest's data (tolerant: a source entry that does not parse is left out)."""
    out: dict[str, tuple[int, int]] = {}
    last: set[str] = set()
    for s in data.get("sources") or []:
        try:
            lo, hi = s.get("output_tokens", DEFAULT_OUTPUT_TOKENS)
            out[str(s["name"])] = (int(lo), int(hi))
            if s.get("turns") == "last":
                last.add(str(s["name"]))
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            log.debug("manifest source entry skipped: %s", e)
    return out, last


def _turns_per_sample(plan: layout.PlanRecord | None, last: set[str]) -> dict[str, float]:
    """``{source: turns}`` from the plan's ``regenerate_turns / regenerate_todo``; else 1 for
    sources whose manifest entry says ``turns: last``; sources not listed count 1."""
    out: dict[str, float] = dict.fromkeys(last, 1.0)
    for name, entry in (plan.sources if plan else {}).items():
        if entry.regenerate_todo > 0:
            out[name] = max(1.0, entry.regenerate_turns / entry.regenerate_todo)
    return out
