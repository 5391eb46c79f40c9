"""All sources of a manifest (its :class:`~regen.sources.sourceset.SourceSet`) as one
deterministic stream of samples, with counts.

Order of work per source, sources in manifest order:
adapter → filters (min/max prompt chars, max turns; regenerate mode only) → exact-duplicate drop
within and across sources (by ``Sample.content_hash``; the first occurrence wins) → near-duplicate
drop of regenerate samples when ``dedup.near`` (:mod:`regen.sources.neardup`; the first kept
occurrence wins) → per-source limit (reading stops once the limit is reached). Memory: one set of
content hashes, a per-source id map and the near-duplicate index (about 330 bytes per kept
sample). Owns no files. An unusable row never stops a source: it is counted, the
first ``WARNINGS_PER_SOURCE`` of each source are logged as warnings naming the source, row,
field and reason, and a per-source total is logged at the end of the source.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from regen.core.sample import Rejection, Sample
from regen.manifest import Dedup, Filters, Source
from regen.sources.adapters import NativeCheck, iter_source
from regen.sources.neardup import NearDuplicates, NearReport, near_text
from regen.sources.sourceset import SourceSet

log = logging.getLogger(__name__)

#: rejections kept per source as examples for people (all are counted)
EXAMPLES_PER_SOURCE = 5
#: rejections logged as warnings per source (the rest at debug level; all are counted)
WARNINGS_PER_SOURCE = 20


@dataclass(slots=True)
class SourceStats:
    """Counts of one source's rows."""

    name: str
    read: int = 0  #: rows seen (including rejected ones)
    rejected: dict[str, int] = field(default_factory=dict)  #: reason → rows
    filtered: dict[str, int] = field(default_factory=dict)  #: filter name → samples
    duplicates: int = 0  #: exact duplicates dropped (within or across sources)
    near_duplicates: int = 0  #: near-duplicates dropped (of a sample kept earlier)
    kept: int = 0  #: samples passed on
    regenerate_turns: int = 0  #: requests the kept samples need
    native_tokens: int = 0  #: tokens of kept native rows
    limit_reached: bool = False  #: reading stopped at the source's limit
    examples: list[str] = field(default_factory=list)  #: first rejections, as text

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    @property
    def filtered_total(self) -> int:
        return sum(self.filtered.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "rejected": dict(sorted(self.rejected.items())),
            "rejected_total": self.rejected_total,
            "filtered": dict(sorted(self.filtered.items())),
            "duplicates": self.duplicates,
            "near_duplicates": self.near_duplicates,
            "kept": self.kept,
            "regenerate_turns": self.regenerate_turns,
            "native_tokens": self.native_tokens,
            "limit_reached": self.limit_reached,
            "examples": list(self.examples),
        }


@dataclass(slots=True)
class ReadStats:
    """Counts of every source read so far, in manifest order."""

    sources: dict[str, SourceStats] = field(default_factory=dict)
    near: NearReport = field(default_factory=NearReport)  #: near-duplicates by source pair

    def for_source(self, name: str) -> SourceStats:
        if name not in self.sources:
            self.sources[name] = SourceStats(name)
        return self.sources[name]

    def to_dict(self) -> dict[str, Any]:
        return {name: s.to_dict() for name, s in self.sources.items()}


def filter_reason(sample: Sample, filters: Filters) -> str | None:
    """The name of the first filter ``sample`` fails, or None. Native rows are not filtered."""
    if sample.mode == "native":
        return None
    chars = sample.prompt_chars()
    if chars < filters.min_prompt_chars:
        return "min_prompt_chars"
    if filters.max_prompt_chars is not None and chars > filters.max_prompt_chars:
        return "max_prompt_chars"
    if filters.max_turns is not None and sample.assistant_turns() > filters.max_turns:
        return "max_turns"
    return None


