"""Benchmark: what regen's routing and order do to server time once prefill costs (issue 43).

Workload: the ten production sources in real shapes and proportions
(``benchmarks/_rehearsal_data.py``, output scale 1: production's answer lengths, ~1,300
tokens a turn), every conversation's turns as regen sends them (``regen.engine.turns
.regenerate``: each turn re-sends the history with our earlier replies), answer lengths from
the simulator's answer model (``regen.devkit.simulate.answer``, mean 1,300, the prompt's share
0.5). SWE-Gym is regenerated ``turns: all`` by default (``--swe-turns last`` is the
production manifest's setting): its trajectories re-send tens of thousands of prompt tokens on
every turn, the case the prefix cache is for. Tool turns continue as in the original (the
target is assumed to make the original's calls), so every trajectory runs to its end.

Servers: the simulator's model with prefill on, a large MoE on 8 GPUs (64 slots, 3.2 ms
decode step = 20,000 tok/s, 20 µs per uncached prompt token, chunks of 8,192, a prefix cache
of 2M tokens per server; docs/simulate.md "Prefill" has the sources), run as a discrete-event
model (``benchmarks/prefill_model.py``, the simulator's own PrefixCache) because 24 fleets of
8 real simulators for hours of virtual time do not fit two cores. ``--validate`` checks that
model against a real ``regen run`` on ``regen simulate`` servers with the same settings.

Compared, on 1, 4 and 8 endpoints:

- **order**: regen's (``engine/schedule.py`` WorkQueue: longest expected first, prompt weighted
  by ``PREFILL_WEIGHT``) or plain manifest order;
- **next turn**: sent as soon as the previous one returns (regen: a sample keeps its slot) or
  queued behind every sample not yet started (turn by turn);
- **routing**: ``affinity`` (regen's router: a sample's turns on one endpoint),
  ``least_loaded`` (regen's router without the binding: each request to the least loaded
  endpoint with room) or ``round_robin`` (a plain load balancer: each request to the next
  endpoint, room or not; ``--routes random`` also exists).

Printed per row: the prefix cache's hit rate (cached ÷ prompt tokens), the prefill's share of
the servers' busy time, busy server-seconds per 1,000 regenerated tokens, and fleet-seconds per
1,000 tokens (endpoints × makespan: what the reserved GPUs cost, idle tail included).

A second table tries regen's order with other ``PREFILL_WEIGHT`` values (affinity, next turn
at once). Each endpoint count gets its own workload of ``--per-endpoint`` samples per endpoint
(default 1,500), so the tail is the same share of the run on 1, 4 and 8 endpoints.

Run: ``.venv/bin/python -m benchmarks.prefill`` (~7 min on 2 cores: 2.5 to build the three
workloads; ``--quick``: 300 samples per endpoint on 1 and 8, ~1 min) and ``--validate`` (a
1-endpoint ``regen run`` of 100 samples against one simulator, ~1.5 min). The numbers and what
they led to: docs/performance.md "Prefill, the prefix cache, routing and order".
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _rehearsal_data import PROMPT_SHARE, make_data
from prefill_model import Conversation, Outcome, ServerParams, Turn, after_segments, run

from regen.core.result import TurnResult
from regen.core.sample import Sample
from regen.devkit.simulate import AnswerConfig, answer
from regen.devkit.simulate.prefix_cache import message_segments
from regen.engine.schedule import WorkQueue
from regen.engine.turns import regenerate
from regen.manifest import Manifest, load_manifest
from regen.sources import read_samples, source_set

#: the simulator's answer lengths at production scale (benchmarks/_rehearsal_data.py)
MEAN_TOKENS = 1300.0


def manifest(work: Path, samples: int, swe_turns: str, seed: int = 0) -> Path:
    """The rehearsal's sources and production's manifest, SWE-Gym's turns as asked, token
    ids rendered by regen (``local``: a simulator without a tokenizer serves it)."""
    data = make_data(work, samples, scale=1, seed=seed)
    doc = yaml.safe_load(data.manifest.read_text(encoding="utf-8"))
    doc["sampling"]["token_ids"] = "local"
    for s in doc["sources"]:
        if s["name"] == "swe_gym":
            s["turns"] = swe_turns
    data.manifest.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return data.manifest


def conversations(
    samples: list[Sample], m: Manifest, config: AnswerConfig, *, continue_tools: bool = True
) -> list[Conversation]:
    """Every sample's requests as regen sends them, answered by the simulator's model.
    ``continue_tools``: a turn makes the original's tool calls (the trajectory goes on);
    otherwise the simulator's own calls, as ``regen simulate`` answers (most tool
    conversations then end at their first turn, as against the simulator)."""
    s = m.sampling
    memo: dict[Hashable, int] = {}

    async def one(sample: Sample) -> Conversation:
        assistants = [x for x in sample.messages if x.role == "assistant"]
        recorded: list[tuple[tuple[Any, ...], int]] = []

        async def complete(msgs: list[dict[str, Any]], tools: Any) -> TurnResult:
            body = {"messages": msgs, "tools": tools, "seed": s.seed, "max_tokens": s.max_tokens,
                    "chat_template_kwargs": m.template_kwargs()}  # fmt: skip
            segments = tuple(message_segments(msgs, tools, memo=memo))
            a = answer(body, config, prompt_tokens=sum(t for _, t in segments))
            recorded.append((segments, a.completion_tokens))
            finish = a.finish_reason
            if continue_tools:
                k = len(recorded) - 1 if sample.turns == "all" else -1
                calls = assistants[k].tool_calls if assistants else ()
                if finish != "length":
                    finish = "tool_calls" if calls else "stop"
            else:
                from regen.core.sample import ToolCall

                calls = tuple(ToolCall(c.id, c.name, c.arguments) for c in a.tool_calls)
            return TurnResult(a.content, a.reasoning or None, calls, finish, "m", "e",
                              completion_tokens=a.completion_tokens)  # fmt: skip

        await regenerate(sample, complete)
        turns = []
        for k, (segments, completion) in enumerate(recorded):
            nxt = recorded[k + 1][0] if k + 1 < len(recorded) else None
            after = after_segments(segments, nxt, ("answer", sample.id, k), completion)
            turns.append(Turn(segments, sum(t for _, t in segments), completion, after))
        return Conversation(sample.source, tuple(turns))

    async def all_() -> list[Conversation]:
        return [await one(x) for x in samples]

    return asyncio.run(all_())


def workload(
    work: Path, n: int, swe_turns: str, *, continue_tools: bool = True
) -> tuple[Manifest, list[Sample], list[Conversation], list[int]]:
    """``n`` samples of the ten sources: the manifest, the samples regen regenerates, their
    conversations and regen's order of them."""
    work.mkdir(parents=True, exist_ok=True)
    m = load_manifest(manifest(work, n, swe_turns))
    samples = [x for x in read_samples(source_set(m), row_warnings=False) if x.input_ids is None]
    config = AnswerConfig(mean_tokens=MEAN_TOKENS, prompt_share=PROMPT_SHARE)
    convs = conversations(samples, m, config, continue_tools=continue_tools)
    return m, samples, convs, regen_order(samples)


