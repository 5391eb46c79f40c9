"""Benchmark: the CPU of building rows, and that the rows are the same, before and after
(issue 16), on the turns of a real run.

Reads a run directory's parts (``RUN/parts/*.parquet``: each row's request messages, what the
server returned, its counts and ids), rebuilds every sample's turns from them (as
``regen.engine.turns.DoneTurn`` would hold them) and builds the rows again with the row builder
of the ``regen`` that is imported, timing only that (``time.process_time``, every thread):
``regen.engine.rows.build_rows`` once per sample where it exists, else ``build_turn_row`` once per
turn (the code before issue 16). Two modes: ``local`` (no server ids: render and encode) and
``server`` (the row's prompt and response ids given as the server's, with ``<|im_end|>`` taken
off where the row says it was added).

The parent runs one child per interpreter (``--base-python PY --base-tree DIR`` as in
``benchmarks/cpu.py``: another regen version) and mode, ``--repeat`` times alternately, prints
the CPU per turn of each and compares the rows the children wrote (every column but
``created_at``) byte for byte.

Run: ``.venv/bin/python benchmarks/rows_cost.py RUN_DIR --base-python B/bin/python
--base-tree DIR`` where RUN_DIR is a run of ``benchmarks/cpu.py`` (its work dir is printed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


def turns_of(run_dir: Path, mode: str) -> tuple[Any, list[tuple[Any, list[tuple]]]]:
    """The run's manifest renderer input and every sample with its turns, in turn order."""
    import pyarrow.parquet as pq

    from regen.core.result import TurnResult
    from regen.core.sample import Sample, ToolCall

    by_sample: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for part in sorted((run_dir / "parts").glob("*.parquet")):
        for row in pq.read_table(part).to_pylist():
            by_sample[row["sample_id"]].append(row)
    out = []
    for sid in sorted(by_sample):
        rows = sorted(by_sample[sid], key=lambda r: r["turn"])
        tools = json.loads(rows[0]["tools"]) if rows[0]["tools"] else None
        sample = Sample(sid, rows[0]["source"], [], tools=tools)
        turns = []
        for r in rows:
            n_prompt = r["loss_mask"].index(1)
            ids = r["input_ids"]
            out_ids = ids[n_prompt : len(ids) - 1] if r["im_end_added"] else ids[n_prompt:]
            server = mode == "server"
            res = TurnResult(
                content=r["content"],
                reasoning=r["reasoning"],
                tool_calls=tuple(
                    ToolCall(c.get("id") or "", c["function"]["name"], c["function"]["arguments"])
                    for c in json.loads(r["tool_calls"])
                ),
                finish_reason=r["finish_reason"],
                model=r["model"],
                endpoint=r["endpoint"],
                prompt_tokens=r["prompt_tokens"],
                completion_tokens=r["completion_tokens"],
                reasoning_tokens=r["reasoning_tokens"],
                cached_tokens=r["cached_tokens"],
                prompt_token_ids=ids[:n_prompt] if server else None,
                output_token_ids=out_ids if server else None,
                latency_s=r["latency_s"],
                ttft_s=r["ttft_s"],
                attempts=r["attempts"],
            )
            turns.append((r["turn"], json.loads(r["messages"]), res))
        out.append((sample, turns))
    return out


def child(args: argparse.Namespace) -> int:
    import regen.engine.rows as rows_mod
    from regen.engine.inputs import render_settings
    from regen.manifest import load_manifest
    from regen.template.render import Renderer

    manifest = load_manifest(str(args.run / "manifest.yaml"))
    renderer = Renderer.of(render_settings(manifest))
    items = turns_of(args.run, args.mode)
    build_rows = getattr(rows_mod, "build_rows", None)
    t0 = time.process_time()
    built = []
    for sample, turns in items:
        if build_rows is not None:
            built.append(build_rows(sample, turns, renderer))
        else:
            built.append([rows_mod.build_turn_row(sample, t, m, r, renderer) for t, m, r in turns])
    cpu = time.process_time() - t0
    with open(args.out, "w") as f:
        for rows in built:
            for row in rows:
                row.pop("created_at")
                f.write(json.dumps(row, sort_keys=True) + "\n")
    prompts = getattr(renderer, "_prompts", None)
    stats = dict(prompts.stats) if prompts is not None else {}
    turns = sum(len(t) for _, t in items)
    how = "build_rows" if build_rows is not None else "build_turn_row"
    print(json.dumps({"cpu": cpu, "turns": turns, "samples": len(items), "stats": stats,
                      "how": f"{how} of {rows_mod.__file__}"}))  # fmt: skip
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path, help="a run directory (e.g. from benchmarks/cpu.py)")
    p.add_argument("--modes", nargs="*", default=["local", "server"])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--base-python", type=Path, required=True)
    p.add_argument("--base-tree", type=Path, required=True)
    p.add_argument("--child", choices=["local", "server"], help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.mode = args.child
        return child(args)
    work = Path(tempfile.mkdtemp(prefix="regen-bench-rows-"))
    for mode in args.modes:
        cpu: dict[str, list[float]] = defaultdict(list)
        info: dict[str, Any] = {}
        for rnd in range(args.repeat):
            for who, py, cwd in (("after", sys.executable, None),
                                 ("before", str(args.base_python), args.base_tree)):  # fmt: skip
                out = work / f"{mode}-{who}-{rnd}.jsonl"
                argv = [py, str(HERE), str(args.run.resolve()), "--base-python", py,
                        "--base-tree", ".", "--child", mode, "--out", str(out)]  # fmt: skip
                done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, check=True)
                got = json.loads(done.stdout.strip().splitlines()[-1])
                cpu[who].append(1000 * got["cpu"] / got["turns"])
                info[who] = got
        same = (work / f"{mode}-after-0.jsonl").read_bytes() == (
            work / f"{mode}-before-0.jsonl"
        ).read_bytes()
        a, b = statistics.median(cpu["after"]), statistics.median(cpu["before"])
        print(f"{mode:<6} {info['after']['turns']} turns of {info['after']['samples']} samples: "
              f"before {b:.3f} ms per turn, after {a:.3f} ms ({b / a:.2f}x less; medians of "
              f"{args.repeat}: before {[round(x, 3) for x in cpu['before']]}, after "
              f"{[round(x, 3) for x in cpu['after']]}); rows byte-equal: {same}; prompt ids: "
              f"{info['after']['stats']}; before: {info['before']['how']}; after: "
              f"{info['after']['how']}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
