"""The progress snapshot: the counters the driver publishes and the dashboard reads.

The record of the run directory's progress file (named in :mod:`regen.store.layout`, read and
written through it like every other file), one JSON object, atomically replaced every ~2 s by
the driver (and once at the end of a session)::

    {
      "version": 1,
      "name": str, "model": str, "session": str, "host": str, "pid": int,
      "state": "running" | "finished" | "interrupted" | "failed",
      "run_started_at": float, "started_at": float, "updated_at": float,   # epoch seconds
      "endpoints_configured": [str],
      "sources": {name: {"total", "done", "failed", "truncated", "rows",
                         "prompt_tokens", "completion_tokens": int, "regenerate": bool,
                         "flagged", "retried", "retrying": int, "flags": {flag: int},
                         "pending": {"done", "rows", "truncated", "prompt_tokens",
                                     "completion_tokens", "flagged", "retried": int,
                                     "flags": {flag: int}},
                         "stale": {the same counters}?, "settings": {id: int}?}},
      "in_flight": int,
      "requests": {"sent", "ok", "retried", "failed": int},                 # the whole run
      "token_series": [[t, cumulative_completion_tokens], ...],             # this session
      "errors": {kind: {"count": int, "last_message": str, "last_at": float}},
      "endpoints": [{"url": str, "in_flight": int, "healthy": bool,
                     "health": "up" | "half_open" | "down" | "stalled" | "refused"?,
                     "stalls": int?,                # requests cancelled as stalled
                     "latency_p50_s": float | null, "ok": int, "errors": int,
                     "server_running", "server_queued", "server_kv_usage":
                         float | null,                       # the server's /metrics
                     "cache_prompt_tokens", "cached_tokens": int?}],  # its prefix cache
      "output_tokens_hist": {"edges": [int, ...], "counts": [int, ...]}
    }

Source counters (:class:`SourceProgress`: the one counter type,
:class:`regen.store.counts.SourceCounts`, plus the plan's totals) are cumulative over every
session of the run directory and describe each sample's latest answer (a sample answered again
by ``regen run --retry-flagged`` counts its new rows, tokens and flags instead of the old ones;
``retried`` counts those new attempts): ``flagged`` samples have a row with a quality flag,
``flags`` counts rows per flag (regen.quality), ``retrying`` is the new attempts this session
planned and has not stored yet (part of what remains). ``pending`` is the part of them
journaled but not yet in a Parquet part (the rest is in the parts, whose records say how much
each holds: that is how a reader notices a part that vanished, see regen.status); a file
without it (an older writer) reads it as None: unknown. ``stale`` counts the stored answers
the latest plan no longer wants (regen.store.stale: their source row was edited or left the
plan): they are in the parts but not in the counters above, and never exported; written only
when there is one. ``settings`` counts done samples per settings id (regen.engine.rows).
``requests``, ``errors``, each endpoint's ``ok`` and ``errors``, and ``output_tokens_hist``
cover the whole run (a session starts from what the last one wrote; an endpoint it is still
given but has not reported keeps its record as last seen, one it is no longer given is gone);
``token_series`` covers the current session only.
``token_series`` holds one point per ~5 s, trimmed to the last ~20 min (at most 300 points):
:meth:`ProgressSnapshot.add_token_point` does that. ``output_tokens_hist`` counts completion
tokens per regenerated turn; ``edges`` are the lower bounds of the bins (``counts[i]`` counts
values in ``[edges[i], edges[i+1])``, the last bin is open-ended, so both lists have the same
length). A reader also accepts ``len(edges) == len(counts) + 1`` (closed bins, values past the
last edge counted in the last bin).

Reading is strict about what it knows (a wrong version, state or type, a missing field is a
:class:`regen.core.errors.RunDirError` naming the field) and tolerant of what it does not: fields a
file written before them lacks read as 0 (empty), and keys a newer writer added are ignored,
so a dashboard of another regen version still reads the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, Strict, ValidationInfo, field_validator, model_validator

from regen.core.jsontext import JsonValue
from regen.store.counts import CountsModel, SourceCounts

VERSION = 1
State = Literal["running", "finished", "interrupted", "failed"]

#: token_series: one point per this many seconds, kept for this long, at most this many points
SERIES_STEP_S = 5.0
SERIES_WINDOW_S = 20 * 60.0
SERIES_MAX_POINTS = 300

#: default lower bin bounds of the output-length histogram (completion tokens per turn)
DEFAULT_HIST_EDGES = (
    0, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768
)  # fmt: skip

#: the progress records ignore keys they do not know (a newer writer's)
_TOLERANT = ConfigDict(extra="ignore", strict=True)


class ProgressModel(CountsModel):
    """A part of the progress record: strict values, unknown keys ignored, and
    ``FILE_DEFAULTS`` for keys a file written before them lacks."""

    model_config = _TOLERANT

    #: values of keys a file lacks (an older writer), where they differ from the defaults
    FILE_DEFAULTS: ClassVar[dict[str, JsonValue]] = {}

    @model_validator(mode="before")
    @classmethod
    def _file_defaults(cls, data: object, info: ValidationInfo) -> object:
        if info.mode == "json" and isinstance(data, dict) and cls.FILE_DEFAULTS:
            return {**cls.FILE_DEFAULTS, **data}
        return data


class SourceProgress(SourceCounts):
    """Cumulative counters of one source (:class:`SourceCounts`) and the plan's totals."""

    model_config = _TOLERANT
    REQUIRED: ClassVar[tuple[str, ...]] = (*SourceCounts.REQUIRED, "total", "failed", "regenerate")

    #: samples planned
    total: int = 0
    #: permanent failures currently recorded
    failed: int = 0
    #: False for native (pass-through) sources
    regenerate: bool = True
    #: new attempts this session still has to store
    retrying: int = 0
    #: the part of the counters not yet in a part (None: unknown, an older writer)
    pending: SourceCounts | None = Field(default_factory=SourceCounts,
                                         exclude_if=lambda v: v is None)  # fmt: skip
    #: stored answers the latest plan no longer wants (regen.store.stale): in the parts, not
    #: in the counters above
    stale: SourceCounts = Field(default_factory=SourceCounts, exclude_if=lambda v: v.is_zero)

    @model_validator(mode="before")
    @classmethod
    def _pending_unknown(cls, data: object, info: ValidationInfo) -> object:
        """A file without ``pending`` was written before it: unknown, not zero."""
        if info.mode == "json" and isinstance(data, dict) and "pending" not in data:
            return {**data, "pending": None}
        return data

    @property
    def remaining(self) -> int:
        """Samples still to store: planned less done and failed, plus new attempts to go."""
        return max(0, self.total - self.done - self.failed) + self.retrying

    @classmethod
    def sum(cls, many: Iterable[SourceProgress]) -> SourceProgress:
        """The counters and totals of several sources together (``pending``: None)."""
        out = cls(pending=None)
        for s in many:
            out.add(s)
            out.total += s.total
            out.failed += s.failed
            out.retrying += s.retrying
            out.stale.add(s.stale)
        return out


