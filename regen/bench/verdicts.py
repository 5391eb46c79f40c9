"""Verdicts in plain words from a bench's numbers (pure: a :class:`BenchReport` in, a list out).

The rules, in the order they are reported:

- ``eagle-vs-eagle3`` / ``wrong-draft`` / ``baseline-speculates`` / ``flags-unchecked``: what
  the flags check found (the same check as ``regen verify-server``).
- ``greedy-differs`` / ``greedy-identical``: at temperature 0, whether the speculative server
  gave the target's own answers at concurrency 1 (regen.bench.greedy); when it did not, its
  acceptance and speedup describe other answers.
- ``draft-not-used``: acceptance at or below 1.1 (``regen.serve.sglang.LOW_ACCEPT_LENGTH``):
  every step keeps only the bonus token. "Is the algorithm EAGLE instead of EAGLE3?"
- ``speedup``: the headline — speedup at the lowest and the highest level and where to serve
  it: up to the crossover, at every level, or nowhere; within ±3% of 1 everywhere it says
  there is no measurable difference.
- ``verify-cost``: a draft that is accepted (> 1.1) yet not faster even at the lowest level.
- ``source-low``: a source whose acceptance is at most 80% of the token-weighted acceptance
  of the other sources: that kind of data is under-represented in
  the draft's training mix (``regen plan --reweight`` proposes the next round's mix).
- ``batch-limit``: a level above a server's live batch limit (SGLang forces 48 for the EAGLE
  family): the extra requests queue there, so the level measures the queue too.
- ``ttft``: speculation more than 1.5× slower to the first token at the lowest level.
- ``failures``: requests that failed, per server and class.
- ``acceptance-source``: where acceptance came from when it was not per request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from regen.bench.report import BenchReport, LevelResult, Severity, SourceResult, Verdict
from regen.serve.sglang import LOW_ACCEPT_LENGTH

#: what the data of each adapter is, for the verdicts' words
ADAPTER_KINDS = {
    "sharegpt": "chat",
    "ultrachat": "chat",
    "perfectblend": "mixed instruction",
    "openthoughts": "reasoning",
    "opencodereasoning": "code",
    "magicoder": "code",
    "xlam": "tool-calling",
    "glaive": "tool-calling",
    "swe_gym": "agentic tool-use",
    "kimi_native": "Kimi-native",
}

#: a source is "low" at or below this share of the others' acceptance (acceptance is ≥ 1, so
#: that is also at least 0.2 below it)
LOW_SOURCE_RATIO = 0.8
#: speedups within this distance of 1 everywhere are "no measurable difference"
SAME_BAND = 0.03
#: TTFT p50 ratio (speculative ÷ baseline) worth a word
SLOW_TTFT_RATIO = 1.5


def source_kind(source: str, adapter: str | None = None, tool_share: float = 0.0) -> str:
    """The kind of data a source holds: by adapter, else by name, else by its prompts' tools."""
    for key in (adapter, source):
        if key and key in ADAPTER_KINDS:
            return ADAPTER_KINDS[key]
    return "tool-calling" if tool_share >= 0.5 else "general"


def _x(value: float) -> str:
    return f"{value:.2f}×"


def _v(severity: Severity, code: str, text: str) -> Verdict:
    return Verdict(severity=severity, code=code, text=text)


def _elsewhere(sources: Sequence[SourceResult], name: str) -> float | None:
    """Token-weighted acceptance of every other source (tokens ÷ tokens-per-accept)."""
    tokens = steps = 0.0
    for s in sources:
        if s.source == name or not s.accept_length or not s.completion_tokens:
            continue
        tokens += s.completion_tokens
        steps += s.completion_tokens / s.accept_length
    return tokens / steps if steps else None


def verdicts(report: BenchReport) -> list[Verdict]:
    """Every finding, most important first."""
    out: list[Verdict] = []
    spec = report.servers.get("speculative")
    for flags in (spec, report.servers.get("baseline")):
        if flags is not None and flags.problem:
            text = f"{flags.role} server: {flags.problem}"
            out.append(_v("problem", flags.trap or "flags-unchecked", text))

    accept = report.acceptance.overall
    algo = spec.algorithm if spec is not None else None
    not_used = accept is not None and accept <= LOW_ACCEPT_LENGTH
    if not_used:
        text = (
            f"acceptance {accept:.2f} ≤ {LOW_ACCEPT_LENGTH}: the draft is not being used. "
            "Is the algorithm EAGLE instead of EAGLE3?"
        )
        vllm = spec is not None and spec.engine == "vllm"
        if algo is not None and algo.upper() != "EAGLE3":
            fix = ('--speculative-config \'{"method": "eagle3", ...}\'' if vllm
                   else "--speculative-algorithm EAGLE3")  # fmt: skip
            text += f" The server runs {algo}: restart it with {fix}."
        elif algo is not None:
            text += (
                " The server does run EAGLE3: check the draft's aux layer ids "
                "(regen verify-server, regen train --dry-run) and its training data."
            )
        out.append(_v("problem", "draft-not-used", text))

    greedy = _greedy(report)  # a changed answer comes before the numbers it makes moot
    out.extend(v for v in greedy if v.severity == "problem")
    out.extend(_speedup(report, algo))
    levels = _speedups(report)
    if accept is not None and not not_used and levels and levels[0][1] < 1.0 - SAME_BAND:
        text = (
            f"acceptance {accept:.2f} but only {_x(levels[0][1])} at concurrency "
            f"{levels[0][0].concurrency}: the draft's steps cost more than they save; try "
            "fewer --speculative-num-steps / --speculative-num-draft-tokens"
        )
        out.append(_v("warning", "verify-cost", text))
    if not not_used:
        out.extend(_low_sources(report.sources))
    out.extend(_batch_limits(report))
    out.extend(_ttft(report))
    out.extend(_failures(report))
    out.extend(v for v in greedy if v.severity != "problem")
    out.extend(_acceptance_source(report))
    return out