ROWS = (("regen", "at_once"), ("manifest", "at_once"), ("regen", "queued"),
        ("manifest", "queued"))  # fmt: skip
#: PREFILL_WEIGHT values tried for regen's order (today's is schedule.PREFILL_WEIGHT)
WEIGHTS = (0.0, 0.00625, 0.02, 0.1, 0.4)


def regen_order(samples: list[Sample], weight: float | None = None) -> list[int]:
    """The order regen's WorkQueue pops the samples in (before it learned anything), with
    ``PREFILL_WEIGHT`` set to ``weight`` (None: today's)."""
    from regen.engine import schedule

    pos = {x.id: i for i, x in enumerate(samples)}
    saved = schedule.PREFILL_WEIGHT
    if weight is not None:
        schedule.PREFILL_WEIGHT = weight
    try:
        return [pos[x.id] for x in iter(WorkQueue(samples).pop, None)]
    finally:
        schedule.PREFILL_WEIGHT = saved


def _cells(o: Outcome) -> list[str]:
    return [f"{o.hit_rate:.3f}", f"{o.prefill_s / o.busy_s:.3f}",
            f"{1000 * o.busy_per_token:.3f}", f"{1000 * o.fleet_per_token:.3f}"]  # fmt: skip


def table(convs: list[Conversation], orders: dict[str, list[int]], params: ServerParams,
          e: int, routes: tuple[str, ...], header: bool) -> list[str]:  # fmt: skip
    """The rows of one endpoint count: order × next turn, a column group per route."""
    lines = []
    if header:
        head = ["endpoints", "order", "next turn"]
        for r in routes:
            head += [f"{r}: hit", "prefill share", "busy s/1k", "fleet s/1k"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        print("\n".join(lines), flush=True)
    for order, nxt in ROWS:
        cells = [str(e), order, nxt.replace("_", " ")]
        for route in routes:
            o = run(convs, orders[order], endpoints=e, affinity=route, next_turn=nxt,
                    params=params)  # fmt: skip
            cells += _cells(o)
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    return lines


def weights(convs: list[Conversation], samples: list[Sample], params: ServerParams, e: int,
            header: bool) -> list[str]:  # fmt: skip
    """Regen's order at each PREFILL_WEIGHT (affinity, next turn at once)."""
    from regen.engine.schedule import PREFILL_WEIGHT

    lines = []
    if header:
        lines += ["| endpoints | PREFILL_WEIGHT | hit | prefill share | busy s/1k | fleet s/1k |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        print("\n".join(lines), flush=True)
    for w in WEIGHTS:
        o = run(convs, regen_order(samples, w), endpoints=e, params=params)
        mark = " (today)" if w == PREFILL_WEIGHT else ""
        lines.append(f"| {e} | {w:g}{mark} | " + " | ".join(_cells(o)) + " |")
        print(lines[-1], flush=True)
    return lines


def describe(convs: list[Conversation]) -> str:
    reqs = sum(len(c.turns) for c in convs)
    prompt = sum(t.prompt for c in convs for t in c.turns)
    out = sum(t.completion for c in convs for t in c.turns)
    swe = [t.prompt for c in convs if c.source == "swe_gym" for t in c.turns]
    swe_note = (f"; swe_gym: {len(swe)} requests, mean prompt {sum(swe) / len(swe):,.0f}, "
                f"max {max(swe):,}") if swe else ""  # fmt: skip
    return (f"{len(convs)} conversations, {reqs} requests, {prompt:,} prompt tokens "
            f"({prompt / reqs:,.0f} a request), {out:,} completion tokens{swe_note}")  # fmt: skip


# -- validation against regen run + regen simulate ---------------------------------------------


def validate(work: Path, n: int, params: ServerParams, endpoints: int = 1) -> None:
    """A real ``regen run`` (1 worker) on ``endpoints`` simulators with prefill and the cache,
    against the model fed the same conversations (the simulator's own tool calls, so they end
    where the run's do) in regen's order, with affinity."""
    import contextlib

    from _rehearsal_data import MODEL

    from regen.devkit.simulate.testing import running_simulator
    from regen.engine import RunOptions, run_job
    from regen.store import RunDir

    m, _, convs, order = workload(work, n, "all", continue_tools=False)
    sim = {"max_running_requests": params.slots, "step_ms": params.step_s * 1000,
           "prefill_us_per_token": params.prefill_s_per_token * 1e6,
           "chunked_prefill_size": params.chunk, "prefix_cache_tokens": params.cache_tokens,
           "mean_tokens": MEAN_TOKENS, "prompt_share": PROMPT_SHARE,
           "tool_call_rate": AnswerConfig().tool_call_rate}  # fmt: skip
    model = run(convs, order, endpoints=endpoints, params=params)
    print(f"validate on {endpoints} endpoint(s): {describe(convs)}")
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(running_simulator(model_name=MODEL, **sim))
                   for _ in range(endpoints)]  # fmt: skip
        t0 = time.monotonic()
        opts = RunOptions(endpoints=[s.url for s in servers], workers=1, handle_signals=False)
        summary = run_job(m, RunDir.open(work / "run", create=False), opts)
        wall = time.monotonic() - t0
        stats = [s.stats() for s in servers]
    hits = sum(st["prefix_cache"]["hits"] for st in stats)
    queries = sum(st["prefix_cache"]["queries"] for st in stats)
    total = {
        k: sum(st[k] for st in stats)
        for k in ("received", "prompt_tokens", "tokens_generated", "busy_s", "prefill_s")
    }
    print(f"regen run: {summary.state}, {summary.done} samples in {wall:.1f} s")
    print("| | requests | prompt tokens | hit rate | completion tokens | busy s | prefill s |")
    print("|---|---|---|---|---|---|---|")
    print(f"| model | {model.requests} | {model.prompt:,} | {model.hit_rate:.3f} | "
          f"{model.completion:,} | {model.busy_s:.2f} | {model.prefill_s:.2f} |")  # fmt: skip
    print(f"| regen simulate | {total['received']} | {total['prompt_tokens']:,} | "
          f"{hits / queries if queries else 0.0:.3f} | {total['tokens_generated']:,} | "
          f"{total['busy_s']:.2f} | {total['prefill_s']:.2f} |")  # fmt: skip
    if endpoints > 1:
        print("busy s per endpoint: model " + ", ".join(f"{b:.1f}" for b in model.per_server_busy)
              + "; simulators " + ", ".join(f"{st['busy_s']:.1f}" for st in stats))  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-endpoint", type=int, default=1500,
                    help="samples per endpoint (the workload grows with the fleet)")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="300 samples per endpoint, 1 and 8")
    ap.add_argument("--swe-turns", choices=("all", "last"), default="all")
    ap.add_argument("--endpoints", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--routes", nargs="+", default=["affinity", "least_loaded", "round_robin"])
    ap.add_argument("--cache-tokens", type=int, default=ServerParams().cache_tokens)
    ap.add_argument("--prefill-us", type=float, default=ServerParams().prefill_s_per_token * 1e6)
    ap.add_argument("--validate", action="store_true", help="model vs regen run + simulate")
    ap.add_argument("--validate-samples", type=int, default=100)
    ap.add_argument("--validate-endpoints", type=int, default=1)
    args = ap.parse_args()
    params = ServerParams(cache_tokens=args.cache_tokens, prefill_s_per_token=args.prefill_us / 1e6)
    with tempfile.TemporaryDirectory(prefix="regen-prefill-") as tmp:
        work = Path(tmp)
        if args.validate:
            validate(work, args.validate_samples, params, args.validate_endpoints)
            return 0
        per = 300 if args.quick else args.per_endpoint
        endpoints = (1, 8) if args.quick else tuple(args.endpoints)
        print(f"servers: {params}")
        built = {}
        for e in endpoints:
            t0 = time.monotonic()
            _, samples, convs, order = workload(work / f"e{e}", per * e, args.swe_turns)
            built[e] = (samples, convs, order)
            print(f"{e} endpoint(s): {describe(convs)} ({time.monotonic() - t0:.0f} s to build)")
        t0 = time.monotonic()
        for i, e in enumerate(endpoints):
            samples, convs, order = built[e]
            orders = {"regen": order, "manifest": list(range(len(convs)))}
            table(convs, orders, params, e, tuple(args.routes), header=i == 0)
        print()
        for i, e in enumerate(endpoints):
            samples, convs, _ = built[e]
            weights(convs, samples, params, e, header=i == 0)
        print(f"model runs: {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