class RequestCounts(ProgressModel):
    """Requests of the run (all sessions)."""

    REQUIRED: ClassVar[tuple[str, ...]] = ("sent", "ok", "retried", "failed")

    sent: int = 0
    ok: int = 0
    retried: int = 0
    failed: int = 0


class ErrorInfo(ProgressModel):
    """One error class: how often, and the latest message."""

    REQUIRED: ClassVar[tuple[str, ...]] = ("count", "last_message", "last_at")

    count: int = 0
    last_message: str = ""
    last_at: float = 0.0

    def add(self, message: str, at: float) -> None:
        """One more error of this class; its message (first 500 characters) is the latest."""
        self.count += 1
        self.last_message = message[:500]
        self.last_at = float(at)


class EndpointProgress(ProgressModel):
    """One endpoint as the router sees it now."""

    REQUIRED: ClassVar[tuple[str, ...]] = (
        "url", "in_flight", "healthy", "latency_p50_s", "ok", "errors"
    )  # fmt: skip

    url: str
    in_flight: int = 0
    healthy: bool = True
    #: the router's state (regen.engine.router; the worst any worker reports); None: an older writer
    health: str | None = None
    stalls: int = 0  #: requests cancelled as stalled (regen.engine.stall)
    latency_p50_s: float | None = None
    ok: int = 0
    errors: int = 0
    #: the server's own last /metrics reading, every client's requests (None: no page read)
    server_running: float | None = None
    server_queued: float | None = None
    server_kv_usage: float | None = None  #: 0 to 1
    #: prompt tokens of the answers whose server reported its prefix cache, and the cached
    #: tokens it reported (the whole run): the endpoint's cache-hit rate is their ratio;
    #: written only when the server reported it
    cache_prompt_tokens: int = Field(default=0, exclude_if=lambda v: not v)
    cached_tokens: int = Field(default=0, exclude_if=lambda v: not v)


