"""Benchmark: server utilization of regen vs a fixed-batch loop and a fixed-concurrency worker
pool, on the same simulated servers and the same 1,500-conversation workload (issue 8).

Each contender runs against fresh ``regen simulate`` subprocesses (R = 64 slots, one step
every ``--step-ms``, K tokens per slot per step, lognormal answer lengths with mean 256,
max_tokens 2048). Printed per contender and endpoint count: utilization end to end and while a
backlog exists (see ``benchmarks/_workload.py``), wall time and throughput; then the bounds of
a perfect client from an event simulation of the same answers, and the scaling ratio of regen
(4 endpoints ÷ 1 endpoint throughput).

- ``regen``: ``regen.engine.run_job`` (Ray actors, adaptive limits, tail-aware order).
- ``pool``: ``64 × endpoints`` asyncio workers, each taking the next conversation in input
  order and running all its turns (the plain worker pool).
- ``batch``: gathers batches of ``64 × endpoints`` conversations and waits for each batch.
  Both baselines use regen's own ChatClient, so the client's cost is the same.

``--length-corr C`` gives the workload's original answers lengths whose logs correlate C with
the simulator's answers to the same turns (the simulator runs with ``--prompt-share C``: the
prompt fixes that share of the log-length variance, see docs/simulate.md); C = 0 (default)
means the original answers say nothing about the target's lengths.

Run: ``.venv/bin/python benchmarks/utilization.py`` (about 4 minutes on 2 cores) or
``--quick`` (300 conversations for the batch loop, no 4-endpoint baselines).
The 4-endpoint runs use ``--k4`` tokens per step at ``4 × step-ms`` by default (same
capacity per server, a quarter of the chunks), because four servers streaming one token per
chunk plus the client do not fit in 2 cores; the 1-endpoint regen run is repeated at the same
setting for the scaling ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _eventsim import bounds, chains
from _workload import Measured, fleet, write_workload

from regen.client import ChatClient, ResolvedEndpoint, RetryPolicy
from regen.client.profiles import SGLANG
from regen.core.sample import Sample
from regen.devkit.simulate import AnswerConfig
from regen.engine import RunOptions, run_job
from regen.engine.inputs import worker_config
from regen.engine.schedule import WorkQueue
from regen.engine.turns import regenerate
from regen.manifest import Manifest, load_manifest
from regen.sources import read_samples, source_set
from regen.store import RunDir

SLOTS = 64


def clients(m: Manifest, urls: list[str]) -> list[ChatClient]:
    config = worker_config(m, [ResolvedEndpoint(url=u, profile=SGLANG) for u in urls])
    retry = RetryPolicy.of(config.retry)
    return [ChatClient.of(ep, config.client, retry=retry) for ep in config.endpoints]


async def one(client: ChatClient, s: Sample) -> None:
    await regenerate(s, lambda msgs, tools: client.complete(msgs, tools, sample_id=s.id))


async def pool(m: Manifest, urls: list[str], samples: list[Sample]) -> None:
    cs = clients(m, urls)
    it = iter(samples)

    async def worker(i: int) -> None:
        for s in it:
            await one(cs[i % len(cs)], s)

    await asyncio.gather(*(worker(i) for i in range(SLOTS * len(urls))))
    for c in cs:
        await c.aclose()


async def batch(m: Manifest, urls: list[str], samples: list[Sample]) -> None:
    cs = clients(m, urls)
    size = SLOTS * len(urls)
    for i in range(0, len(samples), size):
        part = samples[i : i + size]
        await asyncio.gather(*(one(cs[j % len(cs)], s) for j, s in enumerate(part)))
    for c in cs:
        await c.aclose()


def contender(name: str, m: Manifest, urls: list[str], samples: list[Sample], work: Path,
              workers: int) -> None:  # fmt: skip
    if name == "regen":
        out = work / f"run-{time.monotonic_ns()}"
        opts = RunOptions(endpoints=urls, workers=workers, handle_signals=False)
        t0 = time.monotonic()
        summary = run_job(m, RunDir.open(out, create=False), opts)
        assert summary.state == "finished" and summary.done == len(samples), summary
        print(f"regen session: {time.monotonic() - t0:.1f} s from run_job to its return "
              f"(start-up included)", flush=True)  # fmt: skip
    elif name == "pool":
        asyncio.run(pool(m, urls, samples))
    else:
        asyncio.run(batch(m, urls, samples))


def measure(name: str, k: int, m: Manifest, samples: list[Sample], work: Path,
            sim: dict[str, Any], workers: int) -> Measured:  # fmt: skip
    with fleet(k, work, **sim) as f:
        f.start(len(samples))
        contender(name, m, f.urls, samples, work, workers)
        return f.stop()


def row(name: str, k: int, r: Measured, n: int) -> str:
    return (f"{name:<6} {k:>2} ep {n:>5} conv  e2e {r.utilization:6.3f}  backlog "
            f"{r.backlog_utilization:6.3f}  wall {r.wall_s:6.1f}s  {r.throughput:8.0f} tok/s  "
            f"({r.backlog_s:5.1f}s backlog; server occupancy {r.occupancy:.3f}, "
            f"late steps {r.late_steps:.3f})")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--conversations", type=int, default=1500)
    p.add_argument("--step-ms", type=float, default=3.2)
    p.add_argument("--k4", type=int, default=4, help="tokens per step on the 4-endpoint runs")
    p.add_argument("--workers", type=int, default=2, help="regen's Ray actors")
    p.add_argument("--only", nargs="*", default=["regen", "pool", "batch"])
    p.add_argument("--endpoints", nargs="*", type=int, default=[1, 4])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--length-corr", type=float, default=0.0,
                   help="log-length correlation, original vs target answers (0-1)")  # fmt: skip
    p.add_argument(
        "--per-endpoint",
        action="store_true",
        help="scale the workload with the endpoints (4 x conversations on 4)",
    )
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="regen-bench-util-"))
    corr = args.length_corr
    m = load_manifest(write_workload(work, args.conversations, length_corr=corr))
    samples = list(read_samples(source_set(m)))
    answers = AnswerConfig(prompt_share=corr)
    sim1 = {"max_running_requests": SLOTS, "step_ms": args.step_ms, "tokens_per_step": 1,
            "prompt_share": corr}  # fmt: skip
    sim4 = {"max_running_requests": SLOTS, "step_ms": args.step_ms * args.k4,
            "tokens_per_step": args.k4, "prompt_share": corr}  # fmt: skip

    lengths = chains(samples, m, answers)
    q = WorkQueue(samples)
    pos = {s.id: i for i, s in enumerate(samples)}
    order = [pos[s.id] for s in iter(q.pop, None)]
    print(f"workload: {len(samples)} conversations, {sum(map(len, lengths))} turns, "
          f"{sum(map(sum, lengths))} completion tokens, length_corr {corr}; "
          f"work dir {work}")  # fmt: skip
    for slots, label in ((SLOTS, "1 endpoint"), (4 * SLOTS, "4 endpoints")):
        for name, u in bounds(lengths, order, slots).items():
            print(f"bound ({label}, perfect client): {name:<38} {u:.3f}")
    results: dict[tuple[str, int], Measured] = {}
    for k in args.endpoints:
        km, ks = m, samples
        if args.per_endpoint and k > 1:
            km = load_manifest(
                write_workload(work / f"x{k}", k * args.conversations, length_corr=corr)
            )
            ks = list(read_samples(source_set(km)))
            kl = chains(ks, km, answers)
            kq = WorkQueue(ks)
            kpos = {s.id: i for i, s in enumerate(ks)}
            korder = [kpos[s.id] for s in iter(kq.pop, None)]
            for name, u in bounds(kl, korder, k * SLOTS).items():
                print(f"bound ({k} endpoints, {len(ks)} conversations): {name:<38} {u:.3f}")
        for name in args.only:
            if args.quick and k > 1 and name != "regen":
                continue
            subset = ks[:300] if name == "batch" and args.quick else ks
            r = measure(name, k, km, subset, work, sim1 if k == 1 else sim4, args.workers)
            results[(name, k)] = r
            print(row(name, k, r, len(subset)), flush=True)
    if ("regen", 4) in results:
        if args.k4 != 1 or ("regen", 1) not in results:
            r1 = measure("regen", 1, m, samples, work, sim4, args.workers)
            print(row("regen", 1, r1, len(samples)) + f"  [K={args.k4} setting, for scaling]")
        else:
            r1 = results[("regen", 1)]
        r4 = results[("regen", 4)]
        ratio = r4.throughput / r1.throughput
        backlog = (r4.backlog_tokens / r4.backlog_s) / (r1.backlog_tokens / r1.backlog_s)
        print(f"scaling: 4 endpoints / 1 endpoint throughput = {ratio:.2f}x end to end, "
              f"{backlog:.2f}x while a backlog exists")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
