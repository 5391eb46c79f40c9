"""Benchmark: CPU of the whole client process tree per 1,000 requests, rows built, regen vs a
bare asyncio worker pool doing the same requests in the same run (issue 16).

Workload and server as ``benchmarks/utilization.py``: the 1,500 ShareGPT-style conversations of
``benchmarks/_workload.py`` (~2,150 requests) against one fresh ``regen simulate`` per contender
(64 slots, 3.2 ms steps, 1 token per slot per step: 20,000 tok/s), with the demo's tiny Kimi
tokenizer so the server returns real ids. For each ``sampling.token_ids`` mode asked
(``--modes``; default ``local`` then ``stream``) two contenders run, each in a child process of
its own:

- ``regen``: ``regen.engine.run_job`` (the driver in the child, the local Ray it starts, the
  ``--workers`` actors building every row: local render, or the server's ids);
- ``pool``: the bare asyncio worker pool the ratio is taken against (``utilization.pool``, as
  in issue 16): 64 asyncio workers, each taking the next conversation and running its turns
  through regen's own ``ChatClient`` (the same transport and SSE parsing as regen's actors);
  no Ray, no driver, no router, no rows;
- ``worker``: regen's per-actor path in one plain process: one ``SampleWorker`` (router,
  adaptive limits, retries, rows built) fed by 64 lanes; no Ray, no driver (where regen's cost
  over the pool goes: the worker and its rows, or Ray and the driver);
- ``plain``: the same without regen's client: the same request bodies and turns
  (``regen.engine.turns.regenerate``), read by a plain aiohttp loop with one ``json.loads`` per
  ``data:`` line (what a script of one's own would do);
- ``base`` (with ``--base-python PY --base-tree DIR``): regen as ``regen``, another version of
  it (before and after in one run), run in DIR (Ray's workers import from the driver's working
  directory) by an interpreter that imports ``regen`` from DIR. An editable install's import
  hook outranks ``PYTHONPATH``, so make a venv without it: ``python3 -m venv --without-pip B``
  and a ``B/lib/python3.11/site-packages/base.pth`` listing DIR (an export of the other
  version: ``git archive main regen | tar -x -C DIR``) and then ``.venv``'s site-packages.

The CPU is that of the child and every process under it (``benchmarks/_proctree.py``: driver,
actors, Ray's own processes), from ``/proc``, sampled every 0.1 s; the simulator's is not
counted. Printed per contender: CPU seconds by group over the requests' window (first request
received → last finished, from the server's request log) and over the child's whole life (its
imports, Ray's start and the actors' start-up included), per 1,000 requests; then the ratio
regen ÷ pool and regen ÷ plain per mode. ``--profile DIR`` also attaches
``py-spy record --nonblocking`` to each actor and prints where its samples go.

Run: ``.venv/bin/python benchmarks/cpu.py`` (~3 minutes on 2 cores) or ``--conversations 500``.
Timings on a shared machine are noisy; the ratio is measured within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _proctree import TreeSampler, become_subreaper
from _workload import TOKENIZER, Measured, fleet, write_workload

SLOTS = 64
CONTENDERS = ("regen", "base", "worker", "pool", "plain")
HERE = Path(__file__).resolve()
PY_SPY = str(Path(sys.executable).parent / "py-spy")


# -- the child: one contender --------------------------------------------------------------
def child(args: argparse.Namespace) -> int:
    become_subreaper()
    from regen.manifest import load_manifest

    m = load_manifest(args.manifest)
    m = m.model_copy(update={"sampling": m.sampling.model_copy(update={"token_ids": args.mode})})
    if args.contender in ("regen", "base"):
        from regen.engine import RunOptions, run_job
        from regen.store import RunDir

        opts = RunOptions(endpoints=[args.url], workers=args.workers, handle_signals=False)
        summary = run_job(m, RunDir.open(args.out, create=False), opts)
        print(json.dumps({"state": summary.state, "done": summary.done}), flush=True)
        return 0 if summary.state == "finished" else 1
    from regen.sources import read_samples

    samples = list(read_samples(m))
    if args.contender == "plain":
        asyncio.run(plain_pool(m, args.url, samples))
    elif args.contender == "worker":
        asyncio.run(one_worker(m, args.url, samples))
    else:
        from utilization import pool

        asyncio.run(pool(m, [args.url], samples))
    print(json.dumps({"state": "finished", "done": len(samples)}), flush=True)
    return 0


async def one_worker(m: Any, url: str, samples: list[Any]) -> None:
    """regen's per-actor path without Ray or a driver: one ``SampleWorker`` (router, adaptive
    limits, retries, rows built off the loop) on this process's event loop, fed by 64 lanes."""
    from regen.engine.worker import SampleWorker
    from regen.manifest import Endpoint

    worker = SampleWorker(m, [Endpoint(url=url)], SLOTS)
    it = iter(samples)

    async def lane() -> None:
        for s in it:
            out = await worker.process(s)
            assert out.status == "done", out

    await asyncio.gather(*(lane() for _ in range(SLOTS)))
    await worker.aclose()