def read_samples(
    sources: SourceSet,
    stats: ReadStats | None = None,
    native_check: NativeCheck | None = None,
    *,
    row_warnings: bool = True,
) -> Iterator[Sample]:
    """Filtered, deduplicated, limited samples of all ``sources``, in the manifest's order.

    Each rejected row is a warning (the first :data:`WARNINGS_PER_SOURCE` of a source), or a
    debug line without ``row_warnings`` (a caller that lists them itself, `regen plan`).

    Raises SourceError (naming the source and its manifest field) when a source cannot be read;
    sources before it have already been yielded.
    """
    stats = stats if stats is not None else ReadStats()
    duplicates = Duplicates(sources.dedup, stats)
    for source in sources.sources:
        st = stats.for_source(source.name)
        if source.limit == 0:
            st.limit_reached = True
            continue
        yield from _read_source(sources, source, st, duplicates, native_check, row_warnings)
        _log_source(st, row_warnings)


def _read_source(
    sources: SourceSet,
    source: Source,
    st: SourceStats,
    duplicates: Duplicates,
    native_check: NativeCheck | None,
    row_warnings: bool,
) -> Iterator[Sample]:
    """One source's samples: rows rejected, filtered and duplicates dropped (each counted in
    ``st``), up to its limit."""
    for item in iter_source(sources, source, native_check):
        st.read += 1
        if isinstance(item, Rejection):
            _reject(st, item, row_warnings)
            continue
        reason = filter_reason(item, source.filters)
        if reason:
            st.filtered[reason] = st.filtered.get(reason, 0) + 1
            continue
        if duplicates.drop(item, st):
            continue
        st.kept += 1
        st.regenerate_turns += item.turns_to_regenerate()
        if item.input_ids is not None:
            st.native_tokens += len(item.input_ids)
        yield item
        if source.limit is not None and st.kept >= source.limit:
            st.limit_reached = True
            return


def _reject(st: SourceStats, item: Rejection, row_warnings: bool) -> None:
    """Count an unusable row, keep it as an example while few are, and log it: a warning for
    the first ``WARNINGS_PER_SOURCE`` of a source (with ``row_warnings``), else a debug line."""
    st.rejected[item.reason] = st.rejected.get(item.reason, 0) + 1
    if len(st.examples) < EXAMPLES_PER_SOURCE:
        st.examples.append(str(item))
    if row_warnings and st.rejected_total <= WARNINGS_PER_SOURCE:
        log.warning("skipping %s", item)  # source, row, field, what is wrong
    else:
        log.debug("skipping %s", item)


def _log_source(st: SourceStats, row_warnings: bool) -> None:
    """The end of a source: its near-duplicates and unusable rows, one line each."""
    if st.near_duplicates:
        log.info("source %s: %d near-duplicate prompt(s) dropped", st.name,
                 st.near_duplicates)  # fmt: skip
    if st.rejected:
        reasons = dict(sorted(st.rejected.items()))
        log.log(
            logging.WARNING if row_warnings else logging.DEBUG,
            "source %s: %d row(s) skipped as unusable %s (the others are kept)",
            st.name,
            st.rejected_total,
            reasons,
        )


class Duplicates:
    """The duplicate drop: exact duplicates within and across sources (by
    ``Sample.content_hash``), and near-duplicates of regenerate samples when ``dedup.near``
    (:mod:`regen.sources.neardup`); the first kept occurrence wins."""

    def __init__(self, dedup: Dedup, stats: ReadStats) -> None:
        self.seen: set[str] = set()  #: content hashes kept
        self.near = NearDuplicates(dedup) if dedup.near else None
        self.stats = stats  #: where near-duplicates are reported by source pair

    def drop(self, item: Sample, st: SourceStats) -> bool:
        """Whether ``item`` duplicates a sample kept earlier (counted in ``st``)."""
        h = item.content_hash
        if h in self.seen:
            st.duplicates += 1
            return True
        self.seen.add(h)
        if self.near is None or item.mode != "regenerate":
            return False
        text = near_text(item)
        match = self.near.match_or_add(item, text)
        if match is None:
            return False
        st.near_duplicates += 1
        self.stats.near.add(item, match, text)
        log.debug("%s is a near-duplicate of %s (%.2f)", item.id, match.id,
                  match.similarity)  # fmt: skip
        return True
