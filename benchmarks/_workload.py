"""Shared parts of the performance benchmarks (issue 8): the workload, the simulator fleet and
how utilization is measured. Not a test; imported by ``benchmarks/*.py``.

Workload: ``n`` ShareGPT-style conversations (``id``, ``conversations: [{from, value}]``),
deterministic from a seed; a share ``multi`` has 2-3 user turns (so 2-3 assistant turns to
regenerate), the rest one; prompt lengths are long-tailed (lognormal, 20-6,000 characters).
The original (``gpt``) answers are another model answering the same prompts: each has a
lognormal length in words (mean 256, sigma 1, at most 2,048) whose normal draw is
``sqrt(c)·prompt_z + sqrt(1-c)·z_own`` — ``prompt_z`` the simulator's draw for the turn's user
message (:func:`regen.devkit.simulate.answer.prompt_z`, manifest seed), ``c`` = ``length_corr`` — so
against ``regen simulate --prompt-share c`` their log lengths correlate ~c with the target's;
at c = 0 they carry no signal. Written as ``WORKDIR/sharegpt.jsonl`` with a manifest
``WORKDIR/bench.yaml`` (target ``bench-target``, the demo's tiny tokenizer, ``max_tokens``
2048, seed 0).

Fleet: ``k`` fresh ``regen simulate`` subprocesses per contender (the capacity model; one
request log each; fresh because a server's per-conversation counts outlive a stats reset). A
poller thread reads every server's ``/stats?keys=1`` every ``POLL_S``: the first poll at which
every conversation has been received by some server marks the end of the backlog (from then
on the client has nothing new to start: the tail). Utilization is server tokens ÷ (capacity ×
wall): end to end from the first request received to the last request finished (request
logs), and over the backlog from the first request to that poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regen.devkit.simulate.answer import prompt_z
from regen.devkit.simulate.testing import RunningSimulator, running_simulator

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"
MODEL = "bench-target"
MAX_TOKENS = 2048
#: the manifest's ``sampling.seed``: the simulator's prompt draw depends on it
SAMPLING_SEED = 0
POLL_S = 0.2

_WORDS = tuple(
    [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "explain",
        "write",
        "code",
        "list",
        "compare",
        "summarise",
        "the",
        "a",
        "of",
        "to",
        "in",
        "why",
        "how",
        "what",
        "when",
        "model",
        "data",
        "server",
        "python",
        "table",
        "story",
        "poem",
        "rust",
    ]
)


def _text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(_WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


def original_length(
    user_text: str, z_own: float, *, length_corr: float, mean_tokens: float, sigma: float
) -> int:
    """Words of the original answer to ``user_text``: lognormal (mean ``mean_tokens``),
    sharing a share ``length_corr`` of its log variance with the simulator's prompt draw."""
    mu = math.log(mean_tokens) - sigma * sigma / 2
    z = math.sqrt(length_corr) * prompt_z(SAMPLING_SEED, user_text)
    z += math.sqrt(1.0 - length_corr) * z_own
    return min(MAX_TOKENS, max(1, round(math.exp(mu + sigma * z))))


def make_rows(
    n: int = 1500,
    *,
    multi: float = 0.3,
    seed: int = 0,
    length_corr: float = 0.0,
    mean_tokens: float = 256.0,
    sigma: float = 1.0,
) -> list[dict[str, Any]]:
    """The ShareGPT-style workload: ``n`` conversations, a share ``multi`` with 2-3 turns.
    The prompts depend on ``seed`` alone; the originals' lengths on ``length_corr`` too."""
    rng = random.Random(seed)  # prompts (and turn counts): the same for any length_corr
    originals = random.Random(f"{seed}:originals")
    rows = []
    for i in range(n):
        turns = rng.choice((2, 3)) if rng.random() < multi else 1
        conv = []
        for t in range(turns):
            chars = int(min(6000, max(20, math.exp(rng.gauss(math.log(300), 1.0)))))
            user = f"[{i}.{t}] " + _text(rng, chars)
            _text(rng, 60)  # the former fixed-size original: keeps later prompts unchanged
            words = original_length(user, originals.gauss(0.0, 1.0), length_corr=length_corr,
                                    mean_tokens=mean_tokens, sigma=sigma)  # fmt: skip
            gpt = " ".join(originals.choice(_WORDS) for _ in range(words))
            conv.append({"from": "human", "value": user})
            conv.append({"from": "gpt", "value": gpt})
        rows.append({"id": f"conv{i:05d}", "conversations": conv})
    return rows