async def plain_pool(m: Any, url: str, samples: list[Any]) -> None:
    """64 asyncio workers with a plain aiohttp stream reader and one ``json.loads`` per line:
    the same request bodies (``ChatClient.request_body``) and turns (``regenerate``) as regen,
    without regen's transport, retries, router or rows."""
    import aiohttp

    from regen.client import ChatClient
    from regen.engine.turns import regenerate
    from regen.manifest import Endpoint
    from regen.result import TurnResult

    bodies = ChatClient.from_manifest(m, Endpoint(url=url))
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def complete(messages: list[dict[str, Any]], tools: Any) -> TurnResult:
        body = json.dumps(bodies.request_body(messages, tools)).encode()
        content, reasoning, finish, ids, out_ids, usage = [], [], None, None, None, {}
        async with session.post(f"{url}/chat/completions", data=body,
                                headers={"Content-Type": "application/json"}) as resp:  # fmt: skip
            buf = b""
            async for piece in resp.content.iter_any():
                *lines, buf = (buf + piece).split(b"\n")
                for line in lines:
                    if not line.startswith(b"data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    usage = chunk.get("usage") or usage
                    ext = chunk.get("sglext") or {}
                    ids = ext.get("input_ids", ids)
                    out_ids = (ext.get("output_ids") or [out_ids])[0]
                    for c in chunk.get("choices") or ():
                        d = c.get("delta") or {}
                        if d.get("content"):
                            content.append(d["content"])
                        if d.get("reasoning_content"):
                            reasoning.append(d["reasoning_content"])
                        finish = c.get("finish_reason") or finish
        return TurnResult("".join(content), "".join(reasoning) or None, (), finish or "stop",
                          m.target.model, url, usage.get("prompt_tokens"),
                          usage.get("completion_tokens"), prompt_token_ids=ids,
                          output_token_ids=out_ids)  # fmt: skip

    it = iter(samples)

    async def worker() -> None:
        for s in it:
            await regenerate(s, complete)

    await asyncio.gather(*(worker() for _ in range(SLOTS)))
    await session.close()


# -- the parent: fleet, child, sampler -----------------------------------------------------
def run_contender(
    contender: str, mode: str, args: argparse.Namespace, manifest: Path, work: Path, rnd: int = 0
) -> tuple[Measured, TreeSampler, dict[str, Any]]:
    sim = {"max_running_requests": SLOTS, "step_ms": args.step_ms, "tokens_per_step": 1,
           "prompt_share": args.length_corr, "tokenizer": str(TOKENIZER)}  # fmt: skip
    out = work / f"run-{contender}-{mode}-{rnd}"
    with fleet(1, work, **sim) as f:
        f.start(args.conversations)
        argv = [sys.executable, str(HERE), "child", "--contender", contender, "--mode", mode,
                "--manifest", str(manifest), "--url", f.urls[0], "--out", str(out),
                "--workers", str(args.workers)]  # fmt: skip
        cwd = None
        if contender == "base":  # another interpreter, in the other tree (Ray's workers
            argv[0], cwd = str(args.base_python), args.base_tree  # import from the cwd)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True, cwd=cwd)
        sampler = TreeSampler(proc.pid, args.interval).start()
        spies = Spies(args.profile, f"{contender}-{mode}-{rnd}") if args.profile else None
        if spies is not None:
            spies.follow(sampler, proc)
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped yet
        sampler.stop()
        stdout = proc.communicate()[0].decode()
        measured = f.stop()
    if proc.returncode != 0:
        raise SystemExit(f"{contender} ({mode}) failed with {proc.returncode}: {stdout}")
    info = json.loads(stdout.strip().splitlines()[-1])
    if contender in ("regen", "base"):
        info["rows"] = row_kinds(out)
    if spies is not None:
        info["profile"] = spies.finish()
    return measured, sampler, info


def row_kinds(run_dir: Path) -> dict[str, int]:
    import pyarrow.parquet as pq

    kinds: collections.Counter[str] = collections.Counter()
    for part in sorted((run_dir / "parts").glob("*.parquet")):
        t = pq.read_table(part, columns=["token_source", "token_check"]).to_pylist()
        kinds.update(f"{r['token_source']}/{r['token_check']}" for r in t)
    return dict(kinds)


class Spies:
    """``py-spy record --nonblocking`` on each actor of a run, raw (collapsed) stacks."""

    def __init__(self, folder: Path, tag: str) -> None:
        self.folder, self.tag = folder, tag
        folder.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.files: list[Path] = []

    def follow(self, sampler: TreeSampler, proc: subprocess.Popen[bytes]) -> None:
        import threading
        import time

        def watch() -> None:
            seen: set[int] = set()
            while proc.poll() is None:
                for p in list(sampler.procs.values()):
                    if p.cmdline.startswith("ray::WorkerActor") and p.pid not in seen:
                        seen.add(p.pid)
                        out = self.folder / f"{self.tag}-actor{p.pid}.txt"
                        self.files.append(out)
                        argv = [PY_SPY, "record", "--nonblocking", "--format", "raw", "-r", "100",
                                "-p", str(p.pid), "-o", str(out)]  # fmt: skip
                        self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                                           stderr=subprocess.DEVNULL))  # fmt: skip
                time.sleep(0.2)

        threading.Thread(target=watch, daemon=True).start()

    def finish(self) -> dict[str, Any]:
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        return summarize([f for f in self.files if f.exists()])


