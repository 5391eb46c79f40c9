"""``requests.jsonl``: every request the bench sent, one JSON object per line.

Layout (one line per request, in the order the levels ran)::

    {"role": "baseline" | "speculative" | "pass", "concurrency", "source", "sample_id",
     "ok", "error", "status", "ttft_s", "latency_s", "prompt_tokens", "completion_tokens",
     "finish_reason", "verify_ct", "accept_length", "sent_s"}

``role`` "pass" is the per-source acceptance pass (only when the speculative server returns
no ``spec_tokens_details``); the warm-up requests are not written. Writes only that file.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from regen.bench.runner import BenchRun

REQUESTS_FILE = "requests.jsonl"


def write_records(run: BenchRun, path: str | Path) -> Path:
    """Write every level's records (temp name, then rename)."""
    p = Path(path)
    tmp = p.with_name(f".tmp-{p.name}")
    with tmp.open("w", encoding="utf-8") as f:
        for lv in [*run.levels, *run.passes]:
            for r in lv.records:
                f.write(json.dumps(dataclasses.asdict(r), ensure_ascii=False) + "\n")
    tmp.replace(p)
    return p
