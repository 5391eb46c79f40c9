"""Plain one-line summaries of a run for logs (when stdout is not a terminal, e.g. ray job)."""

from __future__ import annotations

from monitor.render import fmt_duration, fmt_endpoints, fmt_int, fmt_tokens, top_flags
from regen.status import RunNumbers


def log_line(n: RunNumbers) -> str:
    """``name state done/total (pct) failed trunc flagged | tok/s 1m/5m/15m | in-flight | ETA |
    errors``."""
    rates = "/".join("—" if r.tok_s is None else f"{r.tok_s:,.0f}" for r in n.rates)
    if n.state == "finished" and n.remaining == 0:
        eta = "done"
    elif n.eta is None:
        eta = "—"
    else:
        eta = (
            f"{fmt_duration(n.eta.seconds)} "
            f"[{fmt_duration(n.eta.low_s)}–{fmt_duration(n.eta.high_s)}]"
        )
    errors = sum(e.count for e in n.errors)
    top = f" (top {n.errors[0].kind} x{fmt_int(n.errors[0].count)})" if n.errors else ""
    state = n.state + (f" ({n.state_reason})" if n.state_reason else "")
    eps = fmt_endpoints(n)
    o = n.overall
    return (
        f"{n.name} {state} | {fmt_int(o.done)}/{fmt_int(o.total)} ({100 * n.fraction:.1f}%) "
        f"failed {fmt_int(o.failed)} trunc {fmt_int(o.truncated)} flagged {fmt_int(o.flagged)}"
        + (f" ({top_flags(o.flags)})" if o.flags else "")
        + (f" new attempts {fmt_int(o.retried)}+{fmt_int(o.retrying)}" if o.retrying else "")
        + (
            f" loops cut {fmt_int(o.loop_cut)} ({fmt_tokens(o.cut_saved)} tok spared)"
            if o.loop_cut
            else ""
        )
        + (f" cache {100 * o.cache_hit_rate:.0f}%" if o.cache_hit_rate is not None else "")
        + " | "
        f"tok/s 1m/5m/15m {rates} | in flight {fmt_int(n.in_flight)} | endpoints {eps} | "
        f"ETA {eta} | errors {fmt_int(errors)}{top}"
        + (f" | {len(n.damaged)} part(s) missing or damaged" if n.damaged else "")
    )
