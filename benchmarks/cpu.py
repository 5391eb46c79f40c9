"""Benchmark: CPU of the whole client process tree per 1,000 requests, rows built, regen vs
asyncio worker pools doing the same requests in the same run: one through regen's own client
(issue 16) and one through the official ``openai`` client (what a user would write).

Workload and server as ``benchmarks/utilization.py``: the 1,500 ShareGPT-style conversations of
``benchmarks/_workload.py`` (~2,150 requests) against one fresh ``regen simulate`` per contender
(64 slots, 3.2 ms steps, 1 token per slot per step: 20,000 tok/s), with the demo's tiny Kimi
tokenizer so the server returns real ids. For each ``sampling.token_ids`` mode asked
(``--modes``; default ``local`` then ``stream``) the contenders of ``--only`` (default
``regen worker pool openai``) run, each in a child process of its own:

- ``regen``: ``regen.engine.run_job`` (the driver in the child, the local Ray it starts, the
  ``--workers`` actors building every row: local render, or the server's ids);
- ``pool``: the bare asyncio worker pool of issue 16 (``utilization.pool``): 64 asyncio
  workers, each taking the next conversation and running its turns through regen's own
  ``ChatClient`` (the same transport and SSE parsing as regen's actors); no Ray, no driver, no
  router, no rows;
- ``openai``: the same pool written with the official SDK (:func:`openai_pool`): one
  ``openai.AsyncOpenAI(base_url=..., api_key=...)`` (its httpx2 transport, SDK defaults), 64
  asyncio tasks, each ``await client.chat.completions.create(..., stream=True,
  stream_options={"include_usage": True})`` and iterating the chunks (content,
  reasoning_content, tool calls, finish reason, usage, and SGLang's ``sglext`` ids in
  ``stream`` mode). The same request fields as regen's (:func:`body_fields`: the manifest's
  sampling, max tokens, template switch, id switches; the SDK's own keyword arguments where it
  has one, ``extra_body`` for the rest) and the same turns (``regen.engine.turns.regenerate``
  builds each turn's messages: pure Python). :func:`openai_pool_cpu` runs it alone, for other
  benchmarks (``from cpu import openai_pool_cpu`` with ``benchmarks/`` on ``sys.path``);
- ``worker``: regen's per-actor path in one plain process: one ``SampleWorker`` (router,
  adaptive limits, retries, rows built) fed by 64 lanes; no Ray, no driver (where regen's cost
  over the pool goes: the worker and its rows, or Ray and the driver);
- ``plain``: the same without regen's client: the same request bodies and turns
  (``regen.engine.turns.regenerate``), read by a plain aiohttp loop with one ``json.loads`` per
  ``data:`` line;
- ``base`` (with ``--base-python PY --base-tree DIR``): regen as ``regen``, another version of
  it (before and after in one run), run in DIR (Ray's workers import from the driver's working
  directory) by an interpreter that imports ``regen`` from DIR. An editable install's import
  hook outranks ``PYTHONPATH``, so make a venv without it: ``python3 -m venv --without-pip B``
  and a ``B/lib/python3.11/site-packages/base.pth`` listing DIR (an export of the other
  version: ``git archive main regen | tar -x -C DIR``) and then ``.venv``'s site-packages.

That they all sent the same requests is checked: the simulator logs a key per request body
(messages, tools, sampling, max tokens), and a line per mode says whether every contender's
keys are the same.

The CPU is that of the child and every process under it (``benchmarks/_proctree.py``: driver,
actors, Ray's own processes), from ``/proc``, sampled every 0.1 s; the simulator's is not
counted. Printed per contender: CPU seconds by group over the requests' window (first request
received → last finished, from the server's request log) and over the child's whole life (its
imports, Ray's start and the actors' start-up included), per 1,000 requests, and how busy the
machine was over the window (all its cores from ``/proc/stat``: the client tree, the
simulator, this process, and the rest: other users' work, which slows every contender down).
For ``regen`` (and ``base``) Ray's own processes (GCS, raylet, agents, idle workers) are
reported apart: their CPU before the first request (start-up, once per session), over the
window in cores (their idle cost: it grows with time, not with requests) and after the last
answer; and the driver + actors figure without them. Then per mode a side-by-side table and
the ratios: regen ÷ openai, regen ÷ pool (each over the window, without Ray's processes, and
whole child), pool ÷ openai. ``--profile DIR`` also attaches ``py-spy record --nonblocking``
to each actor and prints where its samples go.

Run: ``.venv/bin/python benchmarks/cpu.py --modes local --only regen pool openai`` (~3
minutes on 2 cores: the openai pool is the slowest, one core cannot keep its 64 streams up
with the server) or ``--conversations 500``. Timings on a shared machine are noisy; the ratios
are measured within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _proctree import TreeSampler, become_subreaper
from _workload import TOKENIZER, Measured, fleet, write_workload

SLOTS = 64
CONTENDERS = ("regen", "base", "worker", "pool", "plain", "openai")
#: the child's process groups: the driver or pool itself, its actors, Ray's own processes
GROUPS = ("root", "actors", "ray")
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
    from regen.sources import read_samples, source_set

    samples = list(read_samples(source_set(m)))
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
    from regen.client import ResolvedEndpoint
    from regen.client.profiles import SGLANG
    from regen.engine.inputs import worker_config
    from regen.engine.worker import SampleWorker

    config = worker_config(m, [ResolvedEndpoint(url=url, profile=SGLANG)])
    worker = SampleWorker(replace(config, concurrency=SLOTS))
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

    from regen.core.result import TurnResult
    from regen.engine.turns import regenerate

    bodies = sglang_client(m, url)
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


# -- the openai pool: the official SDK, what a user would write --------------------------------
#: body fields :meth:`openai.AsyncOpenAI.chat.completions.create` takes as keyword arguments;
#: the others (``chat_template_kwargs``, ``top_k``, SGLang's id switches, ...) go in extra_body
OPENAI_KWARGS = frozenset(
    {"temperature", "top_p", "max_completion_tokens", "max_tokens", "seed", "stop", "n",
     "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "logit_bias"}
)  # fmt: skip
#: a request of :func:`openai_pool_cpu`: a conversation (its assistant turns regenerated in
#: order, each request carrying the previous answers, as regen does) or one request's messages
Request = Any  # regen.core.sample.Sample | list[dict[str, Any]]


def sglang_client(m: Any, url: str) -> Any:
    """The ChatClient a run of ``m`` makes for an SGLang endpoint at ``url``."""
    from regen.client import ChatClient, ResolvedEndpoint
    from regen.client.profiles import SGLANG
    from regen.engine.inputs import worker_config

    config = worker_config(m, [ResolvedEndpoint(url=url, profile=SGLANG)])
    return ChatClient.of(config.endpoints[0], config.client)


def body_fields(m: Any, url: str) -> dict[str, Any]:
    """The sampling fields of regen's own request body for manifest ``m``
    (``ChatClient.request_body``: temperature, top_p, max_completion_tokens, seed,
    chat_template_kwargs, the server-id switches of ``sampling.token_ids``), without model,
    messages, tools and the stream switch: the ``body`` that makes :func:`openai_pool_cpu` send
    regen's requests."""
    body = sglang_client(m, url).request_body([], None)
    for key in ("model", "messages", "tools", "stream", "stream_options"):
        body.pop(key, None)
    return body


