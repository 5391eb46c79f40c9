"""Benchmarks: time from start to the first new request on a half-done run directory, and peak
memory of the driver and actors on a Perfect-Blend-scale manifest (issue 8).

``resume``: a synthetic ShareGPT-style source of ``--samples`` rows (default 83,288) and a run
directory whose parts already hold half of them (``--part-rows`` rows per part, full row
schema; ``input_ids`` short, since resume reads only the id and counter columns). Then
``run_job`` starts against an instant ``regen simulate`` and the time from the call to the
first request the server receives is printed, once with a Ray head already running (a
cluster: ``ray job submit``) and once with regen starting a local Ray itself (``regen run`` on
one machine). The session is stopped right after. Target: <= 10 s.

``memory``: a synthetic source of ``--samples`` rows (default 1,400,000; ~600 characters a
conversation, 30% multi-turn), ``run_job`` against an instant simulator for ``--seconds``,
then the peak RSS (VmHWM) of the driver process and of each actor process. Target: <= 1.5 GB.

Run: ``.venv/bin/python benchmarks/resume_memory.py resume`` (~1 min) and
``.venv/bin/python benchmarks/resume_memory.py memory`` (~3 min; ``--samples`` to scale).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import MODEL, make_rows, write_workload

from regen.engine import RunOptions, run_job
from regen.manifest import load_manifest
from regen.procs import stop_group
from regen.rows import SCHEMA
from regen.simulate.testing import running_simulator
from regen.sources import read_samples

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
    """Parts holding one row per id, every column of the schema filled."""
    (run / "parts").mkdir(parents=True, exist_ok=True)
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
            elif pa.types.is_list(f.type):
                cols[f.name] = pa.array([[1] * 64] * n, f.type)
            elif pa.types.is_string(f.type):
                value = {"created_at": now, "finish_reason": "stop"}.get(f.name, "x")
                cols[f.name] = pa.array([value] * n, f.type)
            elif pa.types.is_boolean(f.type):
                cols[f.name] = pa.array([False] * n, f.type)
            elif pa.types.is_floating(f.type):
                cols[f.name] = pa.array([0.5] * n, f.type)
            else:
                cols[f.name] = pa.array([256] * n, f.type)
        pq.write_table(pa.table(cols, schema=SCHEMA), run / "parts" / f"bench-{p:05d}.parquet",
                       compression="zstd")  # fmt: skip


def first_request_after(m, run: Path, url: str, sim, address: str | None) -> float:
    stop = threading.Event()
    t0 = time.monotonic()
    got: list[float] = []

    def watch() -> None:
        while not stop.is_set():
            if sim.stats()["received"] > 0:
                got.append(time.monotonic() - t0)
                stop.set()
                return
            time.sleep(0.02)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    run_job(m, str(run), RunOptions(endpoints=[url], address=address, stop=stop,
                                    handle_signals=False))  # fmt: skip
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
    write_rows(work / "sharegpt.jsonl", args.samples)
    m = load_manifest(manifest, NO_NEAR_DUP)
    t = time.perf_counter()
    ids = [s.id for s in read_samples(m)]
    read_s = time.perf_counter() - t
    print(f"{len(ids)} samples ({read_s:.1f} s to read the source once); "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    with running_simulator(model_name=MODEL, instant=True, mean_tokens=16) as sim:
        proc, address = ray_head(work)
        try:
            for label, addr in (("Ray head already running", address),
                                ("local Ray started by regen", None)):  # fmt: skip
                run = work / f"run-{'head' if addr else 'local'}"
                write_done_parts(run, ids[::2], args.part_rows)
                s = first_request_after(m, run, sim.url, sim, addr)
                print(f"resume, {len(ids) // 2} of {len(ids)} done ({label}): "
                      f"{s:.2f} s to the first new request", flush=True)  # fmt: skip
        finally:
            stop_group(proc, 20)


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
        summary = run_job(m, str(work / "run"), RunOptions(endpoints=[sim.url], stop=stop,
                                                           handle_signals=False))  # fmt: skip
        stop.set()
        w.join(timeout=5)
    driver = vm_hwm_mb(os.getpid())
    print(f"planned {summary.total} samples; first request after {first[0] if first else 0:.1f} s; "
          f"{summary.completed_now} completed in {args.seconds:.0f} s")  # fmt: skip
    print(
        f"peak RSS: driver {driver:.0f} MB; actors "
        + ", ".join(f"{v:.0f} MB" for v in sorted(peaks.values(), reverse=True))
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("resume")
    r.add_argument("--samples", type=int, default=83_288)
    r.add_argument("--part-rows", type=int, default=256)
    mm = sub.add_parser("memory")
    mm.add_argument("--samples", type=int, default=1_400_000)
    mm.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--log", action="store_true", help="show regen's INFO log with times")
    args = p.parse_args()
    if args.log:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    (resume if args.cmd == "resume" else memory)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
