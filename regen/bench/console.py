"""The bench in the terminal: rich tables of the levels and sources, the verdicts, and the
progress bar shown while it runs. Owns no files."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich import box
from rich.console import Console, Group
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from regen.bench.load import ProgressHook, level_size
from regen.bench.report import BenchReport

_STYLE = {"problem": "bold red", "warning": "yellow", "good": "green", "info": ""}
_MARK = {"problem": "✗", "warning": "!", "good": "✓", "info": "·"}


def _f(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1000:,.0f}"


def levels_table(report: BenchReport) -> Table:
    """Two rows per concurrency level (baseline, speculative) and the speedup."""
    t = Table(
        title=f"regen bench · {report.model}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    failures = any(
        st.ok < st.requests for lv in report.levels for st in (lv.baseline, lv.speculative)
    )
    heads = ["conc", "", "tok/s", "req/s", "TTFT p50", "p95", "lat p50", "p95", "accept",
             "speedup"] + (["failed"] if failures else [])  # fmt: skip
    for col in heads:
        t.add_column(col, justify="left" if not col else "right")
    for lv in report.levels:
        sp = lv.speedup
        shown = "—" if sp is None else f"[{'green' if sp > 1 else 'red'}]{sp:.2f}×[/]"
        for role in ("baseline", "speculative"):
            st = getattr(lv, role)
            first = role == "baseline"
            cells = [
                str(lv.concurrency) if first else "",
                "base" if first else "spec",
                f"{st.output_tok_s:,.0f}",
                f"{st.requests_per_s:.2f}",
                _ms(st.ttft_p50_s),
                _ms(st.ttft_p95_s),
                _f(st.latency_p50_s, ".2f"),
                _f(st.latency_p95_s, ".2f"),
                "" if first else _f(st.accept_length, ".2f"),
                "" if first else shown,
            ]
            if failures:
                cells.append(str(st.requests - st.ok))
            t.add_row(*cells, end_section=not first)
    cross = report.crossover
    note = "tok/s while all of a level's requests were in flight; TTFT in ms, latency in s"
    if cross.concurrency is not None:
        note = (
            f"speedup crosses 1 near concurrency {cross.concurrency:.0f} (between "
            f"{cross.last_paying} and {cross.first_losing}); {note}"
        )
    t.caption = note
    return t


def sources_table(report: BenchReport) -> Table:
    """Acceptance per source."""
    t = Table(title=f"acceptance per source ({report.acceptance.method})", title_justify="left")
    for col in ("source", "kind", "prompts", "requests", "compl. tok", "accept"):
        t.add_column(col, justify="left" if col in ("source", "kind") else "right")
    for s in report.sources:
        t.add_row(
            escape(s.source),
            escape(s.kind),
            str(s.prompts),
            str(s.requests),
            f"{s.completion_tokens:,}",
            _f(s.accept_length, ".2f") + ("" if s.exact else "~"),
        )
    overall = report.acceptance.overall
    t.caption = f"overall {_f(overall, '.2f')}" + (
        "" if report.acceptance.exact else " (~ approximate)"
    )
    return t


def verdict_lines(report: BenchReport) -> Group:

    lines = []
    for v in report.verdicts:
        lines.append(Text(f"{_MARK[v.severity]} {v.text}", style=_STYLE[v.severity]))
    return Group(*lines)


def print_report(report: BenchReport, console: Console) -> None:
    console.print(levels_table(report))
    console.print(sources_table(report))
    console.print(verdict_lines(report))


@contextmanager
def progress_bar(
    console: Console, *, levels: list[int], prompts: int, enabled: bool
) -> Iterator[ProgressHook | None]:
    """A progress bar over every request of every level (None when ``enabled`` is False)."""
    if not enabled:
        yield None
        return
    total = 2 * sum(level_size(prompts, c) for c in levels)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("bench", total=total)
        done_before: dict[tuple[str, int], int] = {}

        def hook(role: str, concurrency: int, finished: int, level_total: int) -> None:
            key = (role, concurrency)
            step = finished - done_before.get(key, 0)
            done_before[key] = finished
            if role == "pass":
                bar.update(task, description=f"acceptance pass c={concurrency}")
                return
            bar.update(task, advance=step, description=f"{role} · concurrency {concurrency}")

        yield hook