#: inclusive shares printed (of the samples not idle): label -> a function name as py-spy
#: writes it, or a [path part] for every frame in such files
WATCH = {
    "rows (build_rows)": "build_rows",
    "  chat template (render_prompt)": "Renderer.render_prompt",
    "  encode (TokenCodec.encode_many)": "TokenCodec.encode_many",
    "  decode (TokenCodec.decode_many)": "TokenCodec.decode_many",
    "  quality checks (check_turn)": "check_turn",
    "SSE lines (feed_bytes)": "StreamAccumulator.feed_bytes",
    "HTTP (ChatTransport.stream)": "ChatTransport.stream",
    "aiohttp": "[aiohttp]",
    "asyncio": "[asyncio]",
}
#: leaf frames of a thread that waits (py-spy --nonblocking counts some of them as active)
IDLE = {"Worker.main_loop", "_worker", "EpollSelector.select", "Condition.wait", "Event.wait", ""}


def summarize(files: list[Path]) -> dict[str, Any]:
    total = 0
    incl: collections.Counter[str] = collections.Counter()
    self_: collections.Counter[str] = collections.Counter()
    frame_re = re.compile(r"^(.*?) \((.*?)(?::\d+)?\)$")
    groups = [w[1:-1] for w in WATCH.values() if w.startswith("[")]
    for f in files:
        for line in f.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not count.isdigit():
                continue
            frames = stack.split(";")
            parsed = [(m.group(1), m.group(2)) if (m := frame_re.match(fr)) else (fr, "")
                      for fr in frames]  # fmt: skip
            if parsed[-1][0] in IDLE:
                continue
            n = int(count)
            total += n
            names = {name for name, _ in parsed}
            names.update(f"[{g}]" for g in groups if any(g in path for _, path in parsed))
            incl.update(dict.fromkeys(names, n))
            self_[frames[-1]] += n
    return {
        "samples": total,
        "inclusive": {label: incl[name] / total for label, name in WATCH.items()} if total else {},
        "self_top": [(fr, n / total) for fr, n in self_.most_common(15)] if total else [],
    }


