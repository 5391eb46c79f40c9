"""One dashboard frame: a rich renderable built from :class:`regen.status.RunNumbers`.

Pure: no file access, no clock (``numbers.now`` is the clock). Layout, top to bottom: header
(run, model, state, times), one progress bar per source (with its flagged samples and, in wide
terminals, their top reasons), then throughput + ETA, endpoints and output lengths side by side,
then errors by class.
"""

from __future__ import annotations

import io
import os
import time
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from regen.status import RunNumbers
from regen.store.progress import SourceProgress

STATE_STYLE = {
    "running": ("●", "bold green"),
    "stalled": ("◐", "bold yellow"),
    "dead": ("✖", "bold red"),
    "finished": ("✔", "bold cyan"),
    "interrupted": ("■", "bold yellow"),
    "failed": ("✖", "bold red"),
    "starting": ("○", "bold blue"),
    "empty": ("○", "dim"),
    "unknown": ("?", "bold red"),
}
BAR_WIDTH = 28
SPARK = "▁▂▃▄▅▆▇█"
#: short names of the quality flags in the sources table (regen.quality.FLAGS)
FLAG_LABELS = {
    "repetition": "repeat",
    "empty_content": "empty",
    "reasoning_unclosed": "unclosed",
    "language_mismatch": "lang",
    "refusal": "refusal",
    "bad_tool_call": "tool",
}
#: terminals at least WIDE columns wide get the token and top-flag columns
WIDE = 118
#: top reasons shown per source: 2 in terminals at least EXTRA_WIDE columns wide, else 1
TOP_FLAGS = 2
EXTRA_WIDE = 140
#: columns of output that is no terminal (a log) unless $COLUMNS says: no table regen prints
#: is cut there
LOG_WIDTH = 160


def fmt_int(n: float) -> str:
    return f"{round(n):,}"


def fmt_tokens(n: float) -> str:
    """1234 -> 1.2K, 3.4M, 5.6B."""
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{round(n)}"


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "—"
    s = int(max(0, round(s)))
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    if d:
        return f"{d}d {h:02d}h"
    if h:
        return f"{h}h {m:02d}m"
    if m:
        return f"{m}m {sec:02d}s"
    return f"{sec}s"


def fmt_time(t: float | None) -> str:
    if not t:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def progress_bar(
    total: int, done: int, truncated: int, failed: int, width: int = BAR_WIDTH
) -> Text:
    """done (green, truncated part yellow), failed (red), remaining (dim)."""
    bar = Text()
    if total <= 0:
        return bar.append("·" * width, style="dim")
    cells = [round(width * x / total) for x in (done - truncated, truncated, failed)]
    cells[0] = max(0, min(width, cells[0]))
    cells[1] = max(0, min(width - cells[0], cells[1]))
    cells[2] = max(0, min(width - cells[0] - cells[1], cells[2]))
    bar.append("█" * cells[0], style="green")
    bar.append("█" * cells[1], style="yellow")
    bar.append("█" * cells[2], style="red")
    return bar.append("░" * (width - sum(cells)), style="grey35")


def fmt_endpoints(n: RunNumbers) -> str:
    """``2/3 up`` (``, 1 not reported`` for endpoints no session has reported on), and each
    endpoint out of rotation with its state: ``1/2 up (127.0.0.1:8001 stalled)``. The one
    count of healthy endpoints, in `regen status`'s line and the dashboard's header."""
    up = sum(1 for e in n.endpoints if e.healthy is True)
    unknown = sum(1 for e in n.endpoints if e.healthy is None)
    out = [f"{short_url(e.url)} {e.label}" for e in n.endpoints if e.healthy is False]
    return (f"{up}/{len(n.endpoints)} up" + (f" ({', '.join(out)})" if out else "")
            + (f", {unknown} not reported" if unknown else ""))  # fmt: skip


def short_url(url: str) -> str:
    """``host:port`` of an endpoint's URL (``/v1`` and the scheme dropped)."""
    return url.removeprefix("http://").removeprefix("https://").removesuffix("/v1")


