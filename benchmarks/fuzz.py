"""Hostile rows end to end: N mutants of every row of the demo's ten sources through ``regen
plan``, ``regen run`` (against ``regen simulate``), ``status``, ``verify`` and ``export``.

Each line of each demo source (good rows and bad ones alike) is kept and followed by N mutants,
made with a seeded generator (:func:`mutate_line`):

- structure-aware, on a line that is a JSON object, one to four of: a leaf (or a whole list or
  object) swapped for a hostile value (a number, a bool, null, a list, an object, a lone
  surrogate, a 200,000-character string, chat-template markup), a key dropped, a key added, a
  list emptied or repeated;
- on the bytes: the line cut short, invalid UTF-8, a BOM in front, a NUL inside, the line
  nested 100,000 deep.

The verdict: no traceback and no crash exit in any command; the rows ``plan`` read equal the
non-empty lines; every kept sample is done or failed with a reason (``status --json``); verify
is clean; the export exits 0. A command that printed a traceback names the rows that raise
(each row of the sources read again through its adapter, here).

    .venv/bin/python -m benchmarks.fuzz                        # 30 mutants a row, seeds 1 to 5
    .venv/bin/python -m benchmarks.fuzz --mutants 8 --seeds 2 --keep runs/fuzz

The full size starts its own loopback Ray head (benchmarks/chaos.py's launcher);
tests/reliability/test_fuzz.py runs a small size against the test session's head. Files, under
a temporary work directory (``--keep DIR`` keeps them)::

    WORK/seed-S/demo.yaml, demo/   the demo manifest and its sources, mutated
    WORK/seed-S/run/               the run directory; export/ its export
    WORK/seed-S/COMMAND.log        each command's stdout and stderr
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import shutil
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from benchmarks.chaos import work_with_head

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "manifests" / "demo.yaml"
#: chat-template markup of the families regen knows
MARKUP = ("<|im_end|>", "<|im_start|>assistant\n", "<think>", "</think>", "<tool_call>",
          "<|tool_calls_section_begin|>", "<｜tool▁calls▁begin｜>", "{{ raise_exception('x') }}",
          "USER: ", "ASSISTANT: <functioncall> {")  # fmt: skip
HOSTILE: tuple[Any, ...] = (0, -1, 2**70, 1.5, True, None, [], ["x", 1], {}, {"a": [1]},
                            "\ud800", "a\udfffb", "x" * 200_000, *MARKUP)  # fmt: skip
TRACEBACK = "Traceback (most recent call last)"
#: seconds each command may take
TIMEOUT_S = 900.0
SIM = {"model_name": "demo-target", "instant": True, "mean_tokens": 24.0}


# ---- mutants ---------------------------------------------------------------------------------


def json_paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every node of a JSON tree (the root's: ``()``), depth first."""
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += json_paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += json_paths(v, (*path, i))
    return out


class Picks(Protocol):
    """Where a mutation's choices come from: a seeded generator here (:class:`RngPicks`),
    Hypothesis's draws in the property tests (tests/_hostile.py)."""

    def choice(self, options: Sequence[Any]) -> Any: ...
    def count(self, low: int, high: int) -> int: ...
    def value(self) -> Any: ...  #: a hostile value
    def key(self) -> str: ...  #: a key to add


