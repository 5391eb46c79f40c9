"""Benchmarks: time from start to the first new request on a half-done run directory, and peak
memory of the driver and actors on a Perfect-Blend-scale manifest (issue 8).

``resume``: a synthetic ShareGPT-style source of ``--samples`` rows (default 83,288; 1,400,000
for the scale check) and a run directory as its first session leaves it half done: the plan
index that session wrote (plan/) and parts holding half of the samples with their records
(``--part-rows`` rows per part, full row schema; ``input_ids`` short, since resume reads only
the id and counter columns). The source is read once first (``read_samples``, timed: the
yardstick). Then ``run_job`` starts against an instant ``regen simulate`` and the time from
the call to the first request the server receives is printed with its ratio to the source
read, once with a Ray head already running (a cluster: ``ray job submit``; this is the first
``run_job`` of the process, so it also pays the lazy imports) and once with regen starting a
local Ray itself (``regen run`` on one machine). The session is stopped right after.
Target: <= 0.3 x the source read with a Ray head running, flat from 83K to 1.4M.

``memory``: a synthetic source of ``--samples`` rows (default 1,400,000; ~600 characters a
conversation, 30% multi-turn), ``run_job`` against an instant simulator for ``--seconds``,
then the peak RSS (VmHWM) of the driver process and of each actor process. Target: <= 1.5 GB.

``driver-cpu``: the driver's CPU per sample, read from ``/proc/self/stat`` (user + system of
every thread of the driver process: the dispatch loop, the journal and parts, progress, the
plan thread and Ray's own threads in it), on the 1,500-conversation benchmark workload
(``benchmarks/_workload.py``) against one simulated SGLang (64 slots, 3.2 ms steps, 1 token
per step: 20,000 tok/s). Printed: the whole session, the part before the first request
(imports, preflight, plan, Ray and actor start), and the dispatch phase (first request to the
end), each in CPU-ms per sample. :func:`driver_cpu` is importable (``benchmarks/cpu.py``).
Target: <= 1 ms per sample in the dispatch phase.

Run: ``.venv/bin/python benchmarks/resume_memory.py resume`` (~1 min),
``.venv/bin/python benchmarks/resume_memory.py memory`` (~3 min; ``--samples`` to scale) and
``.venv/bin/python benchmarks/resume_memory.py driver-cpu`` (~1 min).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import MODEL, make_rows, write_workload

from regen.devkit.procs import stop_group
from regen.devkit.simulate.testing import running_simulator
from regen.engine import RunOptions, run_job
from regen.manifest import load_manifest
from regen.plan.session import plan_session
from regen.sources import read_samples, source_set
from regen.store import RunDir, layout
from regen.store.counts import SourceCounts
from regen.store.parts import make_record, part_bytes
from regen.store.schema import SCHEMA

log = logging.getLogger("benchmarks.resume_memory")

#: the benchmark workload's simulator (docs/performance.md): 64 slots, 20,000 tok/s
BENCH_SIM = {"max_running_requests": 64, "step_ms": 3.2, "tokens_per_step": 1}

#: the rows repeat a 5,000-row block behind a unique "#i" prefix: exact dedup keeps them all,
#: near-duplicate detection would drop all but 5,000 (its own memory: benchmarks/neardup.py)
NO_NEAR_DUP = ["dedup.near=false"]


def write_rows(path: Path, n: int) -> None:
    """``n`` workload rows (generated in blocks: the generator's text is the cost), original
    answers cut to 60 characters (rows of ~1 KB, the size every figure here was measured at)."""
    block = make_rows(5000)
    with path.open("w") as f:
        for i in range(n):
            conv = [dict(t) for t in block[i % len(block)]["conversations"]]
            for t in conv:  # short original answers: ~1 KB rows, as measured before
                if t["from"] == "gpt":
                    t["value"] = t["value"][:60]
            conv[0]["value"] = f"#{i} " + conv[0]["value"]  # unique: sources deduplicate
            f.write(json.dumps({"id": f"c{i:08d}", "conversations": conv}))
            f.write("\n")


def write_done_parts(run: Path, ids: list[str], part_rows: int) -> None:
    """Parts holding one row per id, every column of the schema filled, each with its record
    (as a session writes them)."""
    rd = RunDir.open(str(run))
    rd.makedirs(layout.PARTS_DIR)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for p, start in enumerate(range(0, len(ids), part_rows)):
        chunk = ids[start : start + part_rows]
        n = len(chunk)
        cols = {}
        for f in SCHEMA:
            if f.name == "sample_id":
                cols[f.name] = pa.array(chunk, f.type)
            elif f.name == "source":
                cols[f.name] = pa.array(["sharegpt"] * n, f.type)
            elif pa.types.is_list(f.type) and pa.types.is_string(f.type.value_type):
                cols[f.name] = pa.array([[]] * n, f.type)  # quality_flags: none
            elif pa.types.is_list(f.type):
                cols[f.name] = pa.array([[1] * 64] * n, f.type)
            elif pa.types.is_string(f.type):
                value = {"created_at": now, "finish_reason": "stop"}.get(f.name, "x")
                cols[f.name] = pa.array([value] * n, f.type)
            elif pa.types.is_boolean(f.type):
                cols[f.name] = pa.array([False] * n, f.type)
            elif pa.types.is_floating(f.type):
                cols[f.name] = pa.array([0.5] * n, f.type)
            elif f.name == "attempt":
                cols[f.name] = pa.array([0] * n, f.type)
            else:
                cols[f.name] = pa.array([256] * n, f.type)
        stem = f"bench-{p:05d}"
        data = part_bytes(pa.table(cols, schema=SCHEMA), n)
        rd.write_bytes_atomic(layout.part_path(stem), data)
        counts = SourceCounts(done=1, rows=1, prompt_tokens=256, completion_tokens=256)
        rec = make_record(stem, data, {sid: ("sharegpt", counts) for sid in chunk}, n)
        layout.part_record_file(stem).write(rd, rec)


def write_first_session_plan(m, manifest: Path, run: Path) -> float:
    """What the first session of the run left in ``run``: its plan index (plan/) and the
    record of the configuration checks it passed (checks.json, written by a subprocess: this
    process must not import what those checks import); seconds."""
    t = time.perf_counter()
    plan = plan_session(source_set(m), set(), {}, rd=RunDir.open(str(run)))
    plan.spill.close()
    code = (
        "import sys\n"
        "from regen.engine.failfast import preflight\n"
        "from regen.manifest import load_manifest\n"
        "from regen.store import RunDir, layout\n"
        "checked = preflight(load_manifest(sys.argv[1], sys.argv[3:]))\n"
        "layout.CHECKS_FILE.write(RunDir.open(sys.argv[2]), checked)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(manifest), str(run), *NO_NEAR_DUP],
                   check=True)  # fmt: skip
    return time.perf_counter() - t


def first_request_after(m, run: Path, url: str, sim, address: str | None) -> float:
    stop = threading.Event()
    t0 = time.monotonic()
    got: list[float] = []
    log.info("run_job starts (%s)", run.name)

    def watch() -> None:
        while not stop.is_set():
            if sim.stats()["received"] > 0:
                got.append(time.monotonic() - t0)
                log.info("the server received the first request")
                stop.set()
                return
            time.sleep(0.02)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    run_job(
        m,
        RunDir.open(run, create=False),
        RunOptions(endpoints=[url], address=address, stop=stop, handle_signals=False),
    )
    stop.set()
    w.join(timeout=5)
    sim.reset_stats()
    return got[0] if got else float("nan")


def ray_head(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.conftest import free_port, isolated_ray_env

    port = free_port()
    env = isolated_ray_env(tmp / "home")
    os.environ.update({k: env[k] for k in ("RAY_AUTH_MODE",)})
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
         f"--port={port}", "--node-ip-address=127.0.0.1", "--include-dashboard=false",
         f"--temp-dir={tmp / 'ray'}", "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    import ray

    deadline = time.monotonic() + 60
    while True:
        try:
            ray.init(address=f"127.0.0.1:{port}", logging_level="WARNING")
            ray.shutdown()
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    return proc, f"127.0.0.1:{port}"


def resume(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="regen-bench-resume-"))
    manifest = write_workload(work, 10)
    t = time.perf_counter()
    write_rows(work / "sharegpt.jsonl", args.samples)
    size = (work / "sharegpt.jsonl").stat().st_size
    print(f"source: {args.samples} rows, {size / 1e6:.0f} MB, written in "
          f"{time.perf_counter() - t:.0f} s", flush=True)  # fmt: skip
    m = load_manifest(manifest, NO_NEAR_DUP)
    t, c = time.perf_counter(), proc_cpu_s()
    ids = [s.id for s in read_samples(source_set(m))]
    read_s, read_cpu = time.perf_counter() - t, proc_cpu_s() - c
    print(f"{len(ids)} samples ({read_s:.1f} s, {read_cpu:.1f} CPU-s to read the source once); "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    first = work / "run-head"
    built = write_first_session_plan(m, manifest, first)
    print(f"first session's plan with its index, and its checks: {built:.1f} s", flush=True)
    with running_simulator(model_name=MODEL, instant=True, mean_tokens=16) as sim:
        proc, address = ray_head(work)
        try:
            for label, addr in (("Ray head already running", address),
                                ("local Ray started by regen", None)):  # fmt: skip
                run = work / f"run-{'head' if addr else 'local'}"
                if run != first:
                    shutil.copytree(first / layout.PLAN_DIR, run / layout.PLAN_DIR)
                    shutil.copy(first / layout.CHECKS, run / layout.CHECKS)
                write_done_parts(run, ids[::2], args.part_rows)
                c = proc_cpu_s()
                s = first_request_after(m, run, sim.url, sim, addr)
                cpu = proc_cpu_s() - c
                print(f"resume, {len(ids) // 2} of {len(ids)} done ({label}): {s:.2f} s to the "
                      f"first new request = {s / read_s:.3f} x the source read "
                      f"(session CPU {cpu:.1f} s, load average {os.getloadavg()[0]:.1f})",
                      flush=True)  # fmt: skip
        finally:
            stop_group(proc, 20)
    shutil.rmtree(work, ignore_errors=True)


def vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def actor_pids(run: Path) -> list[int]:
    """Processes of this run's actors (named ``regen-SESSION-w...``; the session is in the
    run's lock file)."""
    try:
        session = json.loads((run / "lock.json").read_text())["session"]
    except (OSError, ValueError, KeyError):
        return []
    hint = f"ray::regen-{session}-"
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if cmd.startswith(hint):
                out.append(int(p.name))
    return out


def memory(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="regen-bench-memory-"))
    manifest = write_workload(work, 10)
    t = time.perf_counter()
    write_rows(work / "sharegpt.jsonl", args.samples)
    size = (work / "sharegpt.jsonl").stat().st_size
    print(f"{args.samples} samples, source {size / 1e6:.0f} MB written in "
          f"{time.perf_counter() - t:.0f} s; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    m = load_manifest(manifest, NO_NEAR_DUP)
    peaks: dict[int, float] = {}
    stop = threading.Event()
    t0 = time.monotonic()
    first: list[float] = []

    with running_simulator(model_name=MODEL, instant=True, mean_tokens=64) as sim:

        def watch() -> None:
            while not stop.is_set():
                if not first and sim.stats()["received"] > 0:
                    first.append(time.monotonic() - t0)
                for pid in actor_pids(work / "run"):
                    with contextlib.suppress(OSError):
                        peaks[pid] = max(peaks.get(pid, 0.0), vm_hwm_mb(pid))
                if first and time.monotonic() - t0 > first[0] + args.seconds:
                    stop.set()
                time.sleep(0.5)

        w = threading.Thread(target=watch, daemon=True)
        w.start()
        summary = run_job(
            m,
            RunDir.open(work / "run", create=False),
            RunOptions(endpoints=[sim.url], stop=stop, handle_signals=False),
        )
        stop.set()
        w.join(timeout=5)
    driver = vm_hwm_mb(os.getpid())
    print(f"planned {summary.total} samples; first request after {first[0] if first else 0:.1f} s; "
          f"{summary.completed_now} completed in {args.seconds:.0f} s")  # fmt: skip
    print(
        f"peak RSS: driver {driver:.0f} MB; actors "
        + ", ".join(f"{v:.0f} MB" for v in sorted(peaks.values(), reverse=True))
    )


def thread_cpu() -> dict[int, tuple[str, float]]:
    """{tid: (name, CPU-s)} of this process's live threads (/proc/self/task): Python threads
    by their Python name, the others (Ray's C++ threads) as ``native:`` + their name."""
    out: dict[int, tuple[str, float]] = {}
    py = {t.native_id: t.name for t in threading.enumerate()}
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            tid = int(task.name)
            name = py.get(tid) or "native:" + (task / "comm").read_text().strip()
            out[tid] = (name, proc_cpu_s(f"self/task/{tid}"))
    return out


def descendants(prefix: str) -> list[int]:
    """Processes below this one (any depth) whose command line starts with ``prefix``."""
    parent: dict[int, int] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                parent[int(p.name)] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
    mine, out = {os.getpid()}, []
    changed = True
    while changed:
        changed = False
        for pid, pp in parent.items():
            if pp in mine and pid not in mine:
                mine.add(pid)
                changed = True
    for pid in mine - {os.getpid()}:
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            if cmd.decode(errors="replace").startswith(prefix):
                out.append(pid)
    return out


def proc_cpu_s(pid: int | str = "self") -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(slots=True)
class DriverCpu:
    """The driver's CPU over one session of the benchmark workload."""

    samples: int  #: samples completed
    requests: int  #: requests the server received
    wall_s: float  #: the session, call to return
    total_s: float  #: driver CPU over the session
    before_first_s: float  #: ... up to the first request the server received
    first_request_s: float  #: wall seconds to that request
    actors_s: float = float("nan")  #: the actors' CPU (sampled every 0.5 s until the end)
    #: CPU-s of the driver while its dispatch loop ran (JobSummary.dispatch_cpu_s)
    loop_s: float = float("nan")
    #: CPU-s of the driver's threads by name, last seen (0.5 s samples; Ray's threads too)
    threads: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def dispatch_s(self) -> float:
        """Driver CPU from the first request to the end."""
        return self.total_s - self.before_first_s

    def ms_per_sample(self, cpu_s: float) -> float:
        return 1000.0 * cpu_s / max(1, self.samples)

    def line(self) -> str:
        return (f"driver CPU over {self.samples} samples ({self.requests} requests, "
                f"{self.wall_s:.1f} s): {self.ms_per_sample(self.total_s):.2f} ms/sample "
                f"in all ({self.total_s:.2f} CPU-s), {self.ms_per_sample(self.dispatch_s):.2f} "
                f"ms/sample dispatching ({self.dispatch_s:.2f} CPU-s from the first request), "
                f"{self.before_first_s:.2f} CPU-s before it "
                f"({self.first_request_s:.1f} s); the dispatch loop "
                f"{self.ms_per_sample(self.loop_s):.2f} ms/sample ({self.loop_s:.2f} CPU-s); "
                f"actors {self.actors_s:.1f} CPU-s")  # fmt: skip


def driver_cpu(
    work: Path,
    conversations: int = 1500,
    *,
    workers: int = 2,
    address: str | None = None,
    overrides: list[str] | None = None,
    sim: dict[str, object] | None = None,
) -> DriverCpu:
    """One ``run_job`` session of the benchmark workload (``conversations`` rows in ``work``)
    against a fresh simulator; the driver's (this process's) CPU from /proc."""
    m = load_manifest(write_workload(work, conversations), overrides or [])
    run = work / f"run-{time.monotonic_ns()}"
    with running_simulator(model_name=MODEL, **(sim or BENCH_SIM)) as server:
        stop = threading.Event()
        mark: list[tuple[float, float]] = []
        actors: dict[int, float] = {}
        seen: dict[int, tuple[str, float]] = {}  # tid -> (name, CPU-s), last seen
        own: list[float] = [0.0, 0.0]  # this thread's CPU-s: at the first request, at the end
        t0, c0 = time.monotonic(), proc_cpu_s()

        def watch() -> None:
            """Polls /stats until the first request, then the actors' and the driver's
            threads' CPU every 0.5 s (its own CPU is taken out of the driver's)."""
            me = f"self/task/{threading.get_native_id()}"
            while not stop.is_set() and server.stats()["received"] == 0:
                stop.wait(0.05)
            if not stop.is_set():
                own[0] = proc_cpu_s(me)
                mark.append((time.monotonic() - t0, proc_cpu_s() - c0 - own[0]))
            pids: list[int] = []
            n = 0
            while not stop.wait(0.5):
                if n % 10 == 0:
                    pids = descendants("ray::WorkerActor")
                n += 1
                for pid in pids:
                    with contextlib.suppress(OSError, ValueError, IndexError):
                        actors[pid] = proc_cpu_s(pid)
                seen.update(thread_cpu())
            own[1] = proc_cpu_s(me)

        w = threading.Thread(target=watch, name="bench-watch", daemon=True)
        w.start()
        opts = RunOptions(endpoints=[server.url], workers=workers, address=address,
                          handle_signals=False)  # fmt: skip
        summary = run_job(m, RunDir.open(run, create=False), opts)
        total, wall = proc_cpu_s() - c0, time.monotonic() - t0
        stop.set()
        w.join(timeout=5)
        requests = int(server.stats()["received"])
    assert summary.state == "finished", summary
    first = mark[0] if mark else (float("nan"), float("nan"))
    by_name: dict[str, float] = {}
    for name, cpu in seen.values():
        if name != "bench-watch":
            by_name[name] = by_name.get(name, 0.0) + cpu
    return DriverCpu(summary.completed_now, requests, wall, total - own[1], first[1], first[0],
                     sum(actors.values()), summary.dispatch_cpu_s,
                     dict(sorted(by_name.items(), key=lambda kv: -kv[1])))  # fmt: skip


def driver_cpu_main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="regen-bench-driver-cpu-"))
    print(f"load average {os.getloadavg()[0]:.1f}; work dir {work}", flush=True)
    try:
        got = driver_cpu(work, args.conversations, workers=args.workers)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(got.line())
    print("driver threads, CPU-s (last seen): " + ", ".join(
        f"{k} {v:.2f}" for k, v in got.threads.items() if v >= 0.01))  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("resume")
    r.add_argument("--samples", type=int, default=83_288)
    r.add_argument("--part-rows", type=int, default=256)
    mm = sub.add_parser("memory")
    mm.add_argument("--samples", type=int, default=1_400_000)
    mm.add_argument("--seconds", type=float, default=10.0)
    dc = sub.add_parser("driver-cpu")
    dc.add_argument("--conversations", type=int, default=1500)
    dc.add_argument("--workers", type=int, default=2)
    p.add_argument("--log", action="store_true", help="show regen's INFO log with times")
    args = p.parse_args()
    if args.log:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    {"resume": resume, "memory": memory, "driver-cpu": driver_cpu_main}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
