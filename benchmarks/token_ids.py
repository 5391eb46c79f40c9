"""Benchmark: where the row's token ids come from — the server's ids streamed (``sglext``),
the server's ids in one JSON answer, or a local render — measured in one run.

One ``regen simulate`` subprocess with the demo's tiny Kimi tokenizer (so it returns real
ids) and its capacity model (``--slots`` batch slots, one step every ``--step-ms``) serves
the three modes in turn, each on a fresh copy of the same samples (the server's per-request
counters are reset between modes). Each mode runs regen's own per-actor path:
:class:`regen.engine.worker.SampleWorker` with the real row builder (``regen.engine.rows``: the
local render, and the cross-check of server ids), ``--concurrency`` samples in flight.

Printed per mode: client CPU seconds per 1,000 requests (this process: HTTP, SSE parsing,
rows; the server's CPU is not counted), the server's utilization over the mode's window
(generated tokens ÷ capacity × wall), wall time, and the rows' ``token_source`` /
``token_check`` counts.

Run: ``.venv/bin/python benchmarks/token_ids.py`` (~1 minute) or ``--samples 200`` for a
quick look. Timings on a shared 2-core machine are noisy: compare the modes within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from client_cost import cpu_s, manifest

from regen.core.sample import Message, Sample
from regen.devkit.simulate.testing import running_simulator
from regen.engine.inputs import worker_config
from regen.engine.worker import SampleWorker
from regen.manifest import Endpoint

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"
MODEL = "ids-target"
MODES = ("stream", "nonstream", "local")


def samples(n: int, tag: str) -> list[Sample]:
    return [Sample(f"s:{tag}{i}", "s", [Message("user", f"Question {i}: explain item {i}.")])
            for i in range(n)]  # fmt: skip


async def run_mode(worker: SampleWorker, items: list[Sample],
                   concurrency: int) -> tuple[float, Counter[str]]:  # fmt: skip
    kinds: Counter[str] = Counter()
    it = iter(items)

    async def lane() -> None:
        for s in it:
            out = await worker.process(s)
            assert out.status == "done", out
            for r in out.rows:
                kinds[f"{r['token_source']}/{r['token_check']}"] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return time.perf_counter() - t0, kinds


async def measure(url: str, info: Any, args: argparse.Namespace, sim: Any) -> None:
    """Build the three workers and warm each up (tokenizer load, connections) before any
    mode is timed, then time the modes one after the other."""
    max_tokens = 4 * int(args.mean_tokens)
    manifests = {mode: manifest(url, max_tokens, model=MODEL, tokenizer=str(TOKENIZER),
                                token_ids=mode) for mode in MODES}  # fmt: skip
    workers = {
        mode: SampleWorker(
            replace(
                worker_config(manifests[mode], [info.resolved()]), concurrency=args.concurrency
            ),
            shares={url: args.concurrency},
        )
        for mode in MODES
    }
    for mode, w in workers.items():
        await run_mode(w, samples(args.concurrency, f"warm-{mode}"), args.concurrency)
    for mode, w in workers.items():
        await asyncio.to_thread(sim.reset_stats)
        c0 = cpu_s()
        wall, kinds = await run_mode(w, samples(args.samples, mode), args.concurrency)
        c1 = cpu_s()
        st = await asyncio.to_thread(sim.stats)
        util = st["tokens_generated"] / (st["capacity_tok_s"] * wall) if wall else 0.0
        print(f"{mode:<9} {1000 * (c1 - c0) / st['completed']:6.2f} CPU-s per 1,000 requests  "
              f"utilization {util:5.3f}  wall {wall:5.1f}s  {st['completed']} requests  "
              f"rows {dict(kinds)}", flush=True)  # fmt: skip
    for w in workers.values():
        await w.aclose()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=600)
    p.add_argument("--slots", type=int, default=32)
    p.add_argument("--step-ms", type=float, default=4.0)
    p.add_argument("--mean-tokens", type=float, default=160.0)
    p.add_argument("--concurrency", type=int, default=40)
    args = p.parse_args()
    sim = {"model_name": MODEL, "tokenizer": str(TOKENIZER),
           "max_running_requests": args.slots, "step_ms": args.step_ms,
           "mean_tokens": args.mean_tokens, "length_sigma": 0.5}  # fmt: skip
    print(f"{args.samples} one-turn samples per mode, {args.slots} slots x {args.step_ms} ms "
          f"steps, mean {args.mean_tokens:.0f} tokens, {args.concurrency} in flight; load "
          f"average {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    with running_simulator(**sim) as s:
        from regen.client import check_endpoints

        (info,) = asyncio.run(check_endpoints([Endpoint(url=s.url)], MODEL))
        asyncio.run(measure(s.url, info, args, s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