@dataclass(slots=True)
class RngPicks:
    rng: random.Random

    def choice(self, options: Sequence[Any]) -> Any:
        return self.rng.choice(options)

    def count(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def value(self) -> Any:
        return copy.deepcopy(self.rng.choice(HOSTILE))

    def key(self) -> str:
        return f"extra_{self.rng.randrange(10)}"


#: what a mutation does at a node, swaps the most often
OPS = ("swap", "swap", "swap", "drop", "add", "empty", "repeat")


def mutate_tree(tree: Any, picks: Picks, most: int = 4) -> Any:
    """``tree`` (not changed) with one to ``most`` mutations: a node swapped for a hostile
    value, dropped, a sibling added, emptied (a list, object or text) or repeated (a list); a
    tree with no node below its root is swapped whole."""
    tree = copy.deepcopy(tree)
    for _ in range(picks.count(1, most)):
        paths = [p for p in json_paths(tree) if p]
        if not paths:
            return picks.value()
        path = picks.choice(paths)
        parent: Any = tree
        for p in path[:-1]:
            parent = parent[p]
        key, op = path[-1], picks.choice(OPS)
        if op == "drop":
            parent.pop(key)
        elif op == "add" and isinstance(parent, dict):
            parent[picks.key()] = picks.value()
        elif op == "add":
            parent.insert(key, picks.value())
        elif op == "empty" and isinstance(parent[key], list | dict | str):
            parent[key] = type(parent[key])()
        elif op == "repeat" and isinstance(parent[key], list):
            parent[key] = parent[key] + copy.deepcopy(parent[key])
        else:
            parent[key] = picks.value()
    return tree


def mutate_line(line: bytes, rng: random.Random) -> bytes:
    """One mutant of a source line (module docstring); never a line break inside."""
    try:
        tree = json.loads(line)
    except ValueError:
        tree = None
    if isinstance(tree, dict) and rng.random() < 0.7:
        # ASCII escapes: a lone surrogate is written as JSON writes it (\ud800), not as bytes
        return json.dumps(mutate_tree(tree, RngPicks(rng))).encode()
    kind = rng.choice(("cut", "utf8", "bom", "nul", "deep"))
    at = rng.randrange(max(1, len(line)))
    if kind == "cut":
        return line[:at]
    if kind == "utf8":
        return line[:at] + rng.choice((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xe2\x82")) + line[at:]
    if kind == "bom":
        return b"\xef\xbb\xbf" + line
    if kind == "nul":
        return line[:at] + b"\x00" + line[at:]
    return b"[" * 100_000 + b"]" * 100_000


def mutate_sources(manifest: Path, mutants: int, rng: random.Random) -> int:
    """Every source file of ``manifest`` (JSONL) rewritten: each line, then ``mutants``
    mutants of it. Returns the non-empty lines written."""
    from regen.manifest import load_manifest

    lines = 0
    for src in load_manifest(manifest).sources:
        assert src.path is not None, "the demo's sources are files"
        path = manifest.parent / src.path
        out: list[bytes] = []
        for line in path.read_bytes().split(b"\n"):
            if not line.strip():
                continue
            out.append(line)
            out += [mutate_line(line, rng) for _ in range(mutants)]
        path.write_bytes(b"\n".join(out) + b"\n")
        lines += sum(1 for line in out if line.strip())
    return lines


# ---- one seed --------------------------------------------------------------------------------


@dataclass(slots=True)
class Command:
    name: str
    rc: int
    wall_s: float
    traceback: str | None = None  #: the first traceback it printed (its last lines)


@dataclass(slots=True)
class SeedReport:
    seed: int
    lines: int = 0
    read: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    kept: int = 0
    done: int = 0
    failed: int = 0
    commands: list[Command] = field(default_factory=list)
    #: rows whose adapter raised, read again here when a command printed a traceback
    crashing_rows: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def run_command(work: Path, name: str, argv: list[str], env: dict[str, str]) -> tuple[Command, str]:
    """``regen ARGV`` as a process; its stdout (its stdout and stderr go to WORK/NAME.log)."""
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "regen", "--log-level", "WARNING", *argv],
                       capture_output=True, text=True, errors="replace", env=env,
                       timeout=TIMEOUT_S)  # fmt: skip
    (work / f"{name}.log").write_text(p.stdout + "\n--- stderr ---\n" + p.stderr, encoding="utf-8")
    tb = None
    if TRACEBACK in p.stderr or TRACEBACK in p.stdout:
        text = p.stderr if TRACEBACK in p.stderr else p.stdout
        tb = "\n".join(text[text.index(TRACEBACK) :].splitlines()[-6:])
    return Command(name, p.returncode, round(time.monotonic() - start, 1), tb), p.stdout


def crashing_rows(manifest: Path) -> list[str]:
    """Each row of the sources whose reading raises (not a rejection): ``source row N: error``."""
    from regen.manifest import load_manifest
    from regen.sources import source_set
    from regen.sources.adapters import adapt_row
    from regen.sources.reader import iter_raw

    sources = source_set(load_manifest(manifest))
    found: list[str] = []
    for src in sources.sources:
        try:
            for raw in iter_raw(sources, src):
                if hasattr(raw, "data"):
                    try:
                        adapt_row(src, raw)
                    except Exception as e:  # what this benchmark looks for
                        found.append(f"{src.name} row {raw.row}: {type(e).__name__}: {e}"[:300])
        except Exception as e:
            found.append(f"{src.name}: reading raised {type(e).__name__}: {e}"[:300])
            found.append("".join(traceback.format_exception(e))[-600:])
    return found


def one_seed(work: Path, seed: int, mutants: int, address: str, env: dict[str, str]) -> SeedReport:
    from regen.devkit.simulate.testing import running_simulator

    rep = SeedReport(seed)
    shutil.copy(DEMO, work / DEMO.name)
    shutil.copytree(DEMO.parent / "demo", work / "demo")
    manifest = work / DEMO.name
    rep.lines = mutate_sources(manifest, mutants, random.Random(seed))
    run, export = work / "run", work / "export"

    cmd, out = run_command(work, "plan", ["plan", str(manifest), "--json"], env)
    rep.commands.append(cmd)
    if cmd.rc == 0:
        plan = json.loads(out)
        rep.read, rep.kept = plan["total"]["read"], plan["total"]["kept"]
        reasons: Counter[str] = Counter()
        for s in plan["sources"].values():
            reasons.update(s["rejected"])
        rep.rejected = dict(reasons.most_common())
    with running_simulator(**SIM) as sim:
        argv = ["run", str(manifest), "--out", str(run), "--endpoint", sim.url,
                "--address", address, "--no-view"]  # fmt: skip
        cmd, _ = run_command(work, "run", argv, env)
        rep.commands.append(cmd)
    cmd, out = run_command(work, "status", ["status", str(run), "--json"], env)
    rep.commands.append(cmd)
    if cmd.rc == 0:
        status = json.loads(out)
        rep.done, rep.failed = status["done"], status["failed"]
    for name, argv in (("verify", ["verify", str(run)]),
                       ("export", ["export", str(run), "--out", str(export)])):  # fmt: skip
        rep.commands.append(run_command(work, name, argv, env)[0])

    for c in rep.commands:
        if c.traceback:
            rep.problems.append(f"{c.name}: traceback: {c.traceback}")
        elif c.rc != 0:
            rep.problems.append(f"{c.name}: exit {c.rc} (see {work / c.name}.log)")
    if any(c.traceback for c in rep.commands):
        rep.crashing_rows = crashing_rows(manifest)
    if rep.read != rep.lines:
        rep.problems.append(f"plan read {rep.read} rows of {rep.lines} non-empty lines")
    if rep.done + rep.failed != rep.kept:
        rep.problems.append(f"{rep.kept} samples kept, {rep.done} done + {rep.failed} failed")
    return rep


def fuzz(work: Path, seeds: list[int], mutants: int, address: str,
         env: dict[str, str]) -> list[SeedReport]:  # fmt: skip
    reports = []
    for seed in seeds:
        (work / f"seed-{seed}").mkdir(parents=True, exist_ok=True)
        reports.append(one_seed(work / f"seed-{seed}", seed, mutants, address, env))
    return reports


def table(reports: list[SeedReport]) -> str:
    head = f"{'seed':>4} {'lines':>6} {'read':>6} {'rejected':>8} {'kept':>5} {'done':>5} " \
           f"{'failed':>6}  commands (exit, s)                       verdict"  # fmt: skip
    rows = [head]
    for r in reports:
        cmds = " ".join(f"{c.name}={c.rc}/{c.wall_s:.0f}" for c in r.commands)
        rows.append(f"{r.seed:>4} {r.lines:>6} {r.read:>6} {sum(r.rejected.values()):>8} "
                    f"{r.kept:>5} {r.done:>5} {r.failed:>6}  {cmds:<40} "
                    f"{'ok' if r.ok else 'FAILED'}")  # fmt: skip
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=int, default=30, help="mutants a row (default 30)")
    ap.add_argument("--seeds", type=int, default=5, help="seeds 1..N (default 5)")
    ap.add_argument("--keep", type=Path, help="work directory to keep (default: a temp dir)")
    ap.add_argument("--json", action="store_true", help="print the reports as JSON")
    args = ap.parse_args(argv)
    with work_with_head(args.keep) as (work, head, env):
        reports = fuzz(work, list(range(1, args.seeds + 1)), args.mutants, head.address, env)
    if args.json:
        sys.stdout.write(json.dumps([asdict(r) for r in reports], indent=1) + "\n")
    else:
        sys.stdout.write(table(reports) + "\n")
        for r in reports:
            sys.stdout.write(f"seed {r.seed}: rejected by reason {r.rejected}\n")
            for p in r.problems + r.crashing_rows:
                sys.stdout.write(f"seed {r.seed}: {p}\n")
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
