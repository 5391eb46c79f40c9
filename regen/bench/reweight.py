"""The next round's data mix from a bench: per-source limits, as a manifest overlay.

The rule (simple and monotone): each source's new limit is proportional to its current count
times ``mean acceptance ÷ its acceptance``, scaled so the limits add up to the budget::

    w_s   = ā / a_s                     (ā: the bench's overall acceptance; a source the bench
                                         did not measure gets w = 1, as if it were at the mean)
    new_s = budget · n_s · w_s / Σ_j n_j · w_j        (largest-remainder rounding, ≥ 1 when n_s ≥ 1)

``n_s`` is the source's current count (its manifest ``limit``, else what ``regen plan`` kept)
and the budget is, by default, the current total. A source's relative change
``new_s / n_s`` is proportional to ``1 / a_s``: the lower its acceptance, the larger its
increase, and the ranking never depends on the counts. A source whose rows ran out before its
limit cannot grow; it is flagged (``exhausted``), and its unmet share is not moved elsewhere
(that would break the monotone rule). Native sources (already in the Kimi format) are left
alone. A bench whose draft was not used at all (acceptance ≤ 1.1) is refused: its per-source
numbers say nothing about the data.

:func:`overlay_yaml` writes the result as a manifest overlay that ``regen plan MANIFEST -o
FILE`` / ``regen run ... -o FILE`` load (``sources.NAME.limit``), with the reasoning per source
as comments. Pure functions; the CLI writes the file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from regen.bench.report import BenchReport
from regen.core.errors import ConfigError
from regen.serve.sglang import LOW_ACCEPT_LENGTH


@dataclass(slots=True)
class SourceWeight:
    """One source's proposal and why."""

    source: str
    current: int  #: the count it has now (limit, else kept)
    accept: float | None  #: its acceptance in the bench (None: not measured)
    weight: float  #: mean acceptance ÷ its acceptance (1 when not measured)
    proposed: int = 0
    exhausted: bool = False  #: it had fewer rows than its limit: it cannot grow

    @property
    def change(self) -> float | None:
        """Relative change, e.g. 0.52 for +52% (None when it had none)."""
        return None if self.current == 0 else self.proposed / self.current - 1.0


@dataclass(slots=True)
class Reweight:
    """The proposal for every regenerated source."""

    mean_accept: float
    budget: int
    sources: list[SourceWeight] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  #: benched sources not in the manifest

    @property
    def current_total(self) -> int:
        return sum(s.current for s in self.sources)


def reweight(
    report: BenchReport,
    current: Mapping[str, int],
    *,
    budget: int | None = None,
    exhausted: frozenset[str] | set[str] = frozenset(),
) -> Reweight:
    """Propose per-source limits (module docstring). ``current``: source → count, in order."""
    measured = {s.source: s.accept_length for s in report.sources if s.accept_length is not None}
    overall = report.acceptance.overall
    if overall is not None and overall <= LOW_ACCEPT_LENGTH:
        raise ConfigError(
            f"the bench's acceptance is {overall:.2f} ≤ {LOW_ACCEPT_LENGTH}: the draft was not "
            "used, so its per-source numbers say nothing about the data; fix the server first "
            "(is it EAGLE instead of EAGLE3?) and bench again",
            field="reweight",
        )
    used = {k: v for k, v in measured.items() if k in current}
    if not used:
        raise ConfigError(
            "the bench measured no acceptance for any source of this manifest "
            f"(bench sources: {', '.join(measured) or 'none'})",
            field="reweight",
        )
    mean = overall if overall is not None else sum(used.values()) / len(used)
    total = sum(current.values()) if budget is None else budget
    if total < 0:
        raise ConfigError("--budget must be >= 0", field="budget")
    rows = [
        SourceWeight(
            source=name,
            current=n,
            accept=used.get(name),
            weight=mean / used[name] if name in used else 1.0,
            exhausted=name in exhausted,
        )
        for name, n in current.items()
    ]
    _allocate(rows, total)
    return Reweight(
        mean_accept=mean,
        budget=total,
        sources=rows,
        ignored=[k for k in measured if k not in current],
    )


def _allocate(rows: list[SourceWeight], total: int) -> None:
    """``total`` split in proportion to current × weight; largest remainder, ≥ 1 if current ≥ 1."""
    mass = sum(r.current * r.weight for r in rows)
    if mass <= 0:
        return
    shares = [total * r.current * r.weight / mass for r in rows]
    floors = [math.floor(x) for x in shares]
    left = total - sum(floors)
    order = sorted(range(len(rows)), key=lambda i: (shares[i] - floors[i], -i), reverse=True)
    for i in order[:left]:
        floors[i] += 1
    for r, n in zip(rows, floors, strict=True):
        r.proposed = max(n, 1) if r.current >= 1 and total > 0 else n


def reason(row: SourceWeight, mean: float) -> str:
    """One source's reasoning in words (the overlay's comment)."""
    change = row.change
    moved = "" if change is None else f" ({change:+.0%})"
    base = f"{row.current:,} → {row.proposed:,}{moved}"
    if row.accept is None:
        text = f"not measured by the bench: kept at the mean weight; {base}"
    else:
        rel = "below" if row.accept < mean else "above" if row.accept > mean else "at"
        text = (
            f"acceptance {row.accept:.2f}, {rel} the mean {mean:.2f}: weight {row.weight:.2f}; "
            f"{base}"
        )
    if row.exhausted and row.proposed > row.current:
        text += f"; its rows ran out at {row.current:,}, so it cannot grow without more data"
    return text


def overlay_yaml(result: Reweight, *, manifest: str, bench: str, report: BenchReport) -> str:
    """The overlay file's text: ``sources.NAME.limit`` with the reasoning as comments."""
    lines = [
        "# regen plan --reweight: per-source limits for the next regeneration round",
        f"# manifest: {manifest}",
        f"# bench: {bench} ({report.created_at}, model {report.model}, "
        f"acceptance {result.mean_accept:.2f} via {report.acceptance.method})",
        "# rule: new limit ∝ current × (mean acceptance ÷ source acceptance), scaled to the",
        f"# budget of {result.budget:,} samples (now {result.current_total:,}); docs/bench.md",
        f"# load it with: regen plan {manifest} -o THIS_FILE",
        "sources:",
    ]
    for row in result.sources:
        lines.append(f"  {json.dumps(row.source)}:")
        lines.append(f"    # {reason(row, result.mean_accept)}")
        lines.append(f"    limit: {row.proposed}")
    for name in result.ignored:
        lines.append(f"# {name}: in the bench but not in this manifest; ignored")
    return "\n".join(lines) + "\n"
