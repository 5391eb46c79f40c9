"""The records of a run's numbers: what `regen status` prints and the dashboard shows.

:class:`RunNumbers` holds the whole picture (its :meth:`RunNumbers.to_dict` is `regen status
--json`): per source :class:`SourceNumbers`, per endpoint :class:`EndpointNumbers`, the rates
(:class:`Rate`), the ETA (:class:`Eta`), the errors (:class:`ErrorNumbers`) and the lock holder
(:class:`Holder`). Computed by :func:`regen.status.numbers.compute`. Owns no files.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

from regen.store.progress import SourceProgress


@dataclass(slots=True)
class Rate:
    window_s: float
    tok_s: float | None  #: None when the series is too short
    span_s: float  #: how much of the window the series covers


@dataclass(slots=True)
class Eta:
    seconds: float
    low_s: float
    high_s: float
    tokens: float  #: remaining completion tokens, estimate
    tokens_low: float
    tokens_high: float
    rate_tok_s: float  #: the rate the estimate divides by
    assumed_sources: list[str]  #: sources estimated from the manifest (no data yet)


class SourceNumbers(SourceProgress):
    """One source as `regen status` shows it: its progress counters less what vanished (a
    view of :class:`regen.store.progress.SourceProgress`; ``flags`` most first), with the
    derived ``remaining``, ``tokens_per_turn`` and ``tokens_per_sample``."""

    name: str = ""

    def to_dict(self) -> dict[str, Any]:
        # ``ended`` always (a file leaves it out when empty; a JSON reader wants the key)
        return {"name": self.name, **self.model_dump(exclude={"name", "pending"}),
                "ended": dict(self.ended),
                **{k: getattr(self, k) for k in (*ALWAYS, *DERIVED)}}  # fmt: skip


#: the derived numbers of a source (and of the whole run) in `regen status --json`
DERIVED = ("remaining", "tokens_per_turn", "tokens_per_sample", "cache_hit_rate")
#: counters a progress file leaves out while 0, always in `regen status --json`
ALWAYS = ("loop_cut", "cut_saved", "cache_prompt_tokens", "cached_tokens")


@dataclass(slots=True)
class ErrorNumbers:
    kind: str
    count: int
    last_message: str
    last_at: float


@dataclass(slots=True)
class EndpointNumbers:
    url: str
    in_flight: int
    healthy: bool | None  #: None: configured but no report yet
    latency_p50_s: float | None
    ok: int
    errors: int
    #: the server's own /metrics: running, queued (every client's), KV usage 0-1 (None: none)
    server_running: float | None = None
    server_queued: float | None = None
    server_kv_usage: float | None = None
    #: the router's state: "up", "half_open", "down", "stalled", "refused" (None: not reported)
    health: str | None = None
    stalls: int = 0  #: requests cancelled as stalled
    #: prompt tokens of the answers whose server reported its prefix cache, and its cached ones
    cache_prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def cache_hit_rate(self) -> float | None:
        """Share of the prompt tokens the server found in its prefix cache (None: it never
        reported it)."""
        return self.cached_tokens / self.cache_prompt_tokens if self.cache_prompt_tokens else None

    @property
    def label(self) -> str:
        """What the views call its state: ``up``, ``stalled``, ``DOWN``, ... (``?``: none)."""
        if self.healthy is None:
            return "?"
        if self.health is None or self.health == "half_open":
            return "up" if self.healthy else "DOWN"
        return self.health if self.health in ("up", "stalled") else self.health.upper()


@dataclass(slots=True)
class Holder:
    """The lock holder, as lock.json describes it."""

    owner: str
    host: str
    pid: int
    session: str
    heartbeat_age_s: float
    alive: bool
    why_gone: str  #: "" when alive


@dataclass(slots=True)
class RunNumbers:
    """Everything `regen status` prints and the dashboard shows."""

    uri: str
    now: float
    name: str
    model: str
    state: str
    state_reason: str
    session: str
    host: str
    pid: int
    run_started_at: float | None
    started_at: float | None
    updated_at: float | None
    elapsed_s: float  #: since the run was created (to now while alive, else to the last update)
    session_elapsed_s: float
    endpoints_configured: list[str]
    #: every source's counters and totals together (the dashboard's TOTAL row)
    overall: SourceProgress
    session_tokens: int  #: completion tokens of this session (last token_series point)
    in_flight: int
    requests: dict[str, int]
    rates: list[Rate]
    eta: Eta | None
    sources: list[SourceNumbers]
    errors: list[ErrorNumbers]
    endpoints: list[EndpointNumbers]
    hist_edges: list[int]
    hist_counts: list[int]
    holder: Holder | None
    last_progress_at: float | None  #: last time completion tokens grew
    #: parts that are missing or damaged (their samples are not counted; see regen verify)
    damaged: list[str] = field(default_factory=list)
    #: the settings ids of the done samples (a ``regen run --force`` mix) -> the fields in
    #: which they differ (run.json ``settings``); empty with one setting or none known
    settings_differ: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def remaining(self) -> int:
        """Samples still to store: each source's remaining, added up (a source with more
        done than planned does not make up for another's)."""
        return sum(s.remaining for s in self.sources)

    @property
    def fraction(self) -> float:
        o = self.overall
        return (o.done + o.failed) / o.total if o.total else 0.0

    def rate(self, window_s: float) -> float | None:
        for r in self.rates:
            if r.window_s == window_s:
                return r.tok_s
        return None

    def to_dict(self) -> dict[str, Any]:
        """`regen status --json`: the run's counters at the top level, each source's in
        ``sources``."""
        d = {f.name: _plain(getattr(self, f.name)) for f in fields(self)
             if f.name not in ("overall", "sources")}  # fmt: skip
        d.update(self.overall.model_dump(exclude={"pending", "regenerate"}))
        d["flags"] = by_count(d["flags"])
        d["ended"] = by_count(self.overall.ended)
        d.update({k: getattr(self.overall, k) for k in (*ALWAYS, "cache_hit_rate")})
        for e, ep in zip(d["endpoints"], self.endpoints, strict=True):
            e["cache_hit_rate"] = ep.cache_hit_rate
        d["remaining"] = self.remaining
        d["sources"] = [s.to_dict() for s in self.sources]
        d["fraction"] = self.fraction
        return d


def by_count(flags: dict[str, int]) -> dict[str, int]:
    """Flags with a positive count, most first (ties in name order)."""
    return dict(sorted(((k, v) for k, v in flags.items() if v > 0), key=lambda kv: (-kv[1], kv[0])))


def _plain(v: Any) -> Any:
    return asdict(v) if is_dataclass(v) and not isinstance(v, type) else (
        [_plain(x) for x in v] if isinstance(v, list) else v)  # fmt: skip