async def openai_pool(
    url: str, model: str, requests: Sequence[Request], concurrency: int, body: Mapping[str, Any]
) -> dict[str, Any]:
    """``concurrency`` asyncio tasks sharing one ``openai.AsyncOpenAI`` (SDK defaults: its
    httpx2 pool, 2 retries), each taking the next request and streaming it with
    ``chat.completions.create(..., stream=True, stream_options={"include_usage": True})``,
    iterating the chunks for content, reasoning_content, tool calls, finish reason, usage (and
    SGLang's ``sglext`` ids when ``body`` asks for them). A conversation runs its turns
    through ``regen.engine.turns.regenerate`` (pure message building) so the messages are
    regen's. Returns what it sent, with its own clock (``time.monotonic``: the same clock in
    every process of this machine) at the first request sent and the last answer read."""
    import openai

    from regen.core.result import TurnResult
    from regen.core.sample import Sample, ToolCall
    from regen.engine.turns import regenerate

    client = openai.AsyncOpenAI(base_url=url, api_key="unused")
    kwargs = {k: v for k, v in body.items() if k in OPENAI_KWARGS}
    extra = {k: v for k, v in body.items() if k not in OPENAI_KWARGS} or None
    stats: dict[str, Any] = {"requests": 0, "completion_tokens": 0, "server_ids": 0,
                             "first_sent": None, "last_done": None}  # fmt: skip

    async def complete(messages: list[dict[str, Any]], tools: Any) -> TurnResult:
        if stats["first_sent"] is None:
            stats["first_sent"] = time.monotonic()
        stats["requests"] += 1
        stream = await client.chat.completions.create(
            model=model, messages=messages, stream=True,
            stream_options={"include_usage": True}, extra_body=extra,
            **({"tools": tools} if tools else {}), **kwargs,
        )  # fmt: skip
        content: list[str] = []
        reasoning: list[str] = []
        calls: dict[int, list[str]] = {}
        finish, usage, ids, out_ids = None, None, None, None
        async for chunk in stream:
            usage = chunk.usage or usage
            ext = (chunk.model_extra or {}).get("sglext")
            if ext:
                ids = ext.get("input_ids", ids)
                out_ids = (ext.get("output_ids") or [out_ids])[0]
            for c in chunk.choices:
                d = c.delta
                if d.content:
                    content.append(d.content)
                r = getattr(d, "reasoning_content", None)
                if r:
                    reasoning.append(r)
                for tc in d.tool_calls or ():
                    call = calls.setdefault(tc.index, ["", "", ""])
                    fn = tc.function
                    call[0] = tc.id or call[0]
                    call[1] += (fn.name or "") if fn else ""
                    call[2] += (fn.arguments or "") if fn else ""
                finish = c.finish_reason or finish
        stats["last_done"] = time.monotonic()
        done = usage.completion_tokens if usage else None
        stats["completion_tokens"] += done or 0
        stats["server_ids"] += out_ids is not None
        tool_calls = tuple(ToolCall(*calls[i]) for i in sorted(calls))
        return TurnResult("".join(content), "".join(reasoning) or None, tool_calls,
                          finish or "stop", model, url, usage.prompt_tokens if usage else None,
                          done, prompt_token_ids=ids, output_token_ids=out_ids)  # fmt: skip

    it = iter(requests)

    async def task() -> None:
        for r in it:
            if isinstance(r, Sample):
                await regenerate(r, complete)
            else:
                await complete(list(r), None)

    await asyncio.gather(*(task() for _ in range(concurrency)))
    await client.close()
    return stats


