"""The progress snapshot: the counters the driver publishes and the dashboard reads.

The record of the run directory's progress file (named in :mod:`regen.store.layout`), one JSON
object, atomically replaced every ~2 s by the driver (and once at the end of a session)::

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
                                     "flags": {flag: int}}}},
      "in_flight": int,
      "requests": {"sent", "ok", "retried", "failed": int},                 # this session
      "token_series": [[t, cumulative_completion_tokens], ...],             # this session
      "errors": {kind: {"count": int, "last_message": str, "last_at": float}},
      "endpoints": [{"url": str, "in_flight": int, "healthy": bool,
                     "latency_p50_s": float | null, "ok": int, "errors": int}],
      "output_tokens_hist": {"edges": [int, ...], "counts": [int, ...]}
    }

Source counters are cumulative over every session of the run directory and describe each
sample's latest answer (a sample answered again by ``regen run --retry-flagged`` counts its new
rows, tokens and flags instead of the old ones; ``retried`` counts those new attempts):
``flagged`` samples have a row with a quality flag, ``flags`` counts rows per flag
(regen.quality), ``retrying`` is the new attempts this session planned and has not stored yet
(part of what remains). A file written before these fields reads them as 0. ``pending`` is the part
of them journaled but not yet in a Parquet part (the rest is in the parts, whose records say
how much each holds: that is how a reader notices a part that vanished, see regen.status).
``requests`` and ``token_series`` cover the current session only. ``token_series`` holds one
point per ~5 s, trimmed to the last ~20 min (at most 300 points):
:meth:`ProgressSnapshot.add_token_point` does that. ``output_tokens_hist`` counts completion
tokens per regenerated turn; ``edges`` are the lower bounds of the bins (``counts[i]`` counts
values in ``[edges[i], edges[i+1])``, the last bin is open-ended, so both lists have the same
length). A reader also accepts ``len(edges) ==
len(counts) + 1`` (closed bins, values past the last edge counted in the last bin).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from regen.errors import RunDirError
from regen.store.layout import SourceCounts as Pending
from regen.store.layout import add_flag_counts

VERSION = 1
STATES = ("running", "finished", "interrupted", "failed")
State = Literal["running", "finished", "interrupted", "failed"]

#: token_series: one point per this many seconds, kept for this long, at most this many points
SERIES_STEP_S = 5.0
SERIES_WINDOW_S = 20 * 60.0
SERIES_MAX_POINTS = 300

#: default lower bin bounds of the output-length histogram (completion tokens per turn)
DEFAULT_HIST_EDGES = (
    0, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768
)  # fmt: skip


@dataclass(slots=True)
class SourceProgress:
    """Cumulative counters of one source."""

    total: int = 0  #: samples planned
    done: int = 0  #: samples whose rows are stored
    failed: int = 0  #: permanent failures currently recorded
    truncated: int = 0  #: done samples with at least one finish_reason == "length" turn
    rows: int = 0  #: training rows stored (one per regenerated turn)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    regenerate: bool = True  #: False for native (pass-through) sources
    #: the part of the counters not yet in a part (None: unknown, an older writer)
    pending: Pending | None = field(default_factory=Pending)
    flagged: int = 0  #: done samples whose answer has a row with a quality flag
    flags: dict[str, int] = field(default_factory=dict)  #: rows per quality flag
    retried: int = 0  #: new attempts stored (regen run --retry-flagged)
    retrying: int = 0  #: new attempts this session still has to store
    #: samples whose conversation ended early, per reason (regen.engine.turns)
    ended: dict[str, int] = field(default_factory=dict)

    @property
    def remaining(self) -> int:
        return max(0, self.total - self.done - self.failed) + self.retrying

    def add_counts(self, c: Pending) -> None:
        """Add a part's, a journal's or one sample's counters (regen.store.layout.SourceCounts)."""
        self.done += c.done
        self.rows += c.rows
        self.truncated += c.truncated
        self.prompt_tokens += c.prompt_tokens
        self.completion_tokens += c.completion_tokens
        self.flagged += c.flagged
        self.retried += c.retried
        add_flag_counts(self.flags, c.flags)
        add_flag_counts(self.ended, c.ended)


def _pending_dict(p: Pending) -> dict[str, Any]:
    """A pending record as progress.json holds it (``ended`` only when some sample ended)."""
    return p.model_dump(exclude=None if p.ended else {"ended"})


@dataclass(slots=True)
class RequestCounts:
    """Requests of this session."""

    sent: int = 0
    ok: int = 0
    retried: int = 0
    failed: int = 0


@dataclass(slots=True)
class ErrorInfo:
    """One error class: how often, and the latest message."""

    count: int = 0
    last_message: str = ""
    last_at: float = 0.0

    def add(self, message: str, at: float) -> None:
        """One more error of this class; its message (first 500 characters) is the latest."""
        self.count += 1
        self.last_message = message[:500]
        self.last_at = float(at)