class OutputHistogram(ProgressModel):
    """Completion tokens per turn; ``edges`` are lower bin bounds (last bin open-ended)."""

    REQUIRED: ClassVar[tuple[str, ...]] = ("edges", "counts")

    edges: list[int] = Field(default_factory=lambda: list(DEFAULT_HIST_EDGES))
    counts: list[int] = Field(default_factory=lambda: [0] * len(DEFAULT_HIST_EDGES))

    @model_validator(mode="after")
    def _lengths(self) -> OutputHistogram:
        if len(self.counts) not in (len(self.edges), len(self.edges) - 1):
            raise ValueError("edges/counts length mismatch")
        return self

    def add(self, tokens: int, n: int = 1) -> None:
        """Count ``n`` turns of ``tokens`` completion tokens."""
        i = 0
        for j, lo in enumerate(self.edges[: len(self.counts)]):
            if tokens >= lo:
                i = j
        self.counts[i] += n

    @property
    def total(self) -> int:
        return sum(self.counts)


class ProgressSnapshot(ProgressModel):
    """The content of ``progress.json`` (see the module docstring for the exact shape)."""

    REQUIRED: ClassVar[tuple[str, ...]] = (
        "version", "name", "model", "session", "host", "pid", "state", "run_started_at",
        "started_at", "updated_at", "sources", "in_flight", "requests",
    )  # fmt: skip
    #: a file without a histogram has none (not the default bins)
    FILE_DEFAULTS: ClassVar[dict[str, JsonValue]] = {
        "output_tokens_hist": {"edges": [], "counts": []}
    }

    version: int = VERSION
    name: str
    model: str
    session: str
    host: str
    pid: int
    state: State = "running"
    run_started_at: float = 0.0
    started_at: float = 0.0
    updated_at: float = 0.0
    endpoints_configured: list[str] = Field(default_factory=list)
    sources: dict[str, SourceProgress] = Field(default_factory=dict)
    in_flight: int = 0
    requests: RequestCounts = Field(default_factory=RequestCounts)
    #: [t, tokens] pairs (a JSON array each)
    token_series: list[Annotated[tuple[float, int], Strict(False)]] = Field(default_factory=list)
    errors: dict[str, ErrorInfo] = Field(default_factory=dict)
    endpoints: list[EndpointProgress] = Field(default_factory=list)
    output_tokens_hist: OutputHistogram = Field(default_factory=OutputHistogram)

    @field_validator("version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v != VERSION:
            raise ValueError(f"version {v} not supported (want {VERSION})")
        return v

    @classmethod
    def check_file(cls, data: Mapping[str, object]) -> None:
        """A file of another version is refused as that, whatever else it holds."""
        if "version" in data and data["version"] != VERSION:
            raise ValueError(f"version {data['version']!r} not supported (want {VERSION})")

    # ---- writer helpers (driver side) ----

    def add_token_point(self, t: float, cumulative_tokens: int, *, force: bool = False) -> None:
        """Append a point when ~5 s passed since the last one (or ``force``); trim old points."""
        s = self.token_series
        if s and not force and t - s[-1][0] < SERIES_STEP_S:
            return
        s.append((float(t), int(cumulative_tokens)))
        cut = t - SERIES_WINDOW_S
        drop = 0
        while drop < len(s) - 1 and s[drop][0] < cut:
            drop += 1
        drop = max(drop, len(s) - SERIES_MAX_POINTS)
        if drop > 0:
            del s[:drop]

    def record_error(self, kind: str, message: str, at: float) -> None:
        """Count one error of class ``kind`` (e.g. ``RegenError.kind``) and keep its message."""
        self.errors.setdefault(kind, ErrorInfo()).add(message, at)

    # ---- totals (reader side) ----

    @property
    def overall(self) -> SourceProgress:
        """Every source's counters and totals together."""
        return SourceProgress.sum(self.sources.values())
