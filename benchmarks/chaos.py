"""Chaos run: faults on the server and SIGKILLs of the driver; nothing lost, nothing doubled.

``regen run`` regenerates N synthetic ShareGPT-style samples against ``regen simulate`` with
10% HTTP 500s, 5% 429s, 5% mid-stream disconnects and 2% stalls, while the driver's whole
process group is SIGKILLed K times at random moments (seeded) and restarted each time. At the
end the run directory must hold exactly the input: sample ids == input ids, no duplicate
``(sample_id, turn)``, every sample with all its turns, every stored answer byte-equal to
``regen.devkit.simulate.answer(...)`` for the stored request, and no failure on record.

    .venv/bin/python benchmarks/chaos.py                 # full size: 2,000 samples, 5 kills
    .venv/bin/python benchmarks/chaos.py --samples 150 --kills 2 --keep runs/chaos

The full size starts its own loopback Ray head (own temp dir, every port explicit; stopped by
process group at the end, never ``ray stop``). tests/reliability/test_chaos.py runs the CI size
against the test session's head. Files, under a temporary work directory (``--keep DIR`` keeps
them)::

    WORK/source.jsonl     the synthetic ShareGPT rows
    WORK/manifest.yaml    the manifest (engine settings sized for the chaos run)
    WORK/run/             the run directory
    WORK/run-N.log        stdout+stderr of the N-th `regen run` (0-based)
    WORK/ray-*/           Ray node temp dirs (full size only)

Also the home of helpers shared with benchmarks/node_loss.py and tests/reliability: the
synthetic source, the manifest, the Ray node launcher and the verification.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from regen.devkit.procs import kill_group, stop_group

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"
MODEL = "chaos-target"

#: the issue's fault mix
FAULTS: dict[str, float] = {
    "fail_rate": 0.10,
    "rate_limit_rate": 0.05,
    "disconnect_rate": 0.05,
    "stall_rate": 0.02,
}
#: the simulated server: short answers, quick stalls and Retry-After; 8 slots of 100 tok/s
#: (~30 answers/s), so the regeneration lasts long enough for kills to land mid-run
SIM: dict[str, Any] = {
    "model_name": MODEL,
    "max_running_requests": 8,
    "step_ms": 10.0,
    "mean_tokens": 24.0,
    "length_sigma": 0.5,
    "stall_s": 1.0,
    "retry_after": 0.2,
    "fault_seed": 7,
    **FAULTS,
}
#: engine settings: enough attempts to outlast --faulty-attempts 3, short backoff, small parts
ENGINE: dict[str, Any] = {
    "workers": 2,
    "concurrency": 32,
    "max_attempts": 8,
    "backoff_initial_s": 0.05,
    "backoff_max_s": 0.5,
    "request_timeout_s": 30,
    "endpoint_failure_threshold": 8,
    "endpoint_probe_interval_s": 0.5,
    "part_size": 25,
    "part_interval_s": 1.0,
}
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "river",
    "stone",
    "cloud",
    "engine",
    "vector",
    "matrix",
    "prime",
    "orbit",
    "signal",
    "harbor",
    "lantern",
    "copper",
    "violet",
    "summit",
    "meadow",
    "quartz",
]


# -- inputs ---------------------------------------------------------------------------------------


def write_sharegpt(path: Path, n: int, seed: int = 0) -> Path:
    """``n`` distinct ShareGPT rows (``id``, ``conversations``), 1-3 user turns each."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            conv: list[dict[str, str]] = []
            if rng.random() < 0.2:
                conv.append({"from": "system", "value": "You answer briefly."})
            for t in range(rng.choice((1, 1, 2, 3))):
                words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
                conv.append({"from": "human", "value": f"Question {i}.{t}: {words}?"})
                conv.append({"from": "gpt", "value": f"An old answer to {i}.{t}."})
            f.write(json.dumps({"id": f"c{i:05d}", "conversations": conv}) + "\n")
    return path