def header(n: RunNumbers) -> Panel:
    icon, style = STATE_STYLE.get(n.state, ("?", "bold"))
    state = Text(f"{icon} {n.state.upper()}", style=style)
    if n.state_reason:
        state.append(f"  {n.state_reason}", style="dim")
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("state", state)
    grid.add_row("model", Text(n.model or "—", style="magenta"))
    eps = ", ".join(n.endpoints_configured) or "—"
    grid.add_row("endpoints", Text(f"{fmt_endpoints(n)}  {eps}"))
    grid.add_row(
        "started",
        Text(
            f"{fmt_time(n.run_started_at)}  (this session {fmt_time(n.started_at)}, "
            f"host {n.host or '—'} pid {n.pid or '—'})"
        ),
    )
    ago = f", updated {fmt_duration(n.now - n.updated_at)} ago" if n.updated_at else ""
    grid.add_row(
        "elapsed",
        Text(f"{fmt_duration(n.elapsed_s)}  (session {fmt_duration(n.session_elapsed_s)}{ago})"),
    )
    title = Text(f" regen · {n.name or '?'} ", style="bold white on blue")
    return Panel(grid, title=title, title_align="left", subtitle=n.uri or None, border_style=style)


def top_flags(flags: dict[str, int], k: int = TOP_FLAGS) -> str:
    """``repeat 5 empty 3``: the ``k`` most frequent flags (rows), short names."""
    top = sorted(flags.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
    return " ".join(f"{FLAG_LABELS.get(f, f)} {fmt_int(c)}" for f, c in top if c > 0)


def sources_table(n: RunNumbers, width: int = 120) -> Table:
    """One row per source and a total; narrow terminals drop the token and top-flag columns."""
    wide = width >= WIDE
    top_k = TOP_FLAGS if width >= EXTRA_WIDE else 1
    bar_w = max(10, min(BAR_WIDTH, width - ((118 if top_k > 1 else 108) if wide else 78)))
    t = Table(expand=True, box=None, pad_edge=False, header_style="bold")
    t.add_column("source", no_wrap=True)
    t.add_column("progress", no_wrap=True)
    t.add_column("done", justify="right")
    t.add_column("total", justify="right")
    t.add_column("%", justify="right")
    t.add_column("failed", justify="right")
    t.add_column("trunc", justify="right")
    t.add_column("flagged", justify="right")
    if wide:
        t.add_column("top flags" if top_k > 1 else "top flag", no_wrap=True)
        t.add_column("tok/turn", justify="right")
        t.add_column("compl. tok", justify="right")
    for s in n.sources:
        name = Text(s.name) if s.regenerate else Text(f"{s.name} (native)", style="dim")
        t.add_row(*_counts_row(name, s, bar_w, wide, top_k))
    t.add_section()
    t.add_row(*_counts_row(Text("TOTAL", style="bold"), n.overall, bar_w, wide, top_k, bold=True))
    return t


def _counts_row(name: Text, s: SourceProgress, bar_w: int, wide: bool, top_k: int, *,
                bold: bool = False) -> list[RenderableType]:  # fmt: skip
    """The cells of one row of the sources table (a source, or the TOTAL in bold)."""
    b = "bold " if bold else ""
    pct = 100.0 * (s.done + s.failed) / s.total if s.total else 0.0
    cells: list[RenderableType] = [
        name,
        progress_bar(s.total, s.done, s.truncated, s.failed, bar_w),
        Text(fmt_int(s.done), style=b.strip()),
        Text(fmt_int(s.total), style=b.strip()),
        Text(f"{pct:5.1f}", style=b.strip()),
        Text(fmt_int(s.failed), style=b + "red" if s.failed else "dim"),
        Text(fmt_int(s.truncated), style=b + "yellow" if s.truncated else "dim"),
        Text(fmt_int(s.flagged), style=b + "magenta" if s.flagged else "dim"),
    ]
    if wide:
        cells.append(
            Text(top_flags(s.flags, top_k) or "—", style=b + "magenta" if s.flags else "dim")
        )
        cells.append(fmt_int(s.tokens_per_turn) if s.tokens_per_turn else "—")
        cells.append(Text(fmt_tokens(s.completion_tokens), style=b.strip()))
    return cells


def throughput_panel(n: RunNumbers) -> Panel:
    g = Table.grid(padding=(0, 2))
    g.add_column(style="bold")
    g.add_column(justify="right")
    for r in n.rates:
        label = f"{int(r.window_s // 60)} min"
        if r.tok_s is None:
            g.add_row(label, Text("—", style="dim"))
            continue
        partial = r.span_s + 1e-6 < r.window_s
        txt = Text(f"{r.tok_s:,.0f} tok/s", style="cyan")
        if partial:
            txt.append(f" ({fmt_duration(r.span_s)})", style="dim")
        g.add_row(label, txt)
    g.add_row("in flight", Text(fmt_int(n.in_flight), style="cyan"))
    rq = n.requests
    g.add_row("requests", Text(f"{fmt_int(rq['sent'])} sent · {fmt_int(rq['ok'])} ok"))
    g.add_row("", Text(f"{fmt_int(rq['retried'])} retried · {fmt_int(rq['failed'])} failed"))
    o = n.overall
    if o.retried or o.retrying:
        g.add_row("new attempts", Text(f"{fmt_int(o.retried)} stored · {fmt_int(o.retrying)} to go",
                                       style="magenta"))  # fmt: skip
    g.add_row("", "")
    if n.state == "finished" and n.remaining == 0:
        g.add_row("ETA", Text("done", style="bold cyan"))
    elif n.eta is None:
        g.add_row("ETA", Text("— (no rate yet)" if n.state == "running" else "—", style="dim"))
    else:
        e = n.eta
        g.add_row("ETA", Text(fmt_duration(e.seconds), style="bold green"))
        g.add_row("band", Text(f"{fmt_duration(e.low_s)} – {fmt_duration(e.high_s)}"))
        g.add_row("finishes", Text(fmt_time(n.now + e.seconds)))
        g.add_row("left", Text(f"~{fmt_tokens(e.tokens)} tokens"))
        if e.assumed_sources:
            g.add_row("", Text(f"assumed: {', '.join(e.assumed_sources)}", style="dim"))
    return Panel(g, title="throughput · ETA", title_align="left", border_style="cyan")


def fmt_gauge(x: float | None) -> Text | str:
    """A count the server reported (``—``: no reading)."""
    return Text("—", style="dim") if x is None else fmt_int(x)


def fmt_share(x: float | None) -> Text | str:
    """A share as a percentage (``—``: not reported)."""
    return Text("—", style="dim") if x is None else f"{100 * x:.0f}%"


def endpoints_panel(n: RunNumbers) -> Panel:
    """Per endpoint: health, regen's requests in flight, then the server's own side from its
    ``/metrics`` (running, queued, KV-cache usage: every client's, ``—`` without a page), the
    share of regen's prompt tokens its prefix cache held (``cached_tokens``; ``—``: never
    reported), latency and answers."""
    t = Table(box=None, pad_edge=False, header_style="bold", expand=True)
    t.add_column("endpoint", overflow="ellipsis", no_wrap=True, ratio=1)
    t.add_column("", no_wrap=True)
    t.add_column("in fl.", justify="right")
    t.add_column("run", justify="right")
    t.add_column("queue", justify="right")
    t.add_column("KV", justify="right")
    t.add_column("cache", justify="right")
    t.add_column("p50", justify="right")
    t.add_column("ok", justify="right")
    t.add_column("err", justify="right")
    for e in n.endpoints:
        style = {"?": "dim", "up": "green", "stalled": "bold magenta"}.get(e.label, "bold red")
        health = Text(e.label, style=style)
        url = short_url(e.url)
        kv = e.server_kv_usage
        t.add_row(
            url,
            health,
            fmt_int(e.in_flight),
            fmt_gauge(e.server_running),
            Text(fmt_int(e.server_queued), style="yellow" if e.server_queued else "")
            if e.server_queued is not None
            else fmt_gauge(None),
            Text("—", style="dim") if kv is None else f"{100 * kv:.0f}%",
            fmt_share(e.cache_hit_rate),
            f"{e.latency_p50_s:.1f}s" if e.latency_p50_s is not None else "—",
            fmt_int(e.ok),
            Text(fmt_int(e.errors), style="red" if e.errors else "dim"),
        )
    if not n.endpoints:
        t.add_row(Text("none reported", style="dim"), *[""] * 9)
    title = "endpoints · run, queue, KV: server /metrics (all clients) · cache: hit rate"
    return Panel(t, title=title, title_align="left", border_style="blue")


def fmt_len(n: float) -> str:
    """Token counts as bin labels: 512, 1K, 1.5K, 32K."""
    if n < 1024:
        return f"{round(n)}"
    return f"{n / 1024:.1f}".removesuffix(".0") + "K"


class Histogram:
    """A vertical bar chart that fits its width: one column per bin, label and share below."""

    def __init__(self, edges: list[int], counts: list[int], height: int = 4) -> None:
        nz = [i for i, c in enumerate(counts) if c]
        self.bins = list(range(nz[0], nz[-1] + 1)) if nz else []
        self.edges, self.counts, self.height = edges, counts, height

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        counts, total = self.counts, sum(self.counts)
        if not self.bins or not total:
            yield Text("no finished turns yet", style="dim")
            return
        col = min(7, options.max_width // len(self.bins))
        peak = max(counts)
        if col < 4:  # too narrow for columns: one sparkline
            spark = "".join(SPARK[min(7, int(8 * counts[i] / peak))] for i in self.bins)
            yield Text(spark, style="magenta")
            last = fmt_len(self.edges[self.bins[-1]])
            yield Text(f"{fmt_len(self.edges[self.bins[0]])} … {last}", style="dim")
            return
        open_last = len(self.edges) == len(counts) and self.bins[-1] == len(counts) - 1
        for row in range(self.height, 0, -1):  # top row first
            line = Text(style="magenta")
            for i in self.bins:
                fill = counts[i] / peak * self.height * 8 - (row - 1) * 8  # eighths of this row
                ch = "█" if fill >= 8 else SPARK[int(fill) - 1] if fill >= 1 else " "
                if row == 1 and counts[i] and fill < 1:
                    ch = "▁"
                line.append(" " + ch * (col - 2) + " ")
            yield line
        labels = [fmt_len(self.edges[i]) for i in self.bins]
        if open_last:
            labels[-1] += "+"
        yield Text("".join(lb.center(col)[:col] for lb in labels), style="dim")
        yield Text("".join(f"{100 * counts[i] / total:.0f}%".center(col)[:col] for i in self.bins))


def lengths_panel(n: RunNumbers) -> Panel:
    """Completion tokens per turn: histogram, with count, median and p90 in the title."""
    counts, edges = n.hist_counts, n.hist_edges
    title = "output tokens / turn"
    total = sum(counts)
    if total:
        median = _quantile(edges, counts, 0.5)
        p90 = _quantile(edges, counts, 0.9)
        title += f" · {fmt_int(total)} turns · median ~{fmt_len(median)} · p90 ~{fmt_len(p90)}"
    return Panel(Histogram(edges, counts), title=title, title_align="left", border_style="magenta")


def _quantile(edges: list[int], counts: list[int], q: float) -> float:
    """Linear within the bin; the open last bin is taken as [lo, 1.5 lo)."""
    total = sum(counts)
    want = q * total
    acc = 0.0
    for i, c in enumerate(counts):
        if c and acc + c >= want:
            lo = edges[i]
            hi = edges[i + 1] if i + 1 < len(edges) else lo * 1.5
            return lo + (hi - lo) * (want - acc) / c
        acc += c
    return float(edges[len(counts) - 1]) if counts else 0.0


def loops_line(n: RunNumbers) -> Text | None:
    """The answers regen cut because they looped while streaming, per source, and the tokens
    those cuts spared the servers (None: no cut)."""
    cut = [s for s in n.sources if s.loop_cut]
    if not cut:
        return None
    per = ", ".join(f"{s.name} {fmt_int(s.loop_cut)} ({fmt_tokens(s.cut_saved)} tok)" for s in cut)
    o = n.overall
    return Text(f"loops cut while streaming: {fmt_int(o.loop_cut)} answers, "
                f"{fmt_tokens(o.cut_saved)} tokens spared · {per}", style="yellow")  # fmt: skip


def errors_panel(n: RunNumbers) -> Panel:
    loops = loops_line(n)
    if not n.errors:
        body: RenderableType = Text("none", style="green")
        return Panel(body if loops is None else Group(body, loops), title="errors",
                     title_align="left")  # fmt: skip
    t = Table(box=None, pad_edge=False, header_style="bold", expand=True)
    t.add_column("class", no_wrap=True, style="red")
    t.add_column("count", justify="right")
    t.add_column("last", justify="right", no_wrap=True)
    t.add_column("last message", overflow="ellipsis", no_wrap=True, ratio=1)
    for e in n.errors[:8]:
        ago = fmt_duration(n.now - e.last_at) + " ago" if e.last_at else "—"
        t.add_row(e.kind, fmt_int(e.count), ago, e.last_message)
    if len(n.errors) > 8:
        t.add_row(Text(f"+{len(n.errors) - 8} more classes", style="dim"), "", "", "")
    body = t if loops is None else Group(t, loops)
    return Panel(body, title="errors by class", title_align="left", border_style="red")


def frame(n: RunNumbers, *, width: int = 120, note: str = "") -> RenderableType:
    """The whole dashboard for one tick, laid out for a terminal ``width`` columns wide."""
    row = Table.grid(expand=True, padding=(0, 1))
    row.add_column(ratio=2 if width >= 110 else 1)
    row.add_column(ratio=3 if width >= 110 else 1)
    row.add_row(throughput_panel(n), Group(endpoints_panel(n), lengths_panel(n)))
    parts: list[RenderableType] = [
        header(n),
        Panel(sources_table(n, width), title="sources", title_align="left", border_style="green"),
        row,
        errors_panel(n),
    ]
    if n.damaged:
        parts.append(Text(damage_note(n), style="bold red"))
    if note:
        parts.append(Text(note, style="yellow"))
    return Group(*parts)


def damage_note(n: RunNumbers) -> str:
    """One line naming the parts that vanished or changed (their samples are not counted)."""
    shown = "; ".join(n.damaged[:3]) + (
        f"; +{len(n.damaged) - 3} more" if len(n.damaged) > 3 else ""
    )
    return (
        f"{len(n.damaged)} part(s) missing or damaged, not counted: {shown} "
        f"(regen verify {n.uri} --repair, or rerun the job)"
    )


def make_console(*, stderr: bool = False, width: int | None = None, **kw: Any) -> Console:
    """The console every regen command prints through: on a terminal, the terminal's width;
    otherwise (a pipe, a file, a Ray job's log) :data:`LOG_WIDTH` columns, or ``$COLUMNS``, and
    lines never broken (``soft_wrap``), so nothing is cut at rich's default of 80."""
    console = Console(stderr=stderr, width=width, **kw)
    if not console.is_terminal:
        # a log: a line is never broken, whatever $COLUMNS says (it sizes tables only)
        console.soft_wrap = True
        if width is None and not os.environ.get("COLUMNS"):
            console.width = LOG_WIDTH
    return console


def render_text(n: RunNumbers, *, width: int = 120, color: bool = False, note: str = "") -> str:
    """The frame as a string (for --once to a file, tests, the benchmark and the README)."""
    console = Console(
        file=io.StringIO(),
        width=width,
        record=False,
        force_terminal=color,
        color_system="truecolor" if color else None,
        legacy_windows=False,
    )
    console.print(frame(n, width=width, note=note))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    return out
