"""Overload chaos run: 10% SGLang 503 overloads + 5% cut streams, beside the same run with 429s.

``regen.engine.run_job`` (Ray actors, adaptive limits, the router) regenerates N synthetic
ShareGPT samples against one ``regen simulate`` whose faults are 10% overload + 5% cut streams.
``--fault 503`` (the default) is SGLang's own overload: for a streamed request HTTP 200, then
``data: {"error": {..., "code": 503}}``, usage and ``[DONE]``, no Retry-After; ``--fault 429``
is a gateway's 429 with a Retry-After of 0.2 s; ``--fault none`` is the same run without
faults (the baseline). Checked at the end, as benchmarks/chaos.py
does: sample ids == input ids, no duplicate ``(sample_id, turn)``, every stored answer equal to
the simulator's, no failure on record. While it runs, ``progress.json`` is read every 0.2 s:
the endpoint must never be shown out of rotation. Reported: the server's utilization end to
end and while a backlog exists (benchmarks/_workload.py's measure), faults served, wall time.

    .venv/bin/python -m benchmarks.overload                 # 503, 429, none; 400 samples each
    .venv/bin/python -m benchmarks.overload --fault 503 --samples 150

A local Ray starts in this process (or ``--address`` joins one). tests/reliability runs the
CI size of the 503 run. Files under a temporary work directory (``--keep DIR`` keeps them):
``WORK/<fault>/source.jsonl``, ``manifest.yaml``, ``run/``, ``sim.jsonl`` (request log).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import chaos
from benchmarks._workload import Fleet, Measured

#: the simulated server: 16 slots, 200 steps/s, short answers
SIM: dict[str, Any] = {
    "model_name": chaos.MODEL,
    "max_running_requests": 16,
    "step_ms": 5.0,
    "mean_tokens": 48.0,
    "length_sigma": 0.5,
    "retry_after": 0.2,
    "fault_seed": 11,
}
#: the faults: 10% overload (503 or 429) + 5% cut streams
FAULTS = {"503": {"overload_rate": 0.10, "disconnect_rate": 0.05},
          "429": {"rate_limit_rate": 0.10, "disconnect_rate": 0.05},
          "none": {}}  # fmt: skip
#: engine: a low failure threshold, so leaving rotation would show
ENGINE = {"workers": 2, "concurrency": 32, "endpoint_failure_threshold": 3,
          "endpoint_probe_interval_s": 0.5}  # fmt: skip


def watch_health(progress: Path, stop: threading.Event, seen: dict[str, Any]) -> None:
    """Read progress.json until ``stop``; record every moment an endpoint was not healthy."""
    while not stop.is_set():
        try:
            snap = json.loads(progress.read_text())
        except (OSError, ValueError):
            snap = {}
        for e in snap.get("endpoints") or ():
            seen["polls"] = seen.get("polls", 0) + 1
            if e.get("healthy") is False:
                seen.setdefault("unhealthy", []).append(round(time.monotonic(), 2))
        stop.wait(0.2)


def overload_run(work: Path, fault: str, *, samples: int, address: str | None = None,
                 seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """One run with ``fault`` ("503" or "429") overloads; returns the report."""
    from regen.devkit.simulate.config import SimConfig
    from regen.devkit.simulate.testing import running_simulator
    from regen.engine import RunOptions, run_job
    from regen.manifest import load_manifest
    from regen.store import RunDir

    work.mkdir(parents=True, exist_ok=True)
    src = chaos.write_sharegpt(work / "source.jsonl", samples, seed)
    manifest = chaos.write_manifest(work / "manifest.yaml", src, engine=ENGINE)
    out = work / "run"
    options = {**SIM, **FAULTS[fault]}
    log = work / "sim.jsonl"
    with running_simulator(request_log=log, **options) as sim:
        fleet = Fleet([sim], [log])
        fleet.start(samples)
        stop, seen = threading.Event(), {}
        watcher = threading.Thread(target=watch_health, args=(out / "progress.json", stop, seen),
                                   daemon=True)  # fmt: skip
        watcher.start()
        t0 = time.monotonic()
        try:
            opts = RunOptions(endpoints=[sim.url], address=address, handle_signals=False)
            summary = run_job(load_manifest(manifest), RunDir.open(out, create=False), opts)
        finally:
            stop.set()
            watcher.join(timeout=5)
        wall = time.monotonic() - t0
        measured: Measured = fleet.stop()
        stats = sim.stats()
    verdict = chaos.verify(manifest, out, SimConfig.from_flat(options).answer)
    return {
        "fault": fault,
        "samples": samples,
        "state": summary.state,
        "wall_s": round(wall, 1),
        "utilization": round(measured.utilization, 3),
        "backlog_utilization": round(measured.backlog_utilization, 3),
        "backlog_s": round(measured.backlog_s, 1),
        "server_failed": dict(stats["failed"]),
        "health_polls": seen.get("polls", 0),
        "unhealthy_polls": len(seen.get("unhealthy", [])),
        "verdict": verdict.to_dict(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--fault", choices=list(FAULTS), action="append",
                    help="fault kinds to run, in order (default: 503, 429, none)")  # fmt: skip
    ap.add_argument("--address", help="Ray cluster to join (default: a local Ray)")
    ap.add_argument("--keep", type=Path, help="work directory to keep (default: a temp dir)")
    args = ap.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="regen-overload-"))
    ok = True
    for fault in args.fault or ["503", "429", "none"]:
        report = overload_run(work / fault, fault, samples=args.samples, address=args.address)
        ok = ok and report["verdict"]["ok"] and report["unhealthy_polls"] == 0
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
