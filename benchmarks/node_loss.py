"""Node loss: a second Ray node holding some of the workers is killed mid-run; the job finishes.

A worker node joins the head on this machine (``ray start --address HEAD --num-cpus 1
--resources '{"worker_node": 4}'``, own temp dir, every port explicit). ``regen run`` starts
its actors with the SPREAD strategy, so some land on the worker node; once one does and some
samples are stored, the node's whole process group (raylet, its workers, the actors on it) is
SIGKILLed. The driver requeues the dead actors' samples to the survivors, starts replacements
on the remaining node and finishes in the same session, with the chaos run's guarantees:
sample ids == input ids, no duplicate ``(sample_id, turn)``, every answer byte-equal to the
simulator's, nothing failed.

    .venv/bin/python -m benchmarks.node_loss                  # full size: 2,000 samples
    .venv/bin/python -m benchmarks.node_loss --samples 200 --keep runs/node-loss

The full size starts its own loopback head (stopped by process group, never ``ray stop``);
tests/reliability/test_node_loss.py runs the CI size against the test session's head. Files,
under a temporary work directory (``--keep DIR`` keeps them): ``source.jsonl``,
``manifest.yaml``, ``run/`` (the run directory), ``run-0.log``, ``ray-worker-start.log`` (and
``ray-head/`` for the full size). The worker node's own temp dir is a short
``/tmp/regen-node-*`` (Ray's socket paths must stay under 107 bytes), removed at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import chaos
from regen.devkit.procs import kill_group

#: the worker node's custom resource (marks it in the node list)
WORKER_RESOURCE = "worker_node"
#: the simulated server: no faults, 8 slots of 50 tok/s (~16 answers/s), so the run lasts
#: long enough to lose a node in it
SIM: dict[str, Any] = {
    "model_name": chaos.MODEL,
    "max_running_requests": 8,
    "step_ms": 20.0,
    "mean_tokens": 24.0,
    "length_sigma": 0.5,
}
#: more actors than nodes: SPREAD puts some on each node
ENGINE: dict[str, Any] = {"workers": 4, "concurrency": 8}


@dataclass(slots=True)
class NodeLoss:
    """What happened around the node kill."""

    actors_on_node: list[str] = field(default_factory=list)  #: names of actors placed there
    killed_at_s: float | None = None  #: seconds after the run started
    stored_at_kill: int = 0
    rc: int | None = None
    wall_s: float = 0.0
    worker_died: int = 0  #: progress.json errors["worker_died"].count
    actor_pids_gone: bool = False  #: the actors' processes on the node were gone within 30 s


def actors_on(dashboard_url: str, node_id: str) -> list[dict[str, Any]]:
    """Live regen worker actors on ``node_id`` (Ray state API over the dashboard)."""
    from ray.util.state import list_actors

    actors = list_actors(address=dashboard_url, filters=[("state", "=", "ALIVE")], limit=1000,
                         raise_on_missing_output=False)  # fmt: skip
    return [{"name": a.name, "pid": a.pid} for a in actors
            if a.node_id == node_id and a.class_name == "WorkerActor"]  # fmt: skip


def worker_node_id(dashboard_url: str) -> str:
    from ray.util.state import list_nodes

    for n in list_nodes(address=dashboard_url, limit=1000, raise_on_missing_output=False):
        if n.state == "ALIVE" and WORKER_RESOURCE in (n.resources_total or {}):
            return n.node_id
    raise RuntimeError("the worker node is not in the node list")


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def node_loss(
    work: Path,
    head_address: str,
    dashboard_url: str,
    env: dict[str, str],
    *,
    samples: int,
    kill_after: float = 0.25,
    timeout_s: float = 900.0,
    sim: dict[str, Any] | None = None,
) -> tuple[NodeLoss, chaos.Verdict]:
    """Start a worker node, run the job, kill the node once ``kill_after`` of it is stored."""
    sim_opts = {**SIM, **(sim or {})}
    from regen.devkit.simulate.testing import running_simulator

    src = chaos.write_sharegpt(work / "source.jsonl", samples, seed=1)
    manifest = chaos.write_manifest(work / "manifest.yaml", src, engine=ENGINE, name="node-loss")
    out = work / "run"
    res = NodeLoss()
    # a short temp dir: Ray's socket paths below it must stay under 107 bytes
    node_tmp = Path(tempfile.mkdtemp(prefix="regen-node-"))
    node = chaos.start_ray_node(node_tmp, env, head_address=head_address, num_cpus=1,
                                resources={WORKER_RESOURCE: 4})  # fmt: skip
    try:
        node_id = worker_node_id(dashboard_url)
        with running_simulator(**sim_opts) as server:
            cmd = chaos.regen_cmd(manifest, out, server.url, head_address)
            t0 = time.monotonic()
            deadline = t0 + timeout_s
            with (work / "run-0.log").open("wb") as log:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)  # fmt: skip
            try:
                on_node: list[dict[str, Any]] = []
                while not on_node and proc.poll() is None and time.monotonic() < deadline:
                    on_node = actors_on(dashboard_url, node_id)  # SPREAD placed some there
                    time.sleep(0.2)
                while proc.poll() is None and time.monotonic() < deadline:
                    if chaos.stored_count(out) >= int(kill_after * samples):
                        break
                    time.sleep(0.1)
                if proc.poll() is None and on_node:
                    on_node = actors_on(dashboard_url, node_id) or on_node  # all of them now
                    res.stored_at_kill = max(0, chaos.stored_count(out))
                    node.kill()
                    res.killed_at_s = time.monotonic() - t0
                    res.actors_on_node = [a["name"] for a in on_node]
                    pids = [a["pid"] for a in on_node]
                    gone_by = time.monotonic() + 30  # orphans are reaped, or exit on their own
                    while any(pid_alive(p) for p in pids) and time.monotonic() < gone_by:
                        time.sleep(0.1)
                    res.actor_pids_gone = not any(pid_alive(p) for p in pids)
                res.rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            finally:
                if proc.poll() is None:
                    kill_group(proc, 30)
            res.wall_s = time.monotonic() - t0
    finally:
        node.stop()
        shutil.copy2(node_tmp / "ray-start.log", work / "ray-worker-start.log")
        shutil.rmtree(node_tmp, ignore_errors=True)
    progress = json.loads((out / "progress.json").read_text()) if out.exists() else {}
    res.worker_died = int(progress.get("errors", {}).get("worker_died", {}).get("count", 0))
    return res, chaos.verify(manifest, out, chaos.answer_config(sim_opts))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--kill-after", type=float, default=0.25, help="stored share at the kill")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="bound on the run")
    ap.add_argument("--slots", type=int, default=32, help="the simulator's batch slots")
    ap.add_argument("--keep", type=Path, help="work directory to keep (default: a temp dir)")
    args = ap.parse_args(argv)
    with chaos.work_dir(args.keep) as work:
        (work / "home").mkdir(exist_ok=True)
        env = chaos.ray_env(work / "home")
        head = chaos.start_ray_node(work / "ray-head", env)
        try:
            assert head.dashboard_url is not None
            res, verdict = node_loss(work, head.address, head.dashboard_url, env,
                                     samples=args.samples, kill_after=args.kill_after,
                                     timeout_s=args.timeout_s,
                                     sim={"max_running_requests": args.slots})  # fmt: skip
        finally:
            head.stop()
        report = {"samples": args.samples, "node_loss": {k: getattr(res, k) for k in res.__slots__},
                  "verdict": verdict.to_dict()}  # fmt: skip
        sys.stdout.write(json.dumps(report, indent=1) + "\n")
    ok = verdict.ok and res.rc == 0 and res.killed_at_s is not None and res.worker_died >= 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
