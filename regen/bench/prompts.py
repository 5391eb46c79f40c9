"""The bench's share of the held-out prompts (the file and its records:
:mod:`regen.store.holdout`)."""

from __future__ import annotations

from regen.core.errors import ConfigError
from regen.store.holdout import BenchPrompt


def per_source(prompts: list[BenchPrompt], n: int | None) -> list[BenchPrompt]:
    """The first ``n`` prompts of each source (all when ``n`` is None), sources interleaved.

    Interleaving (one of each source in turn, sources in order of first appearance) keeps
    every part of a level's run a mix of all sources, so no source sees only a warm or only a
    draining batch.
    """
    if n is not None and n < 1:
        raise ConfigError("--per-source must be >= 1", field="per_source")
    by_source: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        bucket = by_source.setdefault(p.source, [])
        if n is None or len(bucket) < n:
            bucket.append(p)
    out: list[BenchPrompt] = []
    depth = max((len(b) for b in by_source.values()), default=0)
    for i in range(depth):
        out.extend(b[i] for b in by_source.values() if i < len(b))
    return out