def openai_child(spec_path: str) -> int:
    """The openai pool's process: the spec (a pickle written by :func:`openai_spec`), run,
    one JSON line of :func:`openai_pool`'s figures on stdout."""
    spec = pickle.loads(Path(spec_path).read_bytes())
    stats = asyncio.run(openai_pool(spec["url"], spec["model"], spec["requests"],
                                    spec["concurrency"], spec["body"]))  # fmt: skip
    stats.update(state="finished", done=len(spec["requests"]))
    print(json.dumps(stats), flush=True)
    return 0


def openai_spec(folder: Path, url: str, model: str, requests: Sequence[Request],
                concurrency: int, body: Mapping[str, Any] | None) -> list[str]:  # fmt: skip
    """Write the openai pool's spec into ``folder``; returns the argv of its process."""
    spec = folder / f"openai-spec-{os.getpid()}-{time.monotonic_ns()}.pickle"
    spec.write_bytes(pickle.dumps({
        "url": url, "model": model, "requests": list(requests), "concurrency": concurrency,
        "body": dict(body or {}),
    }))  # fmt: skip
    return [sys.executable, str(HERE), "openai-child", "--spec", str(spec)]


def openai_pool_cpu(
    url: str,
    model: str,
    requests: Sequence[Request],
    concurrency: int = SLOTS,
    *,
    body: Mapping[str, Any] | None = None,
    interval: float = 0.1,
) -> dict[str, Any]:
    """CPU of an asyncio pool of the official ``openai.AsyncOpenAI`` client doing ``requests``
    against the OpenAI-compatible server at ``url`` (its ``/v1`` base), ``concurrency`` at a
    time, in one fresh process whose tree CPU is read from ``/proc`` (``_proctree``).

    ``requests``: ``regen.core.sample.Sample`` conversations (every assistant turn regenerated in
    order, as regen's actors do) and/or message lists (one request each). ``body``: the other
    request fields (:func:`body_fields` gives regen's for a manifest); every request is
    streamed with usage. Returns plain numbers: ``requests`` (sent, turns included),
    ``conversations``, ``concurrency``, ``completion_tokens`` (usage), ``wall_s`` (first
    request sent → last answer read, the pool's clock), ``window_cpu_s`` (the process's CPU
    over that window), ``whole_cpu_s`` (over its whole life: interpreter, ``import openai``,
    connections), ``startup_cpu_s`` (before the first request), ``per_1000_window`` and
    ``per_1000_whole`` (CPU-s per 1,000 requests) and ``cores`` (window CPU ÷ wall).
    Raises RuntimeError when the pool fails (a request that fails after the SDK's retries)."""
    with tempfile.TemporaryDirectory(prefix="regen-openai-pool-") as tmp:
        argv = openai_spec(Path(tmp), url, model, requests, concurrency, body)
        rc, stdout, s = run_sampled(argv, interval)
    if rc != 0:
        raise RuntimeError(f"the openai pool failed with {rc}: {stdout[-2000:]}")
    info = json.loads(stdout.strip().splitlines()[-1])
    t0, t1, n = info["first_sent"], info["last_done"], info["requests"]
    win, whole = sum(s.between(t0, t1).values()), sum(s.total().values())
    return {
        "requests": n,
        "conversations": info["done"],
        "concurrency": concurrency,
        "completion_tokens": info["completion_tokens"],
        "server_ids": info["server_ids"],
        "wall_s": t1 - t0,
        "window_cpu_s": win,
        "whole_cpu_s": whole,
        "startup_cpu_s": sum(s.at(t0).values()),
        "per_1000_window": 1000 * win / n,
        "per_1000_whole": 1000 * whole / n,
        "cores": win / (t1 - t0) if t1 > t0 else 0.0,
    }