def write_workload(
    workdir: Path, n: int = 1500, *, multi: float = 0.3, length_corr: float = 0.0
) -> Path:
    """Rows + manifest in ``workdir``; returns the manifest path."""
    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / "sharegpt.jsonl").open("w") as f:
        for row in make_rows(n, multi=multi, length_corr=length_corr):
            f.write(json.dumps(row) + "\n")
    manifest = {
        "name": "bench",
        "target": {"model": MODEL, "tokenizer": str(TOKENIZER), "template": "kimi-k2.5",
                   "trust_remote_code": False},
        "sampling": {"temperature": 0.6, "top_p": 0.95, "max_tokens": MAX_TOKENS,
                     "thinking": True, "seed": SAMPLING_SEED},
        "endpoints": [],
        "engine": {"workers": 2, "concurrency": 64, "max_attempts": 4, "part_size": 512,
                   "part_interval_s": 30, "request_timeout_s": 600},
        "sources": [{"name": "sharegpt", "adapter": "sharegpt", "path": "sharegpt.jsonl"}],
    }  # fmt: skip
    path = workdir / "bench.yaml"
    path.write_text(json.dumps(manifest, indent=1))  # JSON is YAML
    return path


@dataclass(slots=True)
class Measured:
    """What the servers saw during one contender's run."""

    tokens: int  #: tokens generated (scheduler tokens, all servers)
    capacity_tok_s: float  #: sum of the servers' capacities
    wall_s: float  #: first request received → last request finished
    backlog_s: float  #: first request received → every conversation received
    backlog_tokens: float
    requests: int
    occupancy: float = 0.0  #: servers' mean batch occupancy over the steps they ran
    late_steps: float = 0.0  #: share of steps the servers ran late (their loop lagged)
    first_at: float = 0.0  #: first request received (this process's monotonic clock)
    last_at: float = 0.0  #: last request finished (same clock)

    @property
    def utilization(self) -> float:
        return self.tokens / (self.capacity_tok_s * self.wall_s) if self.wall_s else 0.0

    @property
    def backlog_utilization(self) -> float:
        if not self.backlog_s:
            return 0.0
        return self.backlog_tokens / (self.capacity_tok_s * self.backlog_s)

    @property
    def throughput(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0


@dataclass
class Fleet:
    """Running simulators plus the poller of one measurement."""

    sims: list[RunningSimulator]
    logs: list[Path]
    conversations: int = 0
    _polls: list[tuple[float, list[dict[str, Any]]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.sims]

    def start(self, conversations: int) -> None:
        """Reset the servers' counters and logs, start polling."""
        for s, log in zip(self.sims, self.logs, strict=True):
            s.reset_stats()
            log.write_text("")
        self.conversations = conversations
        self._polls = []
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                snaps = [s.stats(keys=True) for s in self.sims]
            except OSError:
                snaps = []
            if snaps:
                self._polls.append((t, snaps))
            self._stop.wait(POLL_S)

    def stop(self) -> Measured:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=10)
        t_now = time.monotonic()
        final = [s.stats(keys=True) for s in self.sims]
        cap = sum(f["capacity_tok_s"] for f in final)
        tokens = sum(f["tokens_generated"] for f in final)
        # server-relative times → this process's monotonic clock (request log "t" is
        # seconds since the server started; uptime_s is now - started)
        starts = [t_now - f["uptime_s"] for f in final]
        first = min(t_now - f["window_s"] for f in final if f["window_s"] > 0)
        last = first
        requests = 0
        for started, log in zip(starts, self.logs, strict=True):
            for line in log.read_text().splitlines():
                rec = json.loads(line)
                requests += 1
                last = max(last, started + rec["t"])
        backlog_end, backlog_tokens = last, float(tokens)
        for t, snaps in self._polls:
            seen: set[str] = set()
            for s in snaps:
                seen.update(s.get("conversations") or {})
            if len(seen) >= self.conversations:
                backlog_end = t
                backlog_tokens = float(sum(s["tokens_generated"] for s in snaps))
                break
        steps = sum(f["steps"] for f in final)
        occupancy = sum(f["mean_batch_occupancy"] * f["steps"] for f in final) / max(1, steps)
        late = sum(f["late_steps"] for f in final) / max(1, steps)
        return Measured(tokens, cap, last - first, max(0.0, backlog_end - first),
                        backlog_tokens, requests, occupancy, late, first, last)  # fmt: skip


@contextlib.contextmanager
def fleet(k: int, workdir: Path, **options: Any) -> Iterator[Fleet]:
    """``k`` simulators (``regen simulate`` options) with request logs under ``workdir``."""
    logs = [workdir / f"sim{i}.jsonl" for i in range(k)]
    with contextlib.ExitStack() as stack:
        sims = [
            stack.enter_context(running_simulator(model_name=MODEL, request_log=log, **options))
            for log in logs
        ]
        yield Fleet(sims, logs)


def run_async(coro: Any) -> Any:
    return asyncio.run(coro)