@dataclass(slots=True)
class EndpointProgress:
    """One endpoint as the router sees it now."""

    url: str
    in_flight: int = 0
    healthy: bool = True
    latency_p50_s: float | None = None
    ok: int = 0
    errors: int = 0


@dataclass(slots=True)
class OutputHistogram:
    """Completion tokens per turn; ``edges`` are lower bin bounds (last bin open-ended)."""

    edges: list[int] = field(default_factory=lambda: list(DEFAULT_HIST_EDGES))
    counts: list[int] = field(default_factory=lambda: [0] * len(DEFAULT_HIST_EDGES))

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


@dataclass(slots=True)
class ProgressSnapshot:
    """The content of ``progress.json`` (see the module docstring for the exact shape)."""

    name: str
    model: str
    session: str
    host: str
    pid: int
    state: State = "running"
    run_started_at: float = 0.0
    started_at: float = 0.0
    updated_at: float = 0.0
    endpoints_configured: list[str] = field(default_factory=list)
    sources: dict[str, SourceProgress] = field(default_factory=dict)
    in_flight: int = 0
    requests: RequestCounts = field(default_factory=RequestCounts)
    token_series: list[tuple[float, int]] = field(default_factory=list)
    errors: dict[str, ErrorInfo] = field(default_factory=dict)
    endpoints: list[EndpointProgress] = field(default_factory=list)
    output_tokens_hist: OutputHistogram = field(default_factory=OutputHistogram)
    version: int = VERSION

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
    def total(self) -> int:
        return sum(s.total for s in self.sources.values())

    @property
    def done(self) -> int:
        return sum(s.done for s in self.sources.values())

    @property
    def failed(self) -> int:
        return sum(s.failed for s in self.sources.values())

    @property
    def truncated(self) -> int:
        return sum(s.truncated for s in self.sources.values())

    @property
    def completion_tokens(self) -> int:
        return sum(s.completion_tokens for s in self.sources.values())

    # ---- (de)serialization ----

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "name": self.name,
            "model": self.model,
            "session": self.session,
            "host": self.host,
            "pid": self.pid,
            "state": self.state,
            "run_started_at": self.run_started_at,
            "started_at": self.started_at,
            "updated_at": self.updated_at,
            "endpoints_configured": list(self.endpoints_configured),
            "sources": {
                name: {
                    "total": s.total,
                    "done": s.done,
                    "failed": s.failed,
                    "truncated": s.truncated,
                    "rows": s.rows,
                    "prompt_tokens": s.prompt_tokens,
                    "completion_tokens": s.completion_tokens,
                    "regenerate": s.regenerate,
                    "flagged": s.flagged,
                    "flags": dict(s.flags),
                    "retried": s.retried,
                    "retrying": s.retrying,
                    **({"ended": dict(s.ended)} if s.ended else {}),
                    **({} if s.pending is None else {"pending": _pending_dict(s.pending)}),
                }
                for name, s in self.sources.items()
            },
            "in_flight": self.in_flight,
            "requests": {
                "sent": self.requests.sent,
                "ok": self.requests.ok,
                "retried": self.requests.retried,
                "failed": self.requests.failed,
            },
            "token_series": [[t, v] for t, v in self.token_series],
            "errors": {
                k: {"count": e.count, "last_message": e.last_message, "last_at": e.last_at}
                for k, e in self.errors.items()
            },
            "endpoints": [
                {
                    "url": e.url,
                    "in_flight": e.in_flight,
                    "healthy": e.healthy,
                    "latency_p50_s": e.latency_p50_s,
                    "ok": e.ok,
                    "errors": e.errors,
                }
                for e in self.endpoints
            ],
            "output_tokens_hist": {
                "edges": list(self.output_tokens_hist.edges),
                "counts": list(self.output_tokens_hist.counts),
            },
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "progress snapshot") -> ProgressSnapshot:
        """Parse the JSON shape; a wrong version or a missing/mistyped field is a RunDirError
        whose message starts with ``where`` (the file's name, when read from one)."""
        if not isinstance(d, dict):
            raise RunDirError(f"{where}: expected an object, got {type(d).__name__}")
        r = _Reader(d, where)
        version = r.integer("version")
        if version != VERSION:
            raise RunDirError(f"{where}: version {version} not supported (want {VERSION})")
        state = r.string("state")
        if state not in STATES:
            raise RunDirError(f"{where}: state: unknown value {state!r}")
        sources = {}
        for name, s in r.mapping("sources").items():
            sr = _Reader(s, f"{where}: sources.{name}")
            pending = None
            if "pending" in sr.d:
                pr = _Reader(sr.mapping("pending"), f"{where}: sources.{name}.pending")
                keys = ("done", "rows", "truncated", "prompt_tokens", "completion_tokens")
                pending = Pending(
                    **{k: pr.integer(k) for k in keys},
                    **{k: pr.integer(k, 0) for k in ("flagged", "retried")},
                    flags=pr.counts("flags"),
                    ended=pr.counts("ended"),
                )
            sources[str(name)] = SourceProgress(
                flagged=sr.integer("flagged", 0),
                flags=sr.counts("flags"),
                retried=sr.integer("retried", 0),
                retrying=sr.integer("retrying", 0),
                ended=sr.counts("ended"),
                pending=pending,
                total=sr.integer("total"),
                done=sr.integer("done"),
                failed=sr.integer("failed"),
                truncated=sr.integer("truncated"),
                rows=sr.integer("rows"),
                prompt_tokens=sr.integer("prompt_tokens"),
                completion_tokens=sr.integer("completion_tokens"),
                regenerate=sr.flag("regenerate"),
            )
        rq = _Reader(r.mapping("requests"), f"{where}: requests")
        errors = {}
        for kind, e in r.mapping("errors", {}).items():
            er = _Reader(e, f"{where}: errors.{kind}")
            errors[str(kind)] = ErrorInfo(
                count=er.integer("count"),
                last_message=er.string("last_message"),
                last_at=er.number("last_at"),
            )
        endpoints = []
        for i, e in enumerate(r.array("endpoints", [])):
            er = _Reader(e, f"{where}: endpoints.{i}")
            p50 = er.get("latency_p50_s")
            endpoints.append(
                EndpointProgress(
                    url=er.string("url"),
                    in_flight=er.integer("in_flight"),
                    healthy=er.flag("healthy"),
                    latency_p50_s=None if p50 is None else er.number("latency_p50_s"),
                    ok=er.integer("ok"),
                    errors=er.integer("errors"),
                )
            )
        series = []
        for i, pt in enumerate(r.array("token_series", [])):
            if not (isinstance(pt, list | tuple) and len(pt) == 2):
                raise RunDirError(f"{where}: token_series.{i}: expected [t, tokens]")
            series.append((float(pt[0]), int(pt[1])))
        hr = _Reader(r.mapping("output_tokens_hist", {"edges": [], "counts": []}), where)
        edges = [int(x) for x in hr.array("edges")]
        counts = [int(x) for x in hr.array("counts")]
        if len(counts) not in (len(edges), len(edges) - 1):
            raise RunDirError(f"{where}: output_tokens_hist: edges/counts length mismatch")
        return cls(
            version=version,
            name=r.string("name"),
            model=r.string("model"),
            session=r.string("session"),
            host=r.string("host"),
            pid=r.integer("pid"),
            state=state,  # type: ignore[arg-type]
            run_started_at=r.number("run_started_at"),
            started_at=r.number("started_at"),
            updated_at=r.number("updated_at"),
            endpoints_configured=[str(x) for x in r.array("endpoints_configured", [])],
            sources=sources,
            in_flight=r.integer("in_flight"),
            requests=RequestCounts(
                sent=rq.integer("sent"),
                ok=rq.integer("ok"),
                retried=rq.integer("retried"),
                failed=rq.integer("failed"),
            ),
            token_series=series,
            errors=errors,
            endpoints=endpoints,
            output_tokens_hist=OutputHistogram(edges=edges, counts=counts),
        )


