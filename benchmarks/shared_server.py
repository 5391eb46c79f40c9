"""Shared server: routing by regen's own counts (before) against reading the servers' /metrics
(after), measured in one run (issue 24).

Two ``regen simulate`` subprocesses speak SGLang 0.5.23 with ``--enable-metrics``, the same
batch slots and ``--max-queued-requests`` (a full queue is SGLang's 503). The second also
serves another client (``--background-requests``, half its slots, answers that never end
during the run): a shared production server. ``--workers`` :class:`regen.engine.worker.SampleWorker`
(the body of a Ray worker actor: router, adaptive limits, retries with real back-off; each
with its share of the servers' slots, as regen.engine.pool gives them, and its own poller of
the pages) regenerate the same single-turn samples twice, fed from one queue as the driver
feeds its actors (each keeps twice its slots of samples and takes the next as one is done):

- ``before``: ``server_metrics=False``, today's scheduling without a page: least outstanding
  routing, limits from the slots ``/server_info`` reports and the 503s;
- ``after``: the pages read every ``--interval`` seconds: routing weighs what each server holds
  from other clients, the limits follow the servers' own queues (regen.engine.adaptive).

Reported per arm: wall time; per endpoint, the batch occupancy while a backlog exists (the
server's busy slots over its steps, every client's requests counted: on the shared server
the other client's half included) and the 503s (the simulator's ``queue_full``), with the
503s per 1,000 requests sent (and per 1,000 the servers received after the first 2 s, the
start left out); then the ratios. Targets (issue 24): end to end >= 15% shorter,
503s per 1,000 at least 5x fewer, occupancy while a backlog exists >= 0.98 on the unshared
endpoint.

    .venv/bin/python -m benchmarks.shared_server               # 600 samples per arm
    .venv/bin/python -m benchmarks.shared_server --samples 240 # the test's size
    .venv/bin/python -m benchmarks.shared_server --workers 4   # four actors' shares

tests/reliability/test_shared_server.py runs a small size and asserts the ratios.
Owns no files (the simulators' temporary directories are theirs).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import threading
import time
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field, replace
from typing import Any

from regen.client import RetryPolicy
from regen.client.endpoints import EndpointInfo
from regen.client.profiles.sglang import identity_of
from regen.core.sample import Message, Sample
from regen.devkit.simulate.testing import RunningSimulator, running_simulator
from regen.engine.adaptive import split
from regen.engine.inputs import worker_config
from regen.engine.worker import SampleWorker
from regen.manifest import Manifest, parse_manifest

MODEL = "sim/shared"
SLOTS = 16
#: both servers: SGLang with metrics, 16 slots, a queue of at most 6, 4 tokens per 20 ms step
SIM: dict[str, Any] = {
    "model_name": MODEL,
    "enable_metrics": True,
    "max_running_requests": SLOTS,
    "max_queued_requests": 6,
    "step_ms": 20.0,
    "tokens_per_step": 4,
    "mean_tokens": 96.0,
    "length_sigma": 0.4,
}
#: the shared server's other client: half the slots, answers that outlast the run
BACKGROUND: dict[str, Any] = {"background_requests": SLOTS // 2,
                              "background_max_tokens": 100_000_000}  # fmt: skip
#: seconds between two readings of a page in the "after" arm (production: 5)
INTERVAL_S = 0.5
#: seconds between two samples of the servers' /stats
POLL_S = 0.1
#: seconds of the start left out of the steady-state 503 rate
START_S = 2.0


def manifest(urls: list[str]) -> Manifest:
    return parse_manifest({
        "name": "shared-server",
        "target": {"model": MODEL, "tokenizer": "none"},
        "sampling": {"max_tokens": 1024, "seed": 0},
        "endpoints": [{"url": u} for u in urls],
        "engine": {"max_attempts": 50, "endpoint_failure_threshold": 1000},
        "sources": [{"name": "s", "adapter": "sharegpt", "path": "none.jsonl"}],
    })  # fmt: skip


def endpoint(sim: RunningSimulator) -> EndpointInfo:
    """What the start check finds in SGLang's /server_info: its batch slots and its
    --max-queued-requests."""
    found = identity_of(sim.get("/server_info"))
    return EndpointInfo(url=sim.url, weight=1.0, models=(MODEL,), engine="sglang",
                        max_running_requests=found.max_running_requests,
                        slots_source=found.slots_source,
                        max_queued_requests=found.max_queued_requests)  # fmt: skip


def no_rows(sample: Sample, turns: list[Any]) -> list[dict[str, Any]]:
    return [{"sample_id": sample.id, "endpoint": t.result.endpoint} for t in turns]


@dataclass(slots=True)
class Stats:
    """The servers' /stats, sampled while the arm runs, and whether a backlog existed."""

    points: list[tuple[float, bool, list[dict[str, Any]]]] = field(default_factory=list)