def report(contender: str, mode: str, r: Measured, s: TreeSampler, info: dict[str, Any]) -> float:
    win = s.between(r.first_at, r.last_at)
    tot = s.total()
    n = r.requests
    w = sum(win.values())
    label = "driver" if contender in ("regen", "base") else contender
    print(f"{contender:<5} {mode:<6} {n} requests  wall {r.wall_s:5.1f}s  "
          f"e2e {r.utilization:5.3f}  window CPU-s: {label} {win['root']:5.2f} "
          f"actors {win['actors']:5.2f} ray {win['ray']:5.2f} = {w:5.2f} "
          f"({1000 * w / n:5.2f} per 1,000 requests); whole child {sum(tot.values()):5.2f} "
          f"({label} {tot['root']:.2f}, actors {tot['actors']:.2f}, ray {tot['ray']:.2f}; "
          f"{s.count('actors')} actors, {s.count('ray')} Ray processes)", flush=True)  # fmt: skip
    if "rows" in info:
        print(f"      rows {info['rows']}")
        threads = s.actor_threads()
        if threads:
            print("      actor threads (CPU-s, whole run): " + ", ".join(
                f"{k} {v:.2f}" for k, v in list(threads.items())[:8]))  # fmt: skip
    prof = info.get("profile")
    if prof and prof["samples"]:
        print(f"      actor profile ({prof['samples']} busy samples): " + ", ".join(
            f"{k.strip()} {v:.0%}" for k, v in prof["inclusive"].items()))  # fmt: skip
        for fr, share in prof["self_top"]:
            print(f"        self {share:5.1%}  {fr}")
    return w


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd")
    c = sub.add_parser("child")
    c.add_argument("--contender", choices=CONTENDERS, required=True)
    c.add_argument("--mode", required=True)
    c.add_argument("--manifest", required=True)
    c.add_argument("--url", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--workers", type=int, default=2)
    p.add_argument("--conversations", type=int, default=1500)
    p.add_argument("--modes", nargs="*", default=["local", "stream"])
    p.add_argument("--only", nargs="*", default=["regen", "worker", "pool"], choices=CONTENDERS)
    p.add_argument("--base-python", type=Path, help="contender 'base': its interpreter")
    p.add_argument("--base-tree", type=Path, help="contender 'base': its source tree")
    p.add_argument("--workers", type=int, default=2, help="regen's Ray actors")
    p.add_argument("--step-ms", type=float, default=3.2)
    p.add_argument("--length-corr", type=float, default=0.0)
    p.add_argument("--repeat", type=int, default=1, help="rounds (contenders interleaved)")
    p.add_argument("--interval", type=float, default=0.1, help="seconds between /proc samples")
    p.add_argument("--profile", type=Path, help="py-spy the actors; raw stacks into this folder")
    args = p.parse_args()
    if args.cmd == "child":
        return child(args)
    work = Path(tempfile.mkdtemp(prefix="regen-bench-cpu-"))
    manifest = write_workload(work, args.conversations, length_corr=args.length_corr)
    print(f"{args.conversations} conversations, {args.workers} actors, pool of {SLOTS}; "
          f"load average {os.getloadavg()[0]:.1f}; work dir {work}", flush=True)  # fmt: skip
    for mode in args.modes:
        cpu: dict[str, list[float]] = collections.defaultdict(list)
        whole: dict[str, list[float]] = collections.defaultdict(list)
        for rnd in range(args.repeat):
            for contender in args.only:
                r, s, info = run_contender(contender, mode, args, manifest, work, rnd)
                cpu[contender].append(1000 * sum(s.between(r.first_at, r.last_at).values())
                                      / r.requests)  # fmt: skip
                whole[contender].append(1000 * sum(s.total().values()) / r.requests)
                report(contender, mode, r, s, info)
        med = {c: statistics.median(v) for c, v in cpu.items()}
        med_whole = {c: statistics.median(v) for c, v in whole.items()}
        if args.repeat > 1:
            print(f"medians of {args.repeat} rounds ({mode}), CPU-s per 1,000 requests: "
                  + ", ".join(f"{c} {v:.2f} (whole child {med_whole[c]:.2f})"
                              for c, v in med.items()))  # fmt: skip
        pairs = [(a, b) for a in ("regen", "base", "worker") for b in ("pool", "plain")]
        for a, b in [*pairs, ("regen", "base")]:
            if a in med and b in med:
                print(f"ratio ({mode}): {a} / {b} = {med[a] / med[b]:.2f}x CPU per request "
                      f"(window), {med_whole[a] / med_whole[b]:.2f}x whole child",
                      flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