def run_sampled(
    argv: list[str],
    interval: float,
    *,
    cwd: str | Path | None = None,
    follow: Callable[[TreeSampler, subprocess.Popen[bytes]], None] | None = None,
    also: Mapping[str, int] | None = None,
) -> tuple[int, str, TreeSampler]:
    """Run ``argv`` in a session of its own with its tree sampled until it exits (and the
    ``also`` processes beside it: ``TreeSampler``); returns its exit status, its stdout and the
    sampler (the last sample taken while it is a zombie)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True, cwd=cwd)
    sampler = TreeSampler(proc.pid, interval, group="root", below="ray", groups=GROUPS,
                          also=also, threads=True).start()  # fmt: skip
    if follow is not None:
        follow(sampler, proc)
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped yet
    sampler.stop()
    stdout = proc.communicate()[0].decode()
    return proc.returncode, stdout, sampler


# -- the parent: fleet, child, sampler -----------------------------------------------------
def run_contender(
    contender: str, mode: str, args: argparse.Namespace, manifest: Path, work: Path, rnd: int = 0
) -> tuple[Measured, TreeSampler, dict[str, Any]]:
    sim = {"max_running_requests": SLOTS, "step_ms": args.step_ms, "tokens_per_step": 1,
           "prompt_share": args.length_corr, "tokenizer": str(TOKENIZER)}  # fmt: skip
    out = work / f"run-{contender}-{mode}-{rnd}"
    with fleet(1, work, **sim) as f:
        f.start(args.conversations)
        if contender == "openai":  # the same samples and request fields as regen's
            from regen.manifest import load_manifest
            from regen.sources import read_samples, source_set

            m = load_manifest(manifest)
            m = m.model_copy(update={"sampling": m.sampling.model_copy(update={"token_ids": mode})})
            samples = list(read_samples(source_set(m)))
            argv = openai_spec(work, f.urls[0], m.target.model, samples, SLOTS,
                               body_fields(m, f.urls[0]))  # fmt: skip
        else:
            argv = [sys.executable, str(HERE), "child", "--contender", contender, "--mode", mode,
                    "--manifest", str(manifest), "--url", f.urls[0], "--out", str(out),
                    "--workers", str(args.workers)]  # fmt: skip
        cwd = None
        if contender == "base":  # another interpreter, in the other tree (Ray's workers
            argv[0], cwd = str(args.base_python), args.base_tree  # import from the cwd)
        spies = Spies(args.profile, f"{contender}-{mode}-{rnd}") if args.profile else None
        also = {"bench": os.getpid()}  # this process: the sampler, the fleet's poller
        if f.sims[0].process is not None:
            also["server"] = f.sims[0].process.pid
        rc, stdout, sampler = run_sampled(argv, args.interval, cwd=cwd, also=also,
                                          follow=spies.follow if spies else None)  # fmt: skip
        measured = f.stop()
        keys = sorted(json.loads(line)["key"] for line in f.logs[0].read_text().splitlines())
    if rc != 0:
        raise SystemExit(f"{contender} ({mode}) failed with {rc}: {stdout}")
    info = json.loads(stdout.strip().splitlines()[-1])
    info["requests_key"] = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]
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
                for p in sampler.of_group("actors"):
                    if p.pid not in seen:
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


def figures(r: Measured, s: TreeSampler) -> dict[str, float]:
    """One run's figures: CPU-s per 1,000 requests over the requests' window (``window``: the
    whole tree; ``no_ray``: the root and the actors, Ray's own processes left out) and over the
    child's life (``whole``); Ray's own processes apart, in CPU-s: before the first request
    (``ray_startup_s``: once per session), over the window (``ray_window_s``; ``ray_cores``:
    its idle cost, per second not per request) and after the last answer (``ray_after_s``)."""
    n = r.requests
    win, before, last, tot = (s.between(r.first_at, r.last_at), s.at(r.first_at),
                              s.at(r.last_at), s.total())  # fmt: skip
    return {
        "window": 1000 * sum(win.values()) / n,
        "no_ray": 1000 * (win["root"] + win["actors"]) / n,
        "whole": 1000 * sum(tot.values()) / n,
        "startup_s": sum(before.values()),
        "ray_startup_s": before["ray"],
        "ray_window_s": win["ray"],
        "ray_cores": win["ray"] / r.wall_s if r.wall_s else 0.0,
        "ray_after_s": tot["ray"] - last["ray"],
        "after_s": sum(tot.values()) - sum(last.values()),
        "wall_s": r.wall_s,
        "utilization": r.utilization,
    }


def _groups(d: dict[str, float], label: str) -> str:
    return f"{label} {d['root']:.2f}, actors {d['actors']:.2f}, ray {d['ray']:.2f}"


def report(
    contender: str, mode: str, r: Measured, s: TreeSampler, info: dict[str, Any]
) -> dict[str, float]:
    win = s.between(r.first_at, r.last_at)
    tot = s.total()
    n = r.requests
    w = sum(win.values())
    label = "driver" if contender in ("regen", "base") else contender
    print(f"{contender:<6} {mode:<6} {n} requests  wall {r.wall_s:5.1f}s  "
          f"e2e {r.utilization:5.3f}  window CPU-s: {label} {win['root']:5.2f} "
          f"actors {win['actors']:5.2f} ray {win['ray']:5.2f} = {w:5.2f} "
          f"({1000 * w / n:5.2f} per 1,000 requests); whole child {sum(tot.values()):5.2f} "
          f"({label} {tot['root']:.2f}, actors {tot['actors']:.2f}, ray {tot['ray']:.2f}; "
          f"{s.count('actors')} actors, {s.count('ray')} Ray processes)", flush=True)  # fmt: skip
    f: dict[str, Any] = figures(r, s)
    f["requests_key"] = info["requests_key"]
    if contender in ("regen", "base"):
        before, after = s.at(r.first_at), {k: tot[k] - v for k, v in s.at(r.last_at).items()}
        print(
            f"       phases, CPU-s: start-up (child start to first request) "
            f"{_groups(before, label)}; after the last answer {_groups(after, label)}"
        )
        print(f"       Ray's own processes apart: start-up {f['ray_startup_s']:.2f} CPU-s "
              f"(once per session), while running {f['ray_window_s']:.2f} CPU-s = "
              f"{f['ray_cores']:.3f} cores (idle cost, per second, not per request), shutdown "
              f"{f['ray_after_s']:.2f}; driver + actors {f['no_ray']:.2f} CPU-s per 1,000 "
              f"requests in the window")  # fmt: skip
    busy = s.machine(r.first_at, r.last_at)
    f["others_cores"] = busy.get("others", 0.0)
    if busy:
        print(f"       machine over the window: {busy['all']:.2f} of {busy['cores']:.0f} cores "
              f"busy: client tree {busy['tree']:.2f}, server {busy.get('server', 0.0):.2f}, "
              f"this benchmark {busy.get('bench', 0.0):.2f}, others (other users) "
              f"{busy['others']:.2f}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    if "rows" in info:
        print(f"       rows {info['rows']}")
        threads = s.actor_threads()
        if threads:
            print("       actor threads (CPU-s, whole run): " + ", ".join(
                f"{k} {v:.2f}" for k, v in list(threads.items())[:8]))  # fmt: skip
    prof = info.get("profile")
    if prof and prof["samples"]:
        print(f"       actor profile ({prof['samples']} busy samples): " + ", ".join(
            f"{k.strip()} {v:.0%}" for k, v in prof["inclusive"].items()))  # fmt: skip
        for fr, share in prof["self_top"]:
            print(f"         self {share:5.1%}  {fr}")
    return f


#: what each contender is, in the side-by-side table
WHAT = {
    "regen": "regen run: driver + actors (+ Ray's own processes)",
    "base": "the other version's run (same split)",
    "worker": "one SampleWorker, no Ray",
    "pool": "asyncio pool, regen's own ChatClient",
    "plain": "asyncio pool, aiohttp + json.loads",
    "openai": "asyncio pool, official openai.AsyncOpenAI",
}
#: the ratios printed, numerator / denominator, when both ran
RATIOS = (
    *((a, b) for a in ("regen", "base", "worker") for b in ("openai", "pool", "plain")),
    ("regen", "base"),
    ("pool", "openai"),
    ("plain", "openai"),
)


def side_by_side(mode: str, med: dict[str, dict[str, float]], rounds: int) -> None:
    """The contenders' medians in one table, then the ratios (each within this run)."""
    of = f"medians of {rounds} rounds" if rounds > 1 else "one round"
    print(f"side by side ({mode}, {of}), CPU-s per 1,000 requests over the requests' window "
          f"[whole child]:")  # fmt: skip
    for c, f in med.items():
        line = (f"  {c:<6} {f['window']:6.2f} [{f['whole']:6.2f}]  e2e {f['utilization']:.3f}, "
                f"others {f['others_cores']:.2f} cores  {WHAT[c]}")  # fmt: skip
        if c in ("regen", "base"):
            line += (f": driver + actors {f['no_ray']:.2f} + Ray {f['window'] - f['no_ray']:.2f};"
                     f" Ray apart: start-up {f['ray_startup_s']:.2f} CPU-s once, "
                     f"{f['ray_cores']:.3f} cores while running")  # fmt: skip
        print(line)
    for a, b in RATIOS:
        if a in med and b in med:
            x, y = med[a], med[b]
            line = (f"ratio ({mode}): {a} / {b} = {x['window'] / y['window']:.2f}x CPU per "
                    f"request (window), {x['whole'] / y['whole']:.2f}x whole child")  # fmt: skip
            if a in ("regen", "base"):
                line += f", {x['no_ray'] / y['window']:.2f}x without Ray's own processes (window)"
            print(line, flush=True)


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
    o = sub.add_parser("openai-child")
    o.add_argument("--spec", required=True)
    p.add_argument("--conversations", type=int, default=1500)
    p.add_argument("--modes", nargs="*", default=["local", "stream"])
    p.add_argument("--only", nargs="*", default=["regen", "worker", "pool", "openai"],
                   choices=CONTENDERS)  # fmt: skip
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
    if args.cmd == "openai-child":
        return openai_child(args.spec)
    work = Path(tempfile.mkdtemp(prefix="regen-bench-cpu-"))
    manifest = write_workload(work, args.conversations, length_corr=args.length_corr)
    print(f"{args.conversations} conversations, {args.workers} actors, pool of {SLOTS}; "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
          f"work dir {work}", flush=True)  # fmt: skip
    for mode in args.modes:
        figs: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
        for rnd in range(args.repeat):
            for contender in args.only:
                r, s, info = run_contender(contender, mode, args, manifest, work, rnd)
                figs[contender].append(report(contender, mode, r, s, info))
        sent = {f["requests_key"] for fs in figs.values() for f in fs}
        print(f"requests ({mode}): " + ("every contender sent the same request bodies "
              "(the simulator's request keys: messages, tools, sampling, max tokens)"
              if len(sent) == 1 else "NOT the same request bodies: " + ", ".join(
                  f"{c} {fs[0]['requests_key']}" for c, fs in figs.items())))  # fmt: skip
        med = {c: {k: statistics.median(f[k] for f in fs) for k in fs[0] if k != "requests_key"}
               for c, fs in figs.items()}  # fmt: skip
        side_by_side(mode, med, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
