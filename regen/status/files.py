"""What one refresh of a run directory read, and what vanished from its parts.

**Parts that vanished.** The progress file counts what the driver stored, but a part can be
deleted or damaged afterwards (a storage fault, a partial copy). So a view
(:class:`regen.status.view.RunView`) also lists ``parts/`` now and then and compares the
listing with the part records (:class:`PartsCheck`). A part counts when its file is listed with
the size its record says. Per source, what the progress file (read just before the listing)
counts beyond the counted parts plus its ``pending`` samples (journaled, not yet in a part) is
the deficit (:func:`deficit`): the samples of parts that vanished. Until the next listing every
tick shows the progress counters less that deficit, and names the parts missing or of the
wrong size. While some listed part has no record yet (a part being written, or a run
directory from before records) no deficit is computed.

Records and a pure function; owns no files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from regen.store.counts import SourceCounts
from regen.store.layout import LockRecord, RunRecord
from regen.store.progress import ProgressSnapshot, SourceProgress


@dataclass(slots=True)
class PartsCheck:
    """What one listing of parts/ found (see the module docstring)."""

    #: per source, the counters of the parts found intact-looking; None: cannot tell
    stored: dict[str, SourceCounts] | None
    #: parts whose file is gone or of the wrong size (relative paths, with why)
    damaged: list[str] = field(default_factory=list)
    #: per source, what the progress file read with this listing counts beyond the counted
    #: parts plus its pending samples (see :func:`deficit`); subtracted until the next listing
    deficit: dict[str, SourceCounts] = field(default_factory=dict)


@dataclass(slots=True)
class RunFiles:
    """What one refresh read."""

    progress: ProgressSnapshot | None
    lock: LockRecord | None
    run: RunRecord | None
    parts: PartsCheck | None = None  #: None when this tick did not list parts/
    #: why the progress file could not be read and what to do ("" when it was, or is missing)
    progress_error: str = ""
    #: with ``progress_error``: per source, what the part records hold, with the plan's totals
    #: (the numbers shown while the state is unknown); empty when that cannot be told either
    fallback: dict[str, SourceProgress] = field(default_factory=dict)


def deficit(
    progress: ProgressSnapshot | None, stored: dict[str, SourceCounts] | None
) -> dict[str, SourceCounts]:
    """Per source, how much the progress counters exceed the intact parts plus the pending
    samples (what vanished). Empty when either side is unknown. The parts must be listed after
    the progress file was read: a part written in between is then counted by both, never
    missed."""
    if progress is None or stored is None:
        return {}
    out: dict[str, SourceCounts] = {}
    for name, sp in progress.sources.items():
        if sp.pending is None:
            continue  # an older writer: nothing to compare with
        held = sp.counts()  # the parts hold the stale answers too (not counted as done)
        held.add(sp.stale)
        gap = held.less(stored.get(name) or SourceCounts(), sp.pending)
        if not gap.is_zero:
            out[name] = gap
    return out