_MISSING = object()


class _Reader:
    """Typed access to one JSON object; failures name the file and the field."""

    __slots__ = ("d", "where")

    def __init__(self, d: Any, where: str) -> None:
        if not isinstance(d, dict):
            raise RunDirError(f"{where}: expected an object, got {type(d).__name__}")
        self.d = d
        self.where = where

    def get(self, key: str, default: Any = _MISSING) -> Any:
        if key in self.d:
            return self.d[key]
        if default is _MISSING:
            raise RunDirError(f"{self.where}: missing field {key!r}")
        return default

    def _bad(self, key: str, want: str) -> RunDirError:
        got = type(self.d.get(key)).__name__
        return RunDirError(f"{self.where}: field {key!r}: expected {want}, got {got}")

    def integer(self, key: str, default: Any = _MISSING) -> int:
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._bad(key, "an integer")
        return v

    def counts(self, key: str) -> dict[str, int]:
        """``{name: int}`` (missing: empty)."""
        m = _Reader(self.mapping(key, {}), f"{self.where}.{key}")
        return {str(k): m.integer(k) for k in m.d}

    def number(self, key: str) -> float:
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self._bad(key, "a number")
        return float(v)

    def string(self, key: str) -> str:
        v = self.get(key)
        if not isinstance(v, str):
            raise self._bad(key, "a string")
        return v

    def flag(self, key: str) -> bool:
        v = self.get(key)
        if not isinstance(v, bool):
            raise self._bad(key, "true/false")
        return v

    def mapping(self, key: str, default: Any = _MISSING) -> dict[str, Any]:
        v = self.get(key, default)
        if not isinstance(v, dict):
            raise self._bad(key, "an object")
        return v

    def array(self, key: str, default: Any = _MISSING) -> list[Any]:
        v = self.get(key, default)
        if not isinstance(v, list):
            raise self._bad(key, "a list")
        return v
