"""The loop cut (issue 43): what looping answers cost the servers with and without it, and how
far sound answers stay from it.

Two parts, both on this machine:

- ``fleet`` (default 5,000 samples): ``regen.engine.run_job`` regenerates the same ShareGPT
  samples twice against fresh ``regen simulate`` servers (SGLang mode, 50 tokens/s per request
  as a large model streams, answers of ~200 tokens, ``--degenerate-rate 0.05``: 40% of the
  degenerate answers are loops, so 2% of all answers loop until ``max_tokens`` 2,048), once
  with ``quality.loop_cut`` off and once on. Printed: the tokens the servers generated in each
  run (their scheduler's count: cancelled jobs included, so an abort that comes late is paid),
  the tokens the looping answers held without the cut, what they cost with it (per answer, in
  units of the detector's window), and whether the fall covers the loops' share less what the
  cut answers streamed and an allowance, set in advance, for the tokens a server makes before
  it aborts a closed stream (SGLang: ~2 s later, +1 s slack, at 50 tokens/s).
- ``sound``: every normal answer the quality benchmark checks (benchmarks/quality.py: the demo
  sources' answers, the simulator's answers to the workload and the demo, package docs and
  code, translations in 11 scripts) and every assistant turn of the real-shaped rows of the
  ten sources (benchmarks/_rehearsal_data.py), streamed through the detector as the client
  streams them (a look every ``every`` word pieces). Printed: cuts (must be 0) and the margin,
  the longest qualifying back-to-back run any look found (words, where the n-gram has at least
  ``min_copies`` copies) against ``min_words``.

    .venv/bin/python -m benchmarks.loop_cut                    # both parts (~6 min)
    .venv/bin/python -m benchmarks.loop_cut --part sound
    .venv/bin/python -m benchmarks.loop_cut --part fleet --samples 1000

A local Ray starts in this process (``--address`` joins one). Exit 0 when the sound answers
had no cut and the fleet's fall covers the loops' share.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import chaos
from benchmarks._workload import Fleet, write_workload

SIM: dict[str, Any] = {
    "model_name": "bench-target",
    "max_running_requests": 96,
    "step_ms": 20.0,  # one token per 20 ms step: 50 tokens/s per request
    "mean_tokens": 200.0,
    "length_sigma": 0.6,
    "degenerate_rate": 0.05,
}
MAX_TOKENS = 2048
SERVERS = 2
#: SGLang aborts a closed stream's request this long after (the simulator's default, as
#: tokenizer_manager.create_abort_task), and the slack allowed for noticing the close
SGLANG_ABORT_S = 2.0
ABORT_SLACK_S = 1.0
ENGINE = {"workers": 2, "concurrency": 96}


def fleet_run(work: Path, samples: int, cut: bool, address: str | None) -> dict[str, Any]:
    """One run of ``samples`` with the loop cut on or off; what the servers made."""
    from regen.devkit.simulate.testing import running_simulator
    from regen.engine import RunOptions, run_job
    from regen.manifest import load_manifest
    from regen.store import RunDir

    work.mkdir(parents=True, exist_ok=True)
    manifest_path = write_workload(work, samples)
    overrides = [f"sampling.max_tokens={MAX_TOKENS}",
                 f"quality.loop_cut.enabled={str(cut).lower()}",
                 *(f"engine.{k}={v}" for k, v in ENGINE.items())]  # fmt: skip
    manifest = load_manifest(manifest_path, overrides)
    out = work / "run"
    logs = [work / f"sim{i}.jsonl" for i in range(SERVERS)]
    with contextlib.ExitStack() as stack:
        sims = [stack.enter_context(running_simulator(request_log=log, **SIM)) for log in logs]
        fleet = Fleet(sims, logs)
        fleet.start(samples)
        t0 = time.monotonic()
        opts = RunOptions(endpoints=[s.url for s in sims], address=address, handle_signals=False)
        summary = run_job(manifest, RunDir.open(out, create=True), opts)
        wall = time.monotonic() - t0
        time.sleep(3.0)  # an abort that comes late (SGLang: ~2 s) is still counted
        measured = fleet.stop()
    rows = chaos.stored_rows(out)
    answers = [r for r in rows if r["token_source"] != "native"]
    loops = [r for r in answers if r["finish_reason"] in ("loop",) or (
        r["finish_reason"] == "length" and "repetition" in r["quality_flags"])]  # fmt: skip
    return {
        "cut": cut,
        "state": summary.state,
        "wall_s": round(wall, 1),
        "server_tokens": measured.tokens,
        "rows": len(answers),
        "stored_tokens": sum(r["completion_tokens"] or 0 for r in answers),
        "loop_rows": len(loops),
        "loop_tokens": sum(r["completion_tokens"] or 0 for r in loops),
        "cut_rows": sum(1 for r in answers if r["finish_reason"] == "loop"),
        "cut_saved": sum(r["cut_saved"] or 0 for r in answers),
        "finish": dict(Counter(r["finish_reason"] for r in answers)),
        "window_words": manifest.quality.loop_cut.window_words,
    }


def fleet_part(work: Path, samples: int, address: str | None) -> bool:
    off = fleet_run(work / "off", samples, False, address)
    on = fleet_run(work / "on", samples, True, address)
    fall = off["server_tokens"] - on["server_tokens"]
    cuts = on["cut_rows"]
    # what a cut loop may still cost, set before measuring: the tokens streamed up to the cut
    # (the rows' own count), plus what the server makes until it aborts the closed stream
    # (SGLang: ~2 s later; ABORT_SLACK_S more for noticing it) at one request's speed
    per_s = 1000.0 / SIM["step_ms"]
    allowance = cuts * (SGLANG_ABORT_S + ABORT_SLACK_S) * per_s
    expected = off["loop_tokens"] - on["loop_tokens"] - allowance
    made_after = on["server_tokens"] - on["stored_tokens"]  # made, never streamed: the aborts
    cost = (on["loop_tokens"] + made_after) / cuts if cuts else 0.0
    ok = (off["state"] == on["state"] == "finished" and cuts == off["loop_rows"] > 0
          and fall >= expected)  # fmt: skip
    for r in (off, on):
        print(json.dumps(r))
    print(
        f"\nloop cut, {samples} samples, {off['rows']} answers, {SERVERS} simulated servers "
        f"(SGLang mode, {per_s:.0f} tokens/s per request, max_tokens {MAX_TOKENS}):"
    )
    print(f"  {'':44}{'cut off':>12}{'cut on':>12}")
    for label, a, b in (
        ("tokens the servers generated", off["server_tokens"], on["server_tokens"]),
        ("looping answers", off["loop_rows"], cuts),
        ("tokens streamed of them", off["loop_tokens"], on["loop_tokens"]),
        ("tokens made after the cut, before the abort", 0, made_after),
    ):
        print(f"  {label:44}{a:>12,}{b:>12,}")
    share = off["loop_tokens"] / off["server_tokens"]
    print(f"  the loops held {share:.1%} of the servers' tokens without the cut; the servers made "
          f"{fall:,} fewer ({fall / off['server_tokens']:.1%}); at least {expected:,.0f} expected "
          f"(the loops' tokens less what the cut ones streamed, less {allowance:,.0f} for the "
          f"aborts)")  # fmt: skip
    print(
        f"  a cut loop cost {cost:.0f} tokens ({cost / MAX_TOKENS:.1%} of max_tokens; "
        f"{cost / off['window_words']:.2f}x the {off['window_words']}-word window), "
        f"{made_after / max(1, cuts):.0f} of them after the cut -> {'ok' if ok else 'MISSED'}"
    )
    return ok


def sound_answers() -> Iterator[tuple[str, str]]:
    """(corpus, answer text) of every sound answer (module docstring)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import quality as qb  # benchmarks/quality.py: its corpora

    for item in qb.demo_items():
        yield "demo sources", _text(item)
    for kind, item in qb.simulator_items(0.0):
        if kind is None and item[1]["finish_reason"] != "length":
            yield "simulator", _text(item)
    for kind in ("docs", "code"):
        for item in qb.text_items(kind, 400):
            yield kind, _text(item)
    items, _ = qb.language_items(60)
    for item in items:
        yield "languages", _text(item)
    yield from real_shaped()


