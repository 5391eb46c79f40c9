"""Measure the simulator's own ceiling on this machine (not a test; see docs/simulate.md).

    .venv/bin/python tests/devkit/simulate/measure_ceiling.py

Starts `regen simulate` subprocesses, drives them with tests._loadgen from this process
(raw SSE reads, the cheapest client), and prints one JSON line per scenario: achieved tok/s and
req/s, the share of capacity reached, the server's CPU use (cores) and its late steps.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from regen.devkit.simulate.testing import running_simulator
from tests._loadgen import run_load


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scenario(name: str, requests: int, concurrency: int, **options: Any) -> dict[str, Any]:
    with running_simulator(**options) as sim:
        asyncio.run(run_load(sim.url, requests=32, concurrency=8, first=10**6))  # warm up
        sim.reset_stats()
        c0, t0 = cpu_s(sim.process.pid), time.perf_counter()
        res = asyncio.run(run_load(sim.url, requests=requests, concurrency=concurrency))
        wall = time.perf_counter() - t0
        cpu = cpu_s(sim.process.pid) - c0
        st = sim.stats()
    out = {
        "scenario": name,
        "requests": res.requests,
        "failed": res.failed,
        "tok_per_s": round(st["tokens_generated"] / res.wall_s),
        "req_per_s": round(res.req_per_s),
        "capacity_tok_s": None if options.get("instant") else st["capacity_tok_s"],
        "utilization": None if options.get("instant") else round(st["utilization"], 3),
        "occupancy": None if options.get("instant") else round(st["mean_batch_occupancy"], 3),
        "late_steps": st["late_steps"],
        "steps": st["steps"],
        "server_cores": round(cpu / wall, 2),
    }
    print(json.dumps(out))
    return out


def main() -> None:
    fixed = {"length_sigma": 0}
    scenario("20k tok/s, 64 slots, K=1, 400-token answers", 1280, 128,
             step_ms=3.2, mean_tokens=400, **fixed)  # fmt: skip
    scenario("64k tok/s, 64 slots, K=1, 400-token answers", 2560, 128,
             step_ms=1.0, mean_tokens=400, **fixed)  # fmt: skip
    scenario("128k tok/s, 64 slots, K=1, 400-token answers", 2560, 128,
             step_ms=0.5, mean_tokens=400, **fixed)  # fmt: skip
    scenario("instant, 400-token answers, K=1 chunks", 3000, 64,
             instant=True, mean_tokens=400, **fixed)  # fmt: skip
    scenario("instant, 400-token answers, K=8 chunks", 3000, 64,
             instant=True, mean_tokens=400, tokens_per_step=8, **fixed)  # fmt: skip


if __name__ == "__main__":
    main()
