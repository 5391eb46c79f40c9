"""``bench.html``: one self-contained page (plotly.js inlined, no network) with two plots.

- ``#plot-throughput``: output tok/s against concurrency (log axis) for both servers, the
  speedup in the hover text;
- ``#plot-acceptance``: acceptance length per source (bars), with the overall acceptance and
  the 1.0 of "no speculation" as lines;

then the verdicts, the per-level and per-source tables and the settings. Built with plotly's
own ``to_html`` (the library bundles its plotly.js; the first plot carries it, the second
reuses it). Writes only the file it is given.
"""

from __future__ import annotations

import html
from pathlib import Path

from regen.bench.report import BenchReport

BENCH_HTML = "bench.html"

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1100px; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
li.problem { color: #b00020; } li.warning { color: #a05a00; } li.good { color: #1b5e20; }
.plot { margin: 1.5em 0; }
"""


def _fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{suffix}"


def throughput_figure(report: BenchReport):  # -> plotly.graph_objects.Figure
    """Output tok/s against concurrency, one line per server."""
    import plotly.graph_objects as go

    xs = [lv.concurrency for lv in report.levels]
    fig = go.Figure()
    for role, color in (("baseline", "#546e7a"), ("speculative", "#1e88e5")):
        ys = [getattr(lv, role).output_tok_s for lv in report.levels]
        hover = [
            f"{role} · concurrency {lv.concurrency}<br>{getattr(lv, role).output_tok_s:,.0f} tok/s"
            f"<br>speedup {_fmt(lv.speedup, '.2f', '×')}"
            for lv in report.levels
        ]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                name=role,
                mode="lines+markers",
                line={"color": color},
                hovertext=hover,
                hoverinfo="text",
            )
        )
    fig.update_layout(
        title="output tokens/s against concurrency",
        xaxis={"title": "concurrency (requests in flight)", "type": "log", "tickvals": xs},
        yaxis={"title": "output tok/s (server-counted)", "rangemode": "tozero"},
        template="plotly_white",
        height=420,
    )
    return fig


def acceptance_figure(report: BenchReport):  # -> plotly.graph_objects.Figure
    """Acceptance length per source, with the overall value and 1.0 as lines."""
    import plotly.graph_objects as go

    sources = [s for s in report.sources if s.accept_length is not None]
    fig = go.Figure(
        go.Bar(
            x=[s.source for s in sources],
            y=[s.accept_length for s in sources],
            text=[f"{s.accept_length:.2f}" for s in sources],
            textposition="outside",
            hovertext=[f"{s.source} ({s.kind}): {s.accept_length:.3f}" for s in sources],
            hoverinfo="text",
            marker={"color": "#1e88e5"},
            name="acceptance length",
        )
    )
    fig.add_hline(y=1.0, line_dash="dot", line_color="#b00020", annotation_text="1.0: no gain")
    overall = report.acceptance.overall
    if overall is not None:
        fig.add_hline(
            y=overall,
            line_dash="dash",
            line_color="#546e7a",
            annotation_text=f"overall {overall:.2f}",
        )
    fig.update_layout(
        title=f"acceptance length per source ({report.acceptance.method})",
        yaxis={"title": "tokens per verify step", "rangemode": "tozero"},
        template="plotly_white",
        height=420,
    )
    return fig


def _levels_table(report: BenchReport) -> str:
    head = (
        "<tr><th>concurrency</th><th>baseline tok/s</th><th>spec tok/s</th><th>speedup</th>"
        "<th>req/s base / spec</th><th>TTFT p50 base / spec</th><th>TTFT p95 base / spec</th>"
        "<th>latency p50 base / spec</th><th>latency p95 base / spec</th><th>acceptance</th>"
        "<th>failed base / spec</th></tr>"
    )
    rows = []
    for lv in report.levels:
        b, s = lv.baseline, lv.speculative
        rows.append(
            "<tr>"
            f"<td>{lv.concurrency}</td><td>{b.output_tok_s:,.0f}</td><td>{s.output_tok_s:,.0f}</td>"
            f"<td>{_fmt(lv.speedup, '.2f', '×')}</td>"
            f"<td>{b.requests_per_s:.2f} / {s.requests_per_s:.2f}</td>"
            f"<td>{_fmt(b.ttft_p50_s, '.3f')} / {_fmt(s.ttft_p50_s, '.3f')} s</td>"
            f"<td>{_fmt(b.ttft_p95_s, '.3f')} / {_fmt(s.ttft_p95_s, '.3f')} s</td>"
            f"<td>{_fmt(b.latency_p50_s, '.2f')} / {_fmt(s.latency_p50_s, '.2f')} s</td>"
            f"<td>{_fmt(b.latency_p95_s, '.2f')} / {_fmt(s.latency_p95_s, '.2f')} s</td>"
            f"<td>{_fmt(s.accept_length, '.2f')}</td>"
            f"<td>{b.requests - b.ok} / {s.requests - s.ok}</td>"
            "</tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def _sources_table(report: BenchReport) -> str:
    head = (
        "<tr><th>source</th><th>kind</th><th>prompts</th><th>requests</th>"
        "<th>completion tokens</th><th>acceptance</th><th>method</th></tr>"
    )
    rows = [
        "<tr>"
        f"<td>{html.escape(s.source)}</td><td>{html.escape(s.kind)}</td><td>{s.prompts}</td>"
        f"<td>{s.requests}</td><td>{s.completion_tokens:,}</td>"
        f"<td>{_fmt(s.accept_length, '.2f')}</td>"
        f"<td>{s.method}{'' if s.exact else ' (approx.)'}</td>"
        "</tr>"
        for s in report.sources
    ]
    return f"<table>{head}{''.join(rows)}</table>"


def _servers(report: BenchReport) -> str:
    items = []
    for f in report.servers.values():
        # vLLM shows whether it speculates (its counters) but not the method, outside dev mode
        shown = f.algorithm or (
            "speculating (method not shown)"
            if f.engine == "vllm" and f.num_draft_tokens
            else "no speculation"
        )
        flags = (
            f"{html.escape(shown)}"
            + (f", draft {html.escape(f.draft_path)}" if f.draft_path else "")
            + (
                f", steps={f.num_steps} topk={f.eagle_topk} draft_tokens={f.num_draft_tokens}"
                if f.algorithm and f.engine != "vllm"
                else f", draft tokens {f.num_draft_tokens}"
                if f.num_draft_tokens
                else ""
            )
        )
        items.append(f"<li><b>{f.role}</b> {html.escape(f.url)}: {flags}</li>")
    return "<ul>" + "".join(items) + "</ul>"


def render_html(report: BenchReport) -> str:
    """The whole page as one string (plotly.js inlined once)."""
    import plotly.io as pio

    figures = (
        ("plot-throughput", throughput_figure(report)),
        ("plot-acceptance", acceptance_figure(report)),
    )
    plots = "".join(
        "<div class='plot'>"
        + pio.to_html(
            fig,
            full_html=False,
            include_plotlyjs=i == 0,  # plotly.js once, with the first plot
            div_id=div_id,
            config={"responsive": True},
        )
        + "</div>"
        for i, (div_id, fig) in enumerate(figures)
    )
    verdicts = "".join(
        f'<li class="{v.severity}">{html.escape(v.text)}</li>' for v in report.verdicts
    )
    st = report.settings
    settings = html.escape(
        f"concurrency {', '.join(map(str, st.concurrency))} · {st.prompts} prompts "
        f"({st.per_source or 'all'} per source) · max_tokens {st.max_tokens} · "
        f"created {report.created_at} · regen {report.regen_version}"
    )
    title = f"regen bench · {html.escape(report.model)}"
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{title}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{title}</h1><p>{settings}</p>"
        f"<h2>Verdicts</h2><ul>{verdicts}</ul>"
        f"<h2>Servers</h2>{_servers(report)}"
        f"{plots}"
        f"<h2>Per concurrency level</h2>{_levels_table(report)}"
        f"<h2>Per source</h2>{_sources_table(report)}"
        "</body></html>\n"
    )


def write_html(report: BenchReport, path: str | Path) -> Path:
    """Write ``bench.html`` (temp name, then rename)."""
    p = Path(path)
    tmp = p.with_name(f".tmp-{p.name}")
    tmp.write_text(render_html(report), encoding="utf-8")
    tmp.replace(p)
    return p
