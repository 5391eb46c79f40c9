"""The numbers of a run from its run directory: shared by `regen status` and the dashboard.

Reads, per refresh tick, three small files of the run directory and nothing else (files
named in :mod:`regen.store.layout`): the progress snapshot (regen.store.progress),
the lock (LockRecord) and run.json (RunRecord). Once (retried while absent) it reads the
manifest, for the per-source ``output_tokens`` planning assumption (used for sources that have
no finished sample yet), together with the plan (PlanRecord) for the expected regenerated
turns per sample.

**Parts that vanished.** The progress file counts what the driver stored, but a part can be
deleted or damaged afterwards (a storage fault, a partial copy). So every
``RECONCILE_EVERY_S`` (and on the first tick; ``regen status`` reads once) the view also lists
``parts/`` — one listing call, never a Parquet file — and reads the record of each part it has
not seen yet (records never change, so each is read once). A part counts when its file is
listed with the size its record says. Per source, what the progress file (read just before
the listing) counts beyond the counted parts plus its ``pending`` samples (journaled, not yet
in a part) is the deficit: the samples of parts that vanished. Until the next listing every
tick shows the progress counters less that deficit, and names the parts missing or of the
wrong size. While some listed part has no record yet (a part being written, or a run
directory from before records) no deficit is computed.

Definitions (all pure functions of those files and ``now``):

- rates: completion tokens per second over the last 1, 5 and 15 minutes of ``token_series``,
  ending at its last point (shorter when the session is younger; ``span_s`` says how long);
- clocks: heartbeats, progress and token times are the driver's clock, ``now`` the reader's;
  when the driver ran on another host, ``CLOCK_SKEW_S`` is added to the stale and stall limits;
- state: ``unknown`` (the progress file is damaged, or missing beside stored parts while no
  session holds the lock: the numbers shown are what the part records hold, with the plan's
  totals, and the reason says to run ``regen verify --repair``, which rebuilds it; never read
  as an empty run); ``running``; ``stalled`` (holder
  alive but no new completion tokens for
  ``stall_after_s``); ``dead`` (progress says running but the lock holder is gone: lock missing,
  or gone by the lock's one staleness rule, regen.store.lock.why_gone); ``finished`` /
  ``interrupted`` / ``failed`` (as the driver last wrote); ``starting`` / ``empty`` (no
  progress file yet, holder alive / not);
- ETA: remaining samples per source (total - done - failed) x observed completion tokens per
  sample of that source (when it has none yet: manifest ``output_tokens`` per TURN x expected
  turns per sample = the plan's ``regenerate_turns / regenerate_todo``, else 1 when the
  manifest says ``turns: last``, else 1 — a labelled underestimate for multi-turn sources),
  divided by the recent rate (5 min, else 15, else 1). The band combines the spread of the
  three rates with the uncertainty of each source's mean length (coefficient of variation from
  ``output_tokens_hist`` / sqrt(turns seen), two sigma, capped at 50 %).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

from regen.core.errors import RunDirError
from regen.store import RunDir, layout
from regen.store.counts import SourceCounts
from regen.store.layout import LockRecord, PartRecord, RunRecord
from regen.store.lock import CLOCK_SKEW_S, fmt_age, pid_is_alive, read_lock, why_gone
from regen.store.progress import VERSION as PROGRESS_VERSION
from regen.store.progress import ProgressSnapshot, SourceProgress
from regen.store.run import read_manifest_data

log = logging.getLogger(__name__)

#: no new completion tokens for this long while the holder lives = stalled
STALL_AFTER_S = 300.0
#: the rate windows, seconds
RATE_WINDOWS_S = (60.0, 300.0, 900.0)
#: a rate needs at least this much series span
MIN_RATE_SPAN_S = 10.0
#: planning assumption (output tokens per turn) when the manifest does not say
DEFAULT_OUTPUT_TOKENS = (600, 1400)
#: two-sigma band on a source's mean length, never wider than this fraction
MAX_LENGTH_REL = 0.5
#: seconds between two listings of parts/ by a refreshing view
RECONCILE_EVERY_S = 30.0


# ---- reading the run directory (the one place that touches files) ---------------------------


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
            check = self.check_parts()  # listed after the progress file was read: see deficit
            check.deficit = deficit(progress, check.stored)
            self._last_check = check
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


# ---- the numbers ----------------------------------------------------------------------------


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
        d["flags"] = _by_count(d["flags"])
        d["ended"] = _by_count(self.overall.ended)
        d.update({k: getattr(self.overall, k) for k in (*ALWAYS, "cache_hit_rate")})
        for e, ep in zip(d["endpoints"], self.endpoints, strict=True):
            e["cache_hit_rate"] = ep.cache_hit_rate
        d["remaining"] = self.remaining
        d["sources"] = [s.to_dict() for s in self.sources]
        d["fraction"] = self.fraction
        return d


def read_holder(
    lock: LockRecord | None,
    now: float,
    *,
    hostname: str | None = None,
    pid_alive: Callable[[int], bool] = pid_is_alive,
) -> Holder | None:
    """The lock holder and whether it is alive (the lock's one rule: regen.store.lock.why_gone)."""
    if lock is None:
        return None
    why = why_gone(lock, now, hostname=hostname, pid_alive=pid_alive)
    return Holder(
        owner=lock.owner,
        host=lock.host,
        pid=lock.pid,
        session=lock.session,
        heartbeat_age_s=lock.age(now),
        alive=not why,
        why_gone=why,
    )


def window_rate(series: list[tuple[float, int]], window_s: float) -> Rate:
    """Tokens/s over the last ``window_s`` of the series (linear between points)."""
    if len(series) < 2:
        return Rate(window_s, None, 0.0)
    t_end, v_end = series[-1]
    t0 = max(t_end - window_s, series[0][0])
    span = t_end - t0
    if span < MIN_RATE_SPAN_S:
        return Rate(window_s, None, span)
    return Rate(window_s, max(0.0, (v_end - _value_at(series, t0)) / span), span)


def _value_at(series: list[tuple[float, int]], t: float) -> float:
    prev_t, prev_v = series[0]
    if t <= prev_t:
        return float(prev_v)
    for cur_t, cur_v in series[1:]:
        if cur_t >= t:
            if cur_t == prev_t:
                return float(cur_v)
            return prev_v + (cur_v - prev_v) * (t - prev_t) / (cur_t - prev_t)
        prev_t, prev_v = cur_t, cur_v
    return float(prev_v)


def last_growth_at(series: list[tuple[float, int]]) -> float | None:
    """The time of the last series point whose value grew (the first point when none grew)."""
    if not series:
        return None
    for (_, v0), (t1, v1) in zip(reversed(series[:-1]), reversed(series[1:]), strict=True):
        if v1 > v0:
            return t1
    return series[0][0]


def length_cv(edges: list[int], counts: list[int]) -> float:
    """Coefficient of variation of the output lengths in the histogram (1.0 with no data)."""
    n = sum(counts)
    if n == 0:
        return 1.0
    mids = []
    for i in range(len(counts)):
        lo = edges[i]
        hi = edges[i + 1] if i + 1 < len(edges) else lo * 1.5 or 1
        mids.append((lo + hi) / 2)
    mean = sum(m * c for m, c in zip(mids, counts, strict=True)) / n
    if mean <= 0:
        return 1.0
    var = sum(c * (m - mean) ** 2 for m, c in zip(mids, counts, strict=True)) / n
    return math.sqrt(var) / mean


def estimate_eta(
    sources: list[SourceNumbers],
    rates: list[Rate],
    assumptions: dict[str, tuple[int, int]],
    cv: float,
    turns: dict[str, float] | None = None,
) -> Eta | None:
    """Remaining tokens (with a band) over the recent rate (with a band); None without a rate.

    ``assumptions`` are output tokens per regenerated TURN; ``turns`` the expected turns per
    sample (1 for sources not listed).
    """
    tok = tok_lo = tok_hi = 0.0
    assumed = []
    for s in sources:
        if not s.regenerate or s.remaining == 0:
            continue
        if s.tokens_per_sample is not None and s.rows > 0:
            rel = min(MAX_LENGTH_REL, 2.0 * cv / math.sqrt(s.rows))
            mid = s.tokens_per_sample
            lo, hi = mid * (1 - rel), mid * (1 + rel)
        else:
            per_turn = assumptions.get(s.name, DEFAULT_OUTPUT_TOKENS)
            k = (turns or {}).get(s.name, 1.0)
            lo, hi = per_turn[0] * k, per_turn[1] * k
            mid = (lo + hi) / 2
            assumed.append(s.name)
        tok += s.remaining * mid
        tok_lo += s.remaining * lo
        tok_hi += s.remaining * hi
    by_window = {r.window_s: r.tok_s for r in rates if r.tok_s}
    if tok == 0:
        rate = by_window.get(300.0) or next(iter(by_window.values()), 0.0)
        return Eta(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, rate or 0.0, assumed)
    if not by_window:
        return None
    rate = by_window.get(300.0) or by_window.get(900.0) or by_window[min(by_window)]
    r_lo, r_hi = min(by_window.values()), max(by_window.values())
    return Eta(
        seconds=tok / rate,
        low_s=tok_lo / r_hi,
        high_s=tok_hi / r_lo,
        tokens=tok,
        tokens_low=tok_lo,
        tokens_high=tok_hi,
        rate_tok_s=rate,
        assumed_sources=assumed,
    )


def run_state(
    p: ProgressSnapshot | None,
    holder: Holder | None,
    growth: float | None,
    now: float,
    stall_limit: float,
    progress_error: str = "",
) -> tuple[str, str]:
    """The run's state and why (the module docstring's definitions): from the progress file's
    last state (``progress_error``: why it could not be read, and what to do), the lock holder,
    the last time completion tokens grew and ``now``."""
    if progress_error:
        return "unknown", progress_error
    alive = holder is not None and holder.alive
    new_session = holder is not None and bool(holder.session) and p is not None and (
        holder.session != p.session)  # fmt: skip
    if p is None:
        return ("starting" if alive else "empty"), f"no {layout.PROGRESS} yet"
    if p.state != "running":
        if alive and new_session:
            assert holder is not None
            return "starting", f"new session {holder.session} (last: {p.state})"
        return p.state, ""
    last = max(growth or p.started_at, p.started_at)
    if not alive:
        return "dead", holder.why_gone if holder else f"{layout.LOCK} is gone"
    if new_session:
        assert holder is not None
        return "starting", f"new session {holder.session}"
    if now - last > stall_limit:
        return "stalled", f"no new tokens for {fmt_age(now - last)}"
    if now - p.updated_at > stall_limit:
        return "stalled", f"{layout.PROGRESS} not updated for {fmt_age(now - p.updated_at)}"
    return "running", ""


def compute(
    files: RunFiles,
    *,
    now: float,
    assumptions: dict[str, tuple[int, int]] | None = None,
    turns: dict[str, float] | None = None,
    uri: str = "",
    stall_after_s: float = STALL_AFTER_S,
    hostname: str | None = None,
    pid_alive: Callable[[int], bool] = pid_is_alive,
) -> RunNumbers:
    """All numbers of a run from what one refresh read; ``now`` is injected (epoch seconds)."""
    p = files.progress
    run = files.run
    holder = read_holder(files.lock, now, hostname=hostname, pid_alive=pid_alive)
    series = p.token_series if p else []
    growth = last_growth_at(series)
    local = p is not None and p.host == (socket.gethostname() if hostname is None else hostname)
    stall_limit = stall_after_s + (0.0 if local else CLOCK_SKEW_S)
    state, reason = run_state(p, holder, growth, now, stall_limit, files.progress_error)

    check = files.parts
    per_source = p.sources if p else files.fallback
    srcs = [shown(name, sp, check.deficit.get(name) if check else None)
            for name, sp in per_source.items()]  # fmt: skip
    overall = SourceProgress.sum(srcs)
    overall.flags, overall.ended = _by_count(overall.flags), _by_count(overall.ended)
    rates = [window_rate(series, w) for w in RATE_WINDOWS_S]
    edges = list(p.output_tokens_hist.edges) if p else []
    counts = list(p.output_tokens_hist.counts) if p else []
    eta = estimate_eta(srcs, rates, assumptions or {}, length_cv(edges, counts), turns)
    if (
        state in ("dead", "failed", "interrupted", "finished")
        and eta is not None
        and eta.tokens > 0
    ):
        eta = None  # nobody is working on it: no time estimate

    # endpoints: what the driver reported, plus configured ones it did not report
    live = state in ("running", "stalled", "starting")
    eps = [
        EndpointNumbers(
            e.url,
            e.in_flight if live else 0,
            e.healthy,
            e.latency_p50_s,
            e.ok,
            e.errors,
            *((e.server_running, e.server_queued, e.server_kv_usage) if live else (None,) * 3),
            health=e.health,
            stalls=e.stalls,
            cache_prompt_tokens=e.cache_prompt_tokens,
            cached_tokens=e.cached_tokens,
        )
        for e in (p.endpoints if p else [])
    ]
    configured = list(p.endpoints_configured) if p else list(run.endpoints if run else [])
    seen = {e.url for e in eps}
    eps += [EndpointNumbers(u, 0, None, None, 0, 0) for u in configured if u not in seen]

    end = now if live or p is None else p.updated_at
    run_start = p.run_started_at if p else (run.created_at if run else None)
    return RunNumbers(
        uri=uri,
        now=now,
        name=p.name if p else (run.name if run else ""),
        model=p.model if p else (run.model if run else ""),
        state=state,
        state_reason=reason,
        session=p.session if p else "",
        host=p.host if p else "",
        pid=p.pid if p else 0,
        run_started_at=run_start,
        started_at=p.started_at if p else None,
        updated_at=p.updated_at if p else None,
        elapsed_s=max(0.0, end - run_start) if run_start else 0.0,
        session_elapsed_s=max(0.0, end - p.started_at) if p else 0.0,
        endpoints_configured=configured,
        overall=overall,
        session_tokens=series[-1][1] if series else 0,
        in_flight=p.in_flight if p and live else 0,
        requests={
            "sent": p.requests.sent if p else 0,
            "ok": p.requests.ok if p else 0,
            "retried": p.requests.retried if p else 0,
            "failed": p.requests.failed if p else 0,
        },
        rates=rates,
        eta=eta,
        sources=srcs,
        errors=sorted(
            (ErrorNumbers(k, e.count, e.last_message, e.last_at) for k, e in p.errors.items())
            if p
            else [],
            key=lambda e: (-e.count, e.kind),
        ),
        endpoints=eps,
        hist_edges=edges,
        hist_counts=counts,
        holder=holder,
        last_progress_at=growth,
        damaged=list(check.damaged) if check else [],
        settings_differ=settings_differ(overall.settings, run),
    )


def settings_differ(samples: dict[str, int], run: RunRecord | None) -> dict[str, dict[str, Any]]:
    """For the settings ids the samples carry, when there are several: each id's values of the
    fields in which they differ (from run.json; an id it does not describe has none)."""
    if len(samples) < 2:
        return {}
    known = run.settings if run is not None else {}
    fields_of = {sid: known.get(sid, {}) for sid in samples}
    names = sorted({k for f in fields_of.values() for k in f})
    differ = [k for k in names if len({repr(f.get(k)) for f in fields_of.values()}) > 1]
    return {sid: {k: f.get(k) for k in differ} for sid, f in fields_of.items()}


def _by_count(flags: dict[str, int]) -> dict[str, int]:
    """Flags with a positive count, most first (ties in name order)."""
    return dict(sorted(((k, v) for k, v in flags.items() if v > 0), key=lambda kv: (-kv[1], kv[0])))


def _plain(v: Any) -> Any:
    return asdict(v) if is_dataclass(v) and not isinstance(v, type) else (
        [_plain(x) for x in v] if isinstance(v, list) else v)  # fmt: skip


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


def shown(name: str, sp: SourceProgress, gap: SourceCounts | None) -> SourceNumbers:
    """Source ``name`` as status shows it: its counters less what vanished (``gap``)."""
    counts = sp.less(*([gap] if gap is not None else []))
    counts.flags, counts.ended = _by_count(counts.flags), _by_count(counts.ended)
    return SourceNumbers(**{**dict(sp), **dict(counts), "name": name, "pending": None})
