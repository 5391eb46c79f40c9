"""The held-out samples of an export (regen.export.run's docstring: which, and why), and
``holdout.jsonl`` written for ``regen bench`` (its records: :mod:`regen.store.holdout`).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict

import pyarrow as pa
from pydantic import ValidationError

from regen.core.sample import stable_hash
from regen.export.select import Part
from regen.export.write import read_rows
from regen.store import layout
from regen.store.holdout import BenchPrompt, prompt_line
from regen.store.layout import ExportStats
from regen.store.rundir import RunDir

log = logging.getLogger(__name__)


def holdout_rank(seed: int, sample_id: str) -> str:
    """Where a sample stands in the holdout order: regen's stable hash of (seed, id)."""
    return stable_hash(["holdout", seed, sample_id])


def choose_holdout(
    table: pa.Table, n: int, seed: int, latest: dict[str, int], why_not: list[str] | None = None
) -> dict[str, dict[str, int]]:
    """Per source, the held-out samples and the row of each one's first regenerated turn of its
    latest answer (module docstring), in holdout order; rows that do not count (``why_not``:
    stale, not planned, another setting) are never held out."""
    if n <= 0:
        return {}
    attempts = table.column("attempt").to_pylist()
    sids = table.column("sample_id").to_pylist()
    sources = table.column("source").to_pylist()
    turns = table.column("turn").to_pylist()
    kinds = table.column("token_source").to_pylist()
    first: dict[str, dict[str, int]] = defaultdict(dict)  # source → sample → row
    for i, sid in enumerate(sids):
        if kinds[i] == "native" or (attempts[i] or 0) < latest.get(sid, 0):
            continue
        if why_not is not None and why_not[i]:
            continue
        rows = first[sources[i]]
        j = rows.get(sid)
        if j is None or turns[i] < turns[j]:
            rows[sid] = i
    held: dict[str, dict[str, int]] = {}
    for source in sorted(first):
        rows = first[source]
        k = min(n, len(rows) // 2)
        if k < n:
            log.warning(
                "holdout: source %s has %d samples: holding out %d, not %d (half stays for "
                "training)",
                source,
                len(rows),
                k,
                n,
            )
        chosen = sorted(rows, key=lambda sid: (holdout_rank(seed, sid), sid))[:k]
        if chosen:
            held[source] = {sid: rows[sid] for sid in chosen}
    return held


def write_holdout(
    rd: RunDir,
    dest: RunDir,
    parts: list[Part],
    held: dict[str, dict[str, int]],
    stats: ExportStats,
) -> None:
    """``holdout.jsonl`` of the held-out samples (removed when there are none)."""
    if not held:
        if dest.exists(layout.HOLDOUT):  # an earlier export's: those samples are in training now
            dest.delete(layout.HOLDOUT)
        return
    wanted = {row: sid for rows in held.values() for sid, row in rows.items()}
    prompts: dict[str, BenchPrompt] = {}
    columns = ["sample_id", "source", "turn", "messages", "tools"]
    for _, rows in read_rows(rd, parts, wanted, columns):
        for r in rows.to_pylist():
            try:
                prompts[r["sample_id"]] = BenchPrompt(
                    source=r["source"],
                    sample_id=r["sample_id"],
                    turn=r["turn"],
                    messages=json.loads(r["messages"] or "[]"),
                    tools=json.loads(r["tools"]) if r["tools"] else None,
                )
            except (ValueError, ValidationError) as e:  # still out of training
                log.warning("holdout: %s has no prompt to send: %s", r["sample_id"], e)
    with dest.atomic_writer(layout.HOLDOUT) as f:
        for source, rows in held.items():
            for sid in rows:
                if sid in prompts:
                    f.write((prompt_line(prompts[sid]) + "\n").encode("utf-8"))
            stats.sources[source].holdout_samples = len(rows)
    stats.holdout_samples = len(wanted)
    stats.holdout_file = layout.HOLDOUT