def poll(sims: list[RunningSimulator], workers: list[SampleWorker], left: list[int],
         stop: threading.Event, into: Stats) -> None:  # fmt: skip
    while not stop.is_set():
        t = time.monotonic()
        # samples wait: for a worker's slot, or not yet taken by any worker
        backlog = left[0] > 0 or any(w.slots.waiting for w in workers)
        with suppress(OSError):  # a reading missed: the next one counts
            into.points.append((t, backlog, [s.stats() for s in sims]))
        stop.wait(POLL_S)


def occupancy(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """The share of batch slots busy over the steps between two /stats readings."""

    def slot_steps(s: dict[str, Any]) -> float:
        return s["mean_batch_occupancy"] * s["steps"]

    steps = b["steps"] - a["steps"]
    return (slot_steps(b) - slot_steps(a)) / steps if steps > 0 else None


def backlog_occupancy(stats: Stats, i: int) -> float | None:
    """Endpoint ``i``'s occupancy from the first to the last reading with a backlog."""
    marked = [p for p in stats.points if p[1]]
    if len(marked) < 2:
        return None
    return occupancy(marked[0][2][i], marked[-1][2][i])


def steady_per_1000(stats: Stats, skip_s: float = START_S) -> float | None:
    """503s per 1,000 requests the servers received after the first ``skip_s`` seconds (the
    start's burst left out: every sample's first request arrives at once, and a burst larger
    than the queue is refused whatever the client knows)."""
    if not stats.points:
        return None
    t0 = stats.points[0][0]
    later = [p for p in stats.points if p[0] >= t0 + skip_s]
    if len(later) < 2:
        return None
    a, b = later[0][2], later[-1][2]
    refused = sum(y["queue_full"] - x["queue_full"] for x, y in zip(a, b, strict=True))
    received = sum(y["received"] - x["received"] for x, y in zip(a, b, strict=True))
    return round(1000 * refused / received, 1) if received else None


async def regenerate_all(workers: list[SampleWorker], n: int, backlog: list[int]) -> list[Any]:
    """All samples from one queue, as the driver feeds its actors: each worker keeps twice its
    slots of samples (its mailbox), and takes the next as one of them is done. ``backlog``
    holds the samples not yet taken (for the occupancy while a backlog exists)."""
    samples = collections.deque(
        Sample(f"s:{i}", "s", [Message("user", f"question {i}: tell me about {i}")])
        for i in range(n)
    )
    backlog[0] = n
    outs: list[Any] = []

    async def feed(worker: SampleWorker) -> None:
        while samples:
            backlog[0] = len(samples) - 1
            outs.append(await worker.process(samples.popleft()))

    try:
        await asyncio.gather(*(feed(w) for w in workers for _ in range(2 * w.slots.capacity)))
        return outs
    finally:
        for w in workers:
            await w.aclose()


def run_arm(name: str, sims: list[RunningSimulator], samples: int, interval_s: float,
            n_workers: int = 1) -> dict[str, Any]:  # fmt: skip
    """One arm against the running servers (their counters reset first)."""
    for s in sims:
        s.reset_stats()
    m = manifest([s.url for s in sims])
    infos = [endpoint(s).resolved() for s in sims]
    config = replace(worker_config(m, infos), server_metrics=name == "after")
    workers = [
        SampleWorker(config, row_builder=no_rows, retry=RetryPolicy.of(config.retry),
                     shares={i.url: split(i.max_running_requests or 1, n_workers, k)
                             for i in infos},
                     metrics_interval_s=interval_s)
        for k in range(n_workers)
    ]  # fmt: skip
    stats, stop = Stats(), threading.Event()
    left = [samples]
    poller = threading.Thread(target=poll, args=(sims, workers, left, stop, stats), daemon=True)
    poller.start()
    t0 = time.monotonic()
    try:
        outs = asyncio.run(regenerate_all(workers, samples, left))
    finally:
        stop.set()
        poller.join(timeout=10)
    wall = time.monotonic() - t0
    final = [s.stats() for s in sims]
    by_endpoint = {s.url: 0 for s in sims}
    for o in outs:
        for row in o.rows:
            by_endpoint[row["endpoint"]] += 1
    refused = [f["queue_full"] for f in final]
    sent = sum(w.stats.sent for w in workers)
    return {
        "arm": name,
        "samples": samples,
        "workers": n_workers,
        "done": sum(o.status == "done" for o in outs),
        "wall_s": round(wall, 2),
        "requests_sent": sent,
        "per_1000": round(1000 * sum(refused) / max(1, sent), 1),
        "per_1000_after_start": steady_per_1000(stats),
        "endpoints": [
            {
                "endpoint": ("unshared", "shared")[i],
                "answered": by_endpoint[s.url],
                "503": refused[i],
                "backlog_occupancy": _round(backlog_occupancy(stats, i)),
                "limit_end": sum(w.lanes[s.url].limit.current for w in workers),
            }
            for i, s in enumerate(sims)
        ],
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _ratio(before: float | None, after: float | None) -> float | None:
    if before is None or after is None:
        return None
    return round(before / after, 1) if after else float("inf") if before else 1.0


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The ratios the targets are about."""
    b503, a503 = before["per_1000"], after["per_1000"]
    return {
        "time_saved": round(1 - after["wall_s"] / before["wall_s"], 3),
        "fewer_503_x": _ratio(b503, a503),
        "fewer_503_after_start_x": _ratio(
            before["per_1000_after_start"], after["per_1000_after_start"]
        ),
        "unshared_backlog_occupancy": after["endpoints"][0]["backlog_occupancy"],
    }


def measure(samples: int, interval_s: float = INTERVAL_S, workers: int = 1) -> dict[str, Any]:
    """Both arms on the same two servers, before first."""
    with ExitStack() as stack:
        free = stack.enter_context(running_simulator(**SIM))
        shared = stack.enter_context(running_simulator(**SIM, **BACKGROUND))
        deadline = time.monotonic() + 30
        while shared.stats()["running"] < BACKGROUND["background_requests"]:
            if time.monotonic() > deadline:
                raise RuntimeError("the shared server's other client did not start")
            time.sleep(0.05)
        before = run_arm("before", [free, shared], samples, interval_s, workers)
        after = run_arm("after", [free, shared], samples, interval_s, workers)
    return {"before": before, "after": after, "ratios": compare(before, after)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--interval", type=float, default=INTERVAL_S,
                    help="seconds between two readings of a page (after)")  # fmt: skip
    ap.add_argument("--workers", type=int, default=1,
                    help="workers (actors), each with its share of the slots")  # fmt: skip
    args = ap.parse_args(argv)
    report = measure(args.samples, args.interval, args.workers)
    for arm in ("before", "after"):
        sys.stdout.write(json.dumps(report[arm]) + "\n")
    sys.stdout.write(json.dumps(report["ratios"]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