def _text(item: tuple[str, dict[str, Any]]) -> str:
    """An answer of benchmarks/quality.py (``(id, turn)``) as the check joins it."""
    turn = item[1]
    reasoning, content = turn.get("reasoning") or "", turn.get("content") or ""
    return f"{reasoning}\n{content}" if reasoning and content else reasoning or content


def real_shaped() -> Iterator[tuple[str, str]]:
    """Every assistant turn of the ten sources' real-shaped rows (~2,000 samples), read through
    regen's own adapters (production's manifest on local files)."""
    from benchmarks._rehearsal_data import make_data
    from regen.manifest import load_manifest
    from regen.sources import read_samples, source_set

    with tempfile.TemporaryDirectory(prefix="regen-loopcut-") as tmp:
        data = make_data(Path(tmp), 2000, scale=1)
        for s in read_samples(source_set(load_manifest(data.manifest))):
            for m in s.messages:
                if m.role == "assistant" and (m.content or m.reasoning):
                    reasoning, content = m.reasoning or "", m.content or ""
                    text = (
                        f"{reasoning}\n{content}" if reasoning and content else reasoning or content
                    )
                    yield f"real-shaped {s.source}", text


def sound_part() -> bool:
    from regen.devkit.simulate.tokens import split_pieces
    from regen.quality.config import LoopCut
    from regen.quality.loop import LoopWatch

    cut = LoopCut()
    n = Counter()
    cuts = Counter()
    worst: dict[str, tuple[int, int, str]] = {}
    looks, look_s = 0, 0.0
    for corpus, text in sound_answers():
        n[corpus] += 1
        pieces = split_pieces(text)
        watch = LoopWatch(cut)
        best = (0, 0)
        for end in range(cut.every, len(pieces) + cut.every, cut.every):
            seen = _Seen(pieces[: min(end, len(pieces))])
            t0 = time.perf_counter()
            looped = watch.loops(seen, end)
            look_s += time.perf_counter() - t0
            looks += 1
            if looped:
                cuts[corpus] += 1
                break
            run, ngram = watch.found
            if ngram and run >= cut.min_copies * ngram and run > best[0]:
                best = (run, ngram)
        if best[0] > worst.get(corpus, (0, 0, ""))[0]:
            worst[corpus] = (*best, text[:80])
    print(f"\nsound answers through the loop cut (a look every {cut.every} pieces, "
          f"{cut.window_words}-word window, cut at {cut.min_words} words in "
          f"{cut.min_copies}+ copies):")  # fmt: skip
    for corpus in n:
        run, ngram, _ = worst.get(corpus, (0, 0, ""))
        print(f"  {corpus:34}{n[corpus]:>8,} answers {cuts[corpus]:>4} cut; longest qualifying "
              f"run {run} words (n-gram {ngram})")  # fmt: skip
    top = max((w[0] for w in worst.values()), default=0)
    print(
        f"  total {sum(n.values()):,} answers, {sum(cuts.values())} cut; margin: the longest "
        f"qualifying run {top} words against {cut.min_words}"
    )
    mean = look_s / max(1, looks)
    print(f"  {looks:,} looks, {1e3 * mean:.2f} ms each on average: {1e6 * mean / cut.every:.1f} "
          f"us per streamed token")  # fmt: skip
    return not cuts


class _Seen:
    def __init__(self, pieces: list[str]) -> None:
        self.reasoning: list[str] = []
        self.content = pieces


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("fleet", "sound", "both"), default="both")
    ap.add_argument("--samples", type=int, default=5000)
    ap.add_argument("--address", help="Ray cluster to join (default: a local Ray)")
    ap.add_argument("--keep", type=Path, help="work directory to keep (default: a temp dir)")
    args = ap.parse_args(argv)
    ok = True
    if args.part in ("sound", "both"):
        ok = sound_part() and ok
    if args.part in ("fleet", "both"):
        work = args.keep or Path(tempfile.mkdtemp(prefix="regen-loopcut-"))
        ok = fleet_part(work, args.samples, args.address) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
