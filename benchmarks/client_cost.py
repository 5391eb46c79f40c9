"""Benchmark: the client's cost per streamed request and the request rate it sustains against
an instant server (issue 8).

A ``regen simulate --instant`` subprocess answers at once (fixed-length answers of
``--tokens`` simulated tokens, ``--k`` tokens per SSE chunk). This process drives it through
regen's own request path, on one event loop, ``--concurrency`` requests at a time:

- ``client``: :meth:`regen.client.ChatClient.complete_once` (HTTP, SSE parsing, TurnResult);
- ``worker``: :meth:`regen.engine.worker.SampleWorker.process` with rows stubbed (adds the
  router lease, slots, adaptive limit and retry wrapper: what one actor does per sample);
- ``nocut``: ``client`` with ``quality.loop_cut`` off: the loop watch's own cost is the
  difference (a look every 128 tokens of each answer, regen.quality.loop).

Printed: CPU seconds of this process per 1,000 requests (user + system; the server's CPU is
not counted), requests/s, and the server's CPU share over the same interval. Target: <= 3
CPU-s per 1,000 streamed ~400-token requests; >= 2,000 requests/s.

Run: ``.venv/bin/python benchmarks/client_cost.py`` (~1 minute; ``--quick`` ~20 s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from dataclasses import replace
from typing import Any

from regen.client import ChatClient, ResolvedEndpoint, RetryPolicy
from regen.client.profiles import SGLANG
from regen.core.sample import Message, Sample
from regen.devkit.simulate.testing import running_simulator
from regen.engine.inputs import worker_config
from regen.engine.worker import SampleWorker
from regen.manifest import parse_manifest

MODEL = "bench-target"


def manifest(url: str, max_tokens: int, *, model: str = MODEL, tokenizer: str = "unused",
             cut: bool = True, **sampling: Any) -> Any:  # fmt: skip
    """A one-endpoint manifest for driving ``url`` (extra ``sampling`` fields allowed;
    ``cut``: quality.loop_cut on)."""
    return parse_manifest({
        "quality": {"loop_cut": {"enabled": cut}},
        "name": "bench",
        "target": {"model": model, "tokenizer": tokenizer},
        "sampling": {"max_tokens": max_tokens, "seed": 0, **sampling},
        "endpoints": [{"url": url}],
        "engine": {"max_attempts": 2},
        "sources": [{"name": "s", "adapter": "sharegpt", "path": "x.jsonl"}],
    })  # fmt: skip


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(make: Any, n: int, concurrency: int) -> None:
    it = iter(range(n))

    async def worker() -> None:
        for i in it:
            await make(i)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def stub_rows(sample: Sample, turns: list[Any]) -> list[dict[str, Any]]:
    return [{"completion_tokens": t.result.completion_tokens} for t in turns]


async def run_path(path: str, url: str, n: int, concurrency: int, tokens: int) -> float:
    m = manifest(url, tokens, cut=path != "nocut")
    config = replace(worker_config(m, [ResolvedEndpoint(url=url, profile=SGLANG)]),
                     concurrency=concurrency)  # fmt: skip
    if path in ("client", "nocut"):
        retry = RetryPolicy.of(config.retry)
        client = ChatClient.of(config.endpoints[0], config.client, retry=retry)

        async def make(i: int) -> None:
            r = await client.complete_once([{"role": "user", "content": f"q{i}"}], None,
                                           sample_id=str(i))  # fmt: skip
            assert r.finish_reason in ("stop", "length")

        await drive(make, 64, concurrency)  # warm-up: connections, imports
        t0 = time.perf_counter()
        await drive(make, n, concurrency)
        wall = time.perf_counter() - t0
        await client.aclose()
        return wall
    worker = SampleWorker(config, row_builder=stub_rows, probe=lambda u: None)

    async def process(i: int) -> None:
        out = await worker.process(Sample(f"s:{i}", "s", [Message("user", f"q{i}")]))
        assert out.status == "done", out

    await drive(process, 64, concurrency)
    t0 = time.perf_counter()
    await drive(process, n, concurrency)
    wall = time.perf_counter() - t0
    await worker.aclose()
    return wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--tokens", type=int, default=400, help="answer length (simulated tokens)")
    p.add_argument("--k", type=int, default=1, help="tokens per SSE chunk")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--paths", nargs="*", default=["client", "nocut", "worker"])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    n = 1000 if args.quick else args.requests
    sim = {"instant": True, "mean_tokens": args.tokens, "length_sigma": 0,
           "tokens_per_step": args.k, "model_name": MODEL}  # fmt: skip
    print(f"{n} streamed requests of {args.tokens} tokens, {args.k} token(s) per chunk, "
          f"{args.concurrency} in flight; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    with running_simulator(**sim) as s:
        assert s.process is not None
        for path in args.paths:
            c0, s0 = cpu_s(), proc_cpu_s(s.process.pid)
            wall = asyncio.run(run_path(path, s.url, n, args.concurrency, args.tokens + 64))
            c1, s1 = cpu_s(), proc_cpu_s(s.process.pid)
            print(f"{path:<7} {1000 * (c1 - c0) / n:6.2f} CPU-s per 1,000 requests  "
                  f"{n / wall:7.0f} req/s  client {(c1 - c0) / wall:4.2f} cores, "
                  f"server {(s1 - s0) / wall:4.2f} cores", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
