"""Shared helpers of the bench tests: prompts files and reports built from chosen numbers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from regen.bench.report import (
    Acceptance,
    BenchReport,
    BenchSettings,
    LevelResult,
    LevelStats,
    ServerFlags,
    SourceResult,
)
from regen.bench.stats import crossover
from regen.bench.verdicts import source_kind, verdicts
from regen.store.holdout import BenchPrompt, write_prompts

REPO = Path(__file__).resolve().parents[2]


def regen_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m regen ARGS`` from the repository, 120 columns wide, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "regen", *args],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "120", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}

#: simulator options of the bench's runner tests: short answers of a fixed length, 5 ms steps
#: (slow enough that the bench's client keeps up at concurrency 16 on a shared CI core)
SIM = {"mean_tokens": 24, "length_sigma": 0, "max_running_requests": 64, "step_ms": 5.0}
STEP_S = SIM["step_ms"] / 1000
#: the draft the speculative simulators report
DRAFT = "/drafts/k25-eagle3"
#: the speculative flags (the algorithm is added per simulator)
SPEC = {
    "speculative_draft_model_path": DRAFT,
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
}


def prompts(sources: dict[str, int], *, tools: tuple[str, ...] = ("xlam",)) -> list[BenchPrompt]:
    """``n`` prompts per source, the tool sources with a tool declaration."""
    out = []
    for src, n in sources.items():
        for i in range(n):
            out.append(
                BenchPrompt(
                    source=src,
                    sample_id=f"{src}:{i}",
                    messages=[{"role": "user", "content": f"[{src}] question number {i}"}],
                    tools=[TOOL] if src in tools else None,
                )
            )
    return out


def prompts_file(path: Path, sources: dict[str, int]) -> Path:
    write_prompts(path, prompts(sources))
    return path


def stats(
    tok_s: float, *, accept: float | None = None, requests: int = 40, **kw: Any
) -> LevelStats:
    base: dict[str, Any] = {
        "requests": requests,
        "ok": requests,
        "wall_s": 10.0,
        "completion_tokens": int(tok_s * 10),
        "output_tok_s": tok_s,
        "requests_per_s": requests / 10,
        "ttft_p50_s": 0.05,
        "ttft_p95_s": 0.08,
        "latency_p50_s": 2.0,
        "latency_p95_s": 3.0,
        "accept_length": accept,
        "accept_method": "spec_tokens_details" if accept is not None else "none",
    }
    return LevelStats(**{**base, **kw})


def report(
    levels: dict[int, tuple[float, float]],
    sources: dict[str, float | None],
    *,
    algorithm: str | None = "EAGLE3",
    overall: float | None = None,
    method: str = "spec_tokens_details",
    tokens: dict[str, int] | None = None,
    max_running: int | None = None,
) -> BenchReport:
    """A report from {concurrency: (baseline tok/s, speculative tok/s)} and {source: accept}."""
    results = [
        LevelResult(
            concurrency=c,
            baseline=stats(b),
            speculative=stats(s, accept=overall),
            speedup=s / b if b > 0 and s > 0 else None,
        )
        for c, (b, s) in sorted(levels.items())
    ]
    measured = {k: v for k, v in sources.items() if v is not None}
    tokens = tokens or {}
    if overall is None and measured:
        num = sum(tokens.get(k, 1000) for k in measured)
        den = sum(tokens.get(k, 1000) / v for k, v in measured.items())
        overall = num / den
    rep = BenchReport(
        created_at="2026-12-01T00:00:00+00:00",
        regen_version="test",
        model="moonshotai/Kimi-K2.5",
        settings=BenchSettings(
            concurrency=sorted(levels),
            per_source=20,
            max_tokens=512,
            prompts=20 * len(sources),
            request_timeout_s=600,
        ),
        servers={
            "baseline": ServerFlags(
                role="baseline", url="http://b:30000/v1", max_running_requests=max_running
            ),
            "speculative": ServerFlags(
                role="speculative",
                url="http://s:30000/v1",
                algorithm=algorithm,
                draft_path="/drafts/k25",
                max_running_requests=max_running,
            ),
        },
        levels=results,
        crossover=crossover(results),
        acceptance=Acceptance(overall=overall, method=method if overall is not None else "none"),
        sources=[
            SourceResult(
                source=k,
                kind=source_kind(k),
                prompts=20,
                requests=20,
                completion_tokens=tokens.get(k, 1000),
                accept_length=v,
                method=method if v is not None else "none",
            )
            for k, v in sources.items()
        ],
    )
    rep.verdicts = verdicts(rep)
    return rep