def write_manifest(
    path: Path,
    source: Path,
    *,
    engine: dict[str, Any] | None = None,
    endpoints: list[dict[str, Any]] | None = None,
    max_tokens: int = 64,
    name: str = "chaos",
) -> Path:
    """A manifest with one ShareGPT source; the demo's tiny Kimi tokenizer renders rows."""
    data = {
        "name": name,
        "target": {"model": MODEL, "tokenizer": str(TOKENIZER)},
        "sampling": {"temperature": 0.6, "max_tokens": max_tokens, "seed": 0},
        "endpoints": endpoints or [],
        "engine": {**ENGINE, **(engine or {})},
        "sources": [{"name": "sharegpt", "adapter": "sharegpt", "path": str(source)}],
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def regen_cmd(manifest: Path, out: Path, url: str, address: str, *extra: str) -> list[str]:
    """The `regen run` argv (no shell)."""
    return [str(VENV_BIN / "regen"), "--log-level", "WARNING", "run", str(manifest),
            "--out", str(out), "--endpoint", url, "--address", address, "--no-view",
            *extra]  # fmt: skip


def answer_config(options: dict[str, Any]) -> Any:
    """The simulator's AnswerConfig for ``options`` (parsed exactly as `regen simulate` does)."""
    from regen.devkit.simulate.config import SimConfig

    return SimConfig.from_flat(options).answer


# -- Ray nodes ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_env(home: Path) -> dict[str, str]:
    """os.environ without Ray leftovers: own HOME, auth off, venv bin first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_TOKEN")}
    env.pop("RAY_ADDRESS", None)
    env.update(HOME=str(home), RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
               PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")  # fmt: skip
    return env


@dataclass(slots=True)
class RayNode:
    """A `ray start --block` process group: a head, or a worker joined to one."""

    proc: subprocess.Popen[bytes]
    address: str  #: the head's GCS address
    temp_dir: Path
    dashboard_url: str | None = None

    def kill(self) -> None:
        """SIGKILL the node's whole process group (raylet, workers, actors on it)."""
        kill_group(self.proc)

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL (never `ray stop`: other heads live here)."""
        stop_group(self.proc, 5)


def start_ray_node(
    temp_dir: Path,
    env: dict[str, str],
    *,
    head_address: str | None = None,
    num_cpus: int = 2,
    resources: dict[str, float] | None = None,
) -> RayNode:
    """Start a loopback Ray head (``head_address`` None) or a worker node joined to one.

    Every port is explicit (fixed defaults collide with other heads on this machine) and the
    node has its own temp dir. Returns once the node is registered with the head.
    """
    temp_dir.mkdir(parents=True, exist_ok=True)
    argv = [str(VENV_BIN / "ray"), "start", "--block", "--node-ip-address=127.0.0.1",
            f"--num-cpus={num_cpus}", f"--temp-dir={temp_dir}", "--disable-usage-stats",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}"]  # fmt: skip
    if resources:
        argv.append(f"--resources={json.dumps(resources)}")
    dashboard = None
    if head_address is None:
        gcs, dash = free_port(), free_port()
        head_address = f"127.0.0.1:{gcs}"
        dashboard = f"http://127.0.0.1:{dash}"
        argv += ["--head", f"--port={gcs}", "--include-dashboard=true",
                 "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
                 f"--ray-client-server-port={free_port()}"]  # fmt: skip
    else:
        argv.append(f"--address={head_address}")
    log = (temp_dir / "ray-start.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)  # fmt: skip
    log.close()
    node = RayNode(proc, head_address, temp_dir, dashboard)
    try:
        _wait_registered(node, env, resources)
    except BaseException:
        node.stop()
        raise
    return node


def _wait_registered(
    node: RayNode, env: dict[str, str], resources: dict[str, float] | None, timeout_s: float = 120
) -> None:
    """Poll `ray status`-free: a tiny subprocess asks the GCS for the node list."""
    want = next(iter(resources)) if resources else None
    probe = ("import ray,sys\nray.init(address=sys.argv[1], logging_level='ERROR')\n"
             "n=[x for x in ray.nodes() if x['Alive']]\nw=sys.argv[2]\n"
             "sys.exit(0 if (not w or any(w in x['Resources'] for x in n)) else 1)\n")  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if node.proc.poll() is not None:
            raise RuntimeError(f"ray start exited: see {node.temp_dir}/ray-start.log")
        r = subprocess.run([sys.executable, "-c", probe, node.address, want or ""], env=env,
                           capture_output=True, timeout=60)  # fmt: skip
        if r.returncode == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"Ray node did not register in {timeout_s:.0f} s ({node.temp_dir})")


# -- the run with kills ------------------------------------------------------------------------


@dataclass(slots=True)
class Kill:
    """One SIGKILL of the driver's process group."""

    session: int  #: which `regen run` (0-based)
    after_s: float  #: seconds after that run started
    stored: int  #: samples stored (parts + journal lines) when it was killed


@dataclass(slots=True)
class Runs:
    """What the sequence of `regen run` invocations did."""

    kills: list[Kill] = field(default_factory=list)
    sessions: int = 0
    final_rc: int | None = None
    wall_s: float = 0.0


def stored_count(out: Path) -> int:
    """Samples stored in the run directory (parts + complete journal lines); 0 when absent."""
    from regen.store import RunDir
    from regen.store.doneset import read_done
    from regen.store.segments import read_journal_lines

    if not out.exists():
        return 0
    try:
        rd = RunDir.open(out, create=False)
        return len(read_done(rd).ids | {s.sample_id for s in read_journal_lines(rd)})
    except (OSError, ValueError):  # a part renamed or deleted under us: ask again
        return -1


def run_with_kills(
    cmd: list[str],
    env: dict[str, str],
    out: Path,
    *,
    total: int,
    kills: int,
    seed: int,
    logs: Path,
    timeout_s: float,
    on_kill: Any = None,
) -> Runs:
    """Run ``cmd`` until it exits 0, SIGKILLing its process group ``kills`` times first.

    Each kill waits until the session has stored a random share of what is left (drawn from
    ``seed``; 0 means during start-up), then a random 0-0.5 s more, so kills land in start-up,
    mid-stream, mid-journal and around part writes. ``on_kill(kill)`` runs after each kill.
    """
    rng = random.Random(seed)
    runs = Runs()
    t_start = time.monotonic()
    deadline = t_start + timeout_s
    while True:
        n = runs.sessions
        runs.sessions += 1
        log = (logs / f"run-{n}.log").open("wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
        log.close()
        t0 = time.monotonic()
        try:
            if len(runs.kills) < kills:
                left = kills - len(runs.kills)
                base = max(0, stored_count(out))
                share = rng.uniform(0.0, 1.0 / (left + 1))
                target = base + int(share * (total - base))
                while proc.poll() is None and time.monotonic() < deadline:
                    if stored_count(out) >= target:
                        break
                    time.sleep(0.1)
                time.sleep(rng.uniform(0.0, 0.5))
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
                    kill = Kill(n, time.monotonic() - t0, max(0, stored_count(out)))
                    runs.kills.append(kill)
                    if on_kill is not None:
                        on_kill(kill)
                    continue
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            raise TimeoutError(
                f"regen run did not finish in {timeout_s:.0f} s; see {logs}"
            ) from None
        if rc == 0:
            runs.final_rc = rc
            break
        if time.monotonic() > deadline or runs.sessions > kills + 3:
            runs.final_rc = rc
            break
    runs.wall_s = time.monotonic() - t_start
    return runs


# -- verification ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Verdict:
    """What the run directory holds compared with the input and the simulator."""

    inputs: int = 0
    stored: int = 0
    rows: int = 0
    duplicates: int = 0
    missing: int = 0
    unexpected: int = 0
    wrong_turns: int = 0
    answers_checked: int = 0
    answers_wrong: int = 0
    failures: int = 0  #: failure records of any kind
    failed: int = 0  #: permanent failures in progress.json
    state: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__} | {"ok": self.ok}


def stored_rows(out: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for p in sorted((out / "parts").glob("*.parquet")):
        rows += pq.read_table(p).to_pylist()
    return rows


def verify(manifest_path: Path, out: Path, answer_cfg: Any) -> Verdict:
    """Compare the run directory with the manifest's input and the simulator's answers."""
    from regen.devkit.simulate import answer
    from regen.manifest import load_manifest
    from regen.sources import read_samples, source_set
    from regen.store import RunDir
    from regen.store.failures import read_failures

    m = load_manifest(manifest_path)
    inputs = {s.id: s for s in read_samples(source_set(m))}
    rows = stored_rows(out)
    v = Verdict(inputs=len(inputs), rows=len(rows))
    ids = {r["sample_id"] for r in rows}
    v.stored = len(ids)
    keys = Counter((r["sample_id"], r["turn"]) for r in rows)
    v.duplicates = sum(n - 1 for n in keys.values() if n > 1)
    v.missing = len(inputs.keys() - ids)
    v.unexpected = len(ids - inputs.keys())
    turns = Counter(r["sample_id"] for r in rows)
    # a conversation ends early at a cut reply (finish_reason "length"): later turns would follow
    # a history the model never sees at serving time (regen.engine.turns)
    ends = {}
    for r in rows:
        if r["finish_reason"] == "length":
            ends[r["sample_id"]] = min(ends.get(r["sample_id"], 1 << 30), r["turn"] + 1)
    v.wrong_turns = sum(1 for sid, s in inputs.items()
                        if sid in ids
                        and turns[sid] != ends.get(sid, s.turns_to_regenerate()))  # fmt: skip
    kwargs = m.template_kwargs()
    for r in rows:
        body = {
            "messages": json.loads(r["messages"]),
            "tools": json.loads(r["tools"]) if r["tools"] else None,
            "seed": m.sampling.seed,
            "max_tokens": m.sampling.max_tokens,
            "chat_template_kwargs": kwargs,
        }
        want = answer(body, answer_cfg)
        v.answers_checked += 1
        same = (
            r["content"] == want.content
            and (r["reasoning"] or "") == want.reasoning
            and r["finish_reason"] == want.finish_reason
        )
        v.answers_wrong += int(not same)
    rd = RunDir.open(out, create=False)
    v.failures = len(read_failures(rd))
    progress = rd.read_json("progress.json") or {}
    v.state = str(progress.get("state", ""))
    v.failed = sum(int(s.get("failed", 0)) for s in progress.get("sources", {}).values())
    checks = {
        "sample ids differ from the input ids": v.missing or v.unexpected,
        "duplicate (sample_id, turn)": v.duplicates,
        "samples without all their turns": v.wrong_turns,
        "answers differ from the simulator's": v.answers_wrong,
        "failure records": v.failures,
        "failed samples in progress.json": v.failed,
        "progress.json state is not finished": v.state != "finished",
        "nothing checked": not v.answers_checked,
    }
    v.problems = [f"{k} ({val})" for k, val in checks.items() if val]
    return v


#: simulator counters shown in the report
SERVER_COUNTERS = ("received", "completed", "failed", "stalled", "client_gone", "errors")


# -- the benchmark --------------------------------------------------------------------------------


@contextlib.contextmanager
def work_dir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="regen-chaos-") as tmp:
        yield Path(tmp)


@contextlib.contextmanager
def work_with_head(keep: Path | None) -> Iterator[tuple[Path, RayNode, dict[str, str]]]:
    """A work directory (``keep``, else a temporary one) with a loopback Ray head of its own
    under it, stopped at the end: (the directory, the head, the environment to talk to it)."""
    with work_dir(keep) as work:
        env = ray_env(work / "home")
        (work / "home").mkdir(exist_ok=True)
        head = start_ray_node(work / "ray-head", env)
        try:
            yield work, head, env
        finally:
            head.stop()


def chaos(
    work: Path,
    address: str,
    env: dict[str, str],
    *,
    samples: int,
    kills: int,
    seed: int = 0,
    timeout_s: float = 1200.0,
) -> tuple[Runs, Verdict, dict[str, Any]]:
    """The whole chaos run in ``work`` against the Ray cluster at ``address``."""
    from regen.devkit.simulate.testing import running_simulator

    src = write_sharegpt(work / "source.jsonl", samples, seed)
    manifest = write_manifest(work / "manifest.yaml", src)
    out = work / "run"
    with running_simulator(**SIM) as sim:
        cmd = regen_cmd(manifest, out, sim.url, address)
        runs = run_with_kills(cmd, env, out, total=samples, kills=kills, seed=seed, logs=work,
                              timeout_s=timeout_s)  # fmt: skip
        stats = sim.stats()
    verdict = verify(manifest, out, answer_config(SIM))
    return runs, verdict, stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-s", type=float, default=1200.0, help="bound on the whole run")
    ap.add_argument("--keep", type=Path, help="work directory to keep (default: a temp dir)")
    args = ap.parse_args(argv)
    with work_with_head(args.keep) as (work, head, env):
        runs, verdict, stats = chaos(work, head.address, env, samples=args.samples,
                                     kills=args.kills, seed=args.seed,
                                     timeout_s=args.timeout_s)  # fmt: skip
        report = {
            "samples": args.samples,
            "kills": [(k.session, round(k.after_s, 2), k.stored) for k in runs.kills],
            "sessions": runs.sessions,
            "final_rc": runs.final_rc,
            "wall_s": round(runs.wall_s, 1),
            "server": {k: stats[k] for k in SERVER_COUNTERS},
            "verdict": verdict.to_dict(),
        }
        sys.stdout.write(json.dumps(report, indent=1) + "\n")
    return 0 if verdict.ok and len(runs.kills) == args.kills and runs.final_rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