def _greedy(report: BenchReport) -> list[Verdict]:
    g = report.greedy
    if g is None:
        return []
    by = "token ids" if g.method == "token_ids" else "text"
    if g.differing:
        shown = ", ".join(g.differing[:3]) + (", ..." if len(g.differing) > 3 else "")
        text = (
            f"{len(g.differing)} of {g.compared} greedy answers differ with the draft ({by}; "
            f"{shown}): the speculative server does not decode what the target alone does, so "
            "its acceptance and speedup describe other answers. Check that both servers load "
            "the same target, dtype and chat template"
        )
        return [_v("problem", "greedy-differs", text)]
    text = f"greedy answers identical with and without the draft: {g.identical}/{g.compared} ({by})"
    return [_v("good", "greedy-identical", text)]


def _speedups(report: BenchReport) -> list[tuple[LevelResult, float]]:
    """The levels that measured a speedup, each with it."""
    return [(lv, lv.speedup) for lv in report.levels if lv.speedup is not None]


def _speedup(report: BenchReport, algo: str | None) -> list[Verdict]:
    measured = _speedups(report)
    if not measured:
        return [_v("problem", "speedup", "no level produced tokens on both servers")]
    name = f"{algo} draft" if algo else "speculative server"
    (first, first_x), (last, last_x) = measured[0], measured[-1]
    span = f"{_x(first_x)} at concurrency {first.concurrency}"
    if last is not first:
        span += f", {_x(last_x)} at {last.concurrency}"
    cross = report.crossover
    speedups = [x for _, x in measured]
    if all(abs(x - 1.0) <= SAME_BAND for x in speedups):
        text = f"{name}: {span}: no measurable difference from the baseline"
        return [_v("warning", "speedup", text)]
    if cross.concurrency is not None:
        text = (
            f"{name}: {span}: serve it at concurrency ≤ {cross.last_paying} "
            f"(it stops paying near {cross.concurrency:.0f})"
        )
        return [_v("info", "speedup", text)]
    if all(x > 1.0 for x in speedups):
        return [_v("good", "speedup", f"{name}: {span}: faster at every measured level")]
    if all(x <= 1.0 for x in speedups):
        text = f"{name}: {span}: never faster than the baseline; do not serve it"
        return [_v("problem", "speedup", text)]
    return [_v("info", "speedup", f"{name}: {span}: pays only at some levels (see the table)")]


def _low_sources(sources: Sequence[SourceResult]) -> list[Verdict]:
    out = []
    for s in sources:
        other = _elsewhere(sources, s.source)
        if s.accept_length is None or other is None:
            continue
        a = s.accept_length
        if a <= LOW_SOURCE_RATIO * other:
            text = (
                f"acceptance on {s.source} {a:.1f} vs {other:.1f} elsewhere: {s.kind} data is "
                "under-represented (regen plan MANIFEST --reweight bench.json proposes the next "
                "round's mix)"
            )
            out.append(_v("warning", "source-low", text))
    return out


def _batch_limits(report: BenchReport) -> list[Verdict]:
    out = []
    for flags in report.servers.values():
        limit = flags.max_running_requests
        over = [lv.concurrency for lv in report.levels if limit and lv.concurrency > limit]
        if over:
            text = (
                f"concurrency {', '.join(map(str, over))} exceeds the {flags.role} server's "
                f"{limit} batch slots: the extra requests queue there (SGLang runs at most 48 "
                "for the EAGLE family unless --max-running-requests says otherwise)"
            )
            out.append(_v("info", "batch-limit", text))
    return out


def _ttft(report: BenchReport) -> list[Verdict]:
    if not report.levels:
        return []
    lv = report.levels[0]
    b, s = lv.baseline.ttft_p50_s, lv.speculative.ttft_p50_s
    if not (b and s and s > SLOW_TTFT_RATIO * b):
        return []
    text = (
        f"time to first token at concurrency {lv.concurrency}: {s * 1000:.0f} ms speculative "
        f"vs {b * 1000:.0f} ms baseline ({s / b:.1f}×)"
    )
    return [_v("info", "ttft", text)]


def _failures(report: BenchReport) -> list[Verdict]:
    out = []
    for role in ("baseline", "speculative"):
        stats = [getattr(lv, role) for lv in report.levels]
        sent = sum(st.requests for st in stats)
        failed = sum(st.requests - st.ok for st in stats)
        kinds: Counter[str] = Counter()
        for st in stats:
            kinds.update(st.errors)
        if failed:
            what = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
            text = f"{role} server: {failed} of {sent} requests failed ({what})"
            out.append(_v("warning", "failures", text))
    return out


def _acceptance_source(report: BenchReport) -> list[Verdict]:
    acc = report.acceptance
    if acc.method == "server_info":
        text = (
            "the speculative server does not return sglext.spec_tokens_details: acceptance "
            "comes from the change of /server_info avg_spec_accept_length"
        )
        if not acc.exact:
            text += (
                " (approximate: its running total includes traffic from before the bench; "
                "restart the server before benching for exact numbers)"
            )
        return [_v("info", "acceptance-source", text)]
    if acc.method == "metrics":
        text = (
            "acceptance comes from the vLLM server's own counters: 1 + accepted / drafts "
            "(vllm:spec_decode_*) across each level and each source's pass"
        )
        return [_v("info", "acceptance-source", text)]
    if acc.method == "none":
        text = (
            "no acceptance length: the speculative server reports neither "
            "sglext.spec_tokens_details nor avg_spec_accept_length"
        )
        return [_v("warning", "acceptance-source", text)]
    return []
