"""What the driver holds in memory per queued sample, measured with tracemalloc.

``python -m benchmarks.queue_memory [N]`` writes N sharegpt-shaped rows (~1 KB each: a
60-word prompt and a 600-character original answer) to a temporary JSONL file, plans them
(:func:`regen.plan.session.plan_session`, no run directory: the bodies go to the spill file)
and builds the dispatch queue (:class:`regen.engine.schedule.WorkQueue`). It prints the Python
memory that stays while the queue dispatches, per sample, and the peak while the plan was
read (exact dedup sets included; near-duplicate detection off). The queue's own share (the
PackedSample heads and the columns) is printed on its own line.
"""

from __future__ import annotations

import gc
import json
import random
import sys
import tempfile
import tracemalloc
from pathlib import Path

from regen.core.sample import Message, Sample
from regen.engine.schedule import WorkQueue
from regen.manifest import parse_manifest
from regen.plan.packed import PackedSample, QueueItems, Spill
from regen.plan.session import plan_session
from regen.sources import source_set

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon")


def write_rows(path: Path, n: int) -> None:
    rng = random.Random(0)
    with path.open("w") as f:
        for i in range(n):
            prompt = f"q{i} " + " ".join(rng.choice(WORDS) for _ in range(60))
            conv = [{"from": "human", "value": prompt}, {"from": "gpt", "value": "a" * 600}]
            f.write(json.dumps({"id": f"conv{i:07d}", "conversations": conv}) + "\n")


def per_plan(n: int) -> tuple[float, float]:
    """(bytes per sample held while dispatching, peak bytes per sample while planning)."""
    d = Path(tempfile.mkdtemp(prefix="regen-qmem-"))
    write_rows(d / "s.jsonl", n)
    m = parse_manifest({"name": "m", "target": {"model": "x", "tokenizer": "tok",
                                                "template": "kimi-k2.5"},
                        "endpoints": [], "dedup": {"near": False},
                        "sources": [{"name": "sharegpt", "adapter": "sharegpt",
                                     "path": str(d / "s.jsonl")}]},
                       origin=str(d / "m.yaml"))  # fmt: skip
    tracemalloc.start()
    gc.collect()
    base = tracemalloc.get_traced_memory()[0]
    plan = plan_session(source_set(m), set(), {})
    queue = WorkQueue(plan.todo, spill=plan.spill)
    gc.collect()
    cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(queue) == n
    plan.spill.close()
    return (cur - base) / n, (peak - base) / n


def per_queue(n: int) -> float:
    """Bytes per sample of the queue alone: PackedSample heads, columns, order."""
    with Spill() as spill:
        tracemalloc.start()
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        items = QueueItems.of(
            PackedSample.pack(Sample(f"sharegpt:conv{i:07d}", "sharegpt",
                                     [Message("user", "q " * 60)]), spill)
            for i in range(n)
        )  # fmt: skip
        queue = WorkQueue(items)
        gc.collect()
        cur = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert len(queue) == n
        return (cur - base) / n


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    held, peak = per_plan(n)
    print(f"{n:,} samples: {held:.0f} B per sample held while dispatching, "
          f"{peak:.0f} B peak while the plan was read")  # fmt: skip
    print(f"the queue alone: {per_queue(n):.0f} B per sample")


if __name__ == "__main__":
    main()
