"""Synthetic run directories for tests, the refresh benchmark and the README capture.

Writes, under a run directory (local path or pyarrow URI), the files the dashboard reads
(names and records in :mod:`regen.store.layout`): run.json, the manifest, the lock (optional),
the progress file, and with :func:`write_parts` Parquet parts ``synthetic-NNNNN`` with their
records (rows that only take space).

Everything is deterministic: a given ``now`` and arguments give the same bytes.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import time
from typing import Literal

import yaml

from regen.store import RunDir, layout
from regen.store.counts import count_rows
from regen.store.parts import make_record, part_bytes
from regen.store.progress import (
    SERIES_STEP_S,
    SERIES_WINDOW_S,
    EndpointProgress,
    OutputHistogram,
    ProgressSnapshot,
    SourceProgress,
)

#: (name, samples, regenerate, observed tokens/turn, turns/sample) of a production-like run
PRODUCTION_SOURCES: tuple[tuple[str, int, bool, int, float], ...] = (
    ("sharegpt", 20_000, True, 1_050, 2.6),
    ("ultrachat", 15_000, True, 900, 2.1),
    ("openthoughts", 10_000, True, 3_900, 1.0),
    ("perfectblend", 10_000, True, 820, 1.3),
    ("opencodereasoning", 8_000, True, 4_300, 1.0),
    ("xlam", 6_000, True, 310, 1.0),
    ("glaive", 6_000, True, 420, 1.8),
    ("swe_gym", 3_088, True, 1_600, 7.5),
    ("magicoder", 8_000, True, 1_150, 1.0),
    ("kimi_native", 2_000, False, 0, 1.0),
)
ENDPOINTS = ("http://10.0.0.5:30000/v1", "http://10.0.0.6:30000/v1", "http://10.0.0.7:30000/v1")


def make_snapshot(
    now: float,
    *,
    fraction: float = 0.45,
    rate_tok_s: float = 2_300.0,
    session_age_s: float = 3 * 3600.0,
    run_age_s: float = 22 * 3600.0,
    state: Literal["running", "finished", "interrupted", "failed"] = "running",
    sources: tuple[tuple[str, int, bool, int, float], ...] = PRODUCTION_SOURCES,
    host: str | None = None,
    pid: int | None = None,
    session: str = "20261129T073500-a1b2c3",
) -> ProgressSnapshot:
    """A progress snapshot of a run ``fraction`` done, producing ``rate_tok_s`` lately."""
    started = now - session_age_s
    snap = ProgressSnapshot(
        name="kimi-k25-eagle3-regen",
        model="moonshotai/Kimi-K2.5",
        session=session,
        host=socket.gethostname() if host is None else host,
        pid=os.getpid() if pid is None else pid,
        state=state,
        run_started_at=now - run_age_s,
        started_at=started,
        updated_at=now - 1.0,
        endpoints_configured=list(ENDPOINTS),
    )
    hist = OutputHistogram()
    for i, (name, total, regen, per_turn, turns) in enumerate(sources):
        f = 1.0 if not regen or fraction >= 1 else min(1.0, fraction * (1.25 - 0.05 * i))
        done = round(total * f)
        rows = round(done * turns)
        failed = 0 if not regen else min(total - done, (i * 7) % 23)
        snap.sources[name] = SourceProgress(
            total=total,
            done=done,
            failed=failed,
            truncated=rows // 90 if per_turn > 3000 else rows // 700,
            rows=rows,
            prompt_tokens=rows * 1_800,
            completion_tokens=rows * per_turn,
            regenerate=regen,
            pending=None,  # no parts behind these counters: not reconciled with parts/
            flags=_flags(rows, per_turn) if regen else {},
        )
        snap.sources[name].flagged = round(sum(snap.sources[name].flags.values()) * 0.9)
        if regen and rows:
            _spread(hist, per_turn, rows)
    snap.output_tokens_hist = hist
    total_now = round(rate_tok_s * min(session_age_s, 4 * 3600.0) * 0.98)
    span = min(session_age_s, SERIES_WINDOW_S)
    n = int(span // SERIES_STEP_S)
    for k in range(n + 1):
        t = now - 2.0 - (n - k) * SERIES_STEP_S
        # a slightly wavy rate: 1 min and 15 min windows differ by a few percent
        dt = (n - k) * SERIES_STEP_S
        wave = 0.06 * rate_tok_s * 60.0 * math.sin(dt / 240.0)
        snap.token_series.append((t, max(0, round(total_now - rate_tok_s * dt + wave))))
    live = state == "running"
    snap.in_flight = 127 if live else 0
    snap.requests.sent = 31_520
    snap.requests.ok = 31_190
    snap.requests.retried = 241
    snap.requests.failed = 9
    snap.record_error(
        "timeout", "read timed out after 1800 s (http://10.0.0.6:30000/v1)", now - 420
    )
    for _ in range(5):
        snap.record_error("context_length", "400: prompt (131,402 tokens) too long", now - 3_600)
    for _ in range(183):
        snap.record_error(
            "server_error", "503 Service Unavailable from http://10.0.0.7:30000/v1", now - 95
        )
    snap.endpoints = [
        EndpointProgress(
            url=ENDPOINTS[0],
            in_flight=64 if live else 0,
            healthy=True,
            latency_p50_s=41.8,
            ok=12_911,
            errors=3,
            server_running=64 if live else None,
            server_queued=2 if live else None,
            server_kv_usage=0.71 if live else None,
        ),
        EndpointProgress(
            url=ENDPOINTS[1],
            in_flight=63 if live else 0,
            healthy=True,
            latency_p50_s=44.2,
            ok=12_640,
            errors=11,
            # a shared server: another client's requests beside regen's 63
            server_running=64 if live else None,
            server_queued=9 if live else None,
            server_kv_usage=0.93 if live else None,
        ),
        EndpointProgress(
            url=ENDPOINTS[2], in_flight=0, healthy=False, latency_p50_s=None, ok=5_639, errors=188
        ),
    ]
    return snap


def _spread(hist: OutputHistogram, mean: int, n: int) -> None:
    """Add ``n`` lengths of a log-normal-ish shape around ``mean`` (deterministic)."""
    weights = [
        math.exp(-((math.log(max(lo, 16)) - math.log(mean)) ** 2) / 0.9) for lo in hist.edges
    ]
    total = sum(weights)
    for lo, w in zip(hist.edges, weights, strict=True):
        hist.add(lo, round(n * w / total))


def write_run_dir(
    uri: str | os.PathLike[str],
    snapshot: ProgressSnapshot | None,
    *,
    now: float,
    lock: Literal["live", "stale", "none"] = "live",
    output_tokens: dict[str, tuple[int, int]] | None = None,
) -> None:
    """Write run.json, manifest.yaml, lock.json and progress.json for ``snapshot``."""

    rd = RunDir.open(uri)
    name = snapshot.name if snapshot else "synthetic"
    model = snapshot.model if snapshot else "moonshotai/Kimi-K2.5"
    layout.RUN_FILE.write(
        rd,
        layout.RunRecord(
            name=name,
            fingerprint="0" * 32,
            model=model,
            created_at=snapshot.run_started_at if snapshot else now,
            regen_version="0.1.0",
            endpoints=list(ENDPOINTS),
        ),
    )
    sources = snapshot.sources if snapshot else {}
    manifest = {
        "name": name,
        "target": {"model": model, "tokenizer": "/models/kimi-k2.5"},
        "sources": [
            {
                "name": s,
                "adapter": "sharegpt" if sp.regenerate else "kimi_native",
                "path": f"data/{s}.jsonl",
                **({} if sp.regenerate else {"mode": "native"}),
                "output_tokens": list((output_tokens or {}).get(s, (600, 1400))),
            }
            for s, sp in sources.items()
        ],
    }
    rd.write_text_atomic(layout.MANIFEST, yaml.safe_dump(manifest, sort_keys=False))
    if lock != "none":
        beat = now - 2.0 if lock == "live" else now - 600.0
        layout.LOCK_FILE.write(
            rd,
            layout.LockRecord(
                host=snapshot.host if snapshot else socket.gethostname(),
                pid=snapshot.pid if snapshot else os.getpid(),
                session=snapshot.session if snapshot else "s",
                started_at=snapshot.started_at if snapshot else now,
                heartbeat_at=beat,
            ),
        )
    else:
        rd.delete(layout.LOCK)
    if snapshot is not None:
        layout.PROGRESS_FILE.write(rd, snapshot)


def _flags(rows: int, per_turn: int) -> dict[str, int]:
    """Flagged rows of a source: ~1% (more loops and unclosed reasoning for long answers)."""
    long = per_turn > 3000
    shares = {"repetition": 0.006 if long else 0.003,
              "reasoning_unclosed": 0.005 if long else 0.001, "empty_content": 0.002,
              "language_mismatch": 0.001, "refusal": 0.002}  # fmt: skip
    return {f: round(rows * x) for f, x in shares.items() if round(rows * x)}


def write_parts(uri: str | os.PathLike[str], rows: int, *, rows_per_part: int = 10_000) -> int:
    """Write ``rows`` small Kimi-format-shaped rows as Parquet parts; returns the part count."""
    import pyarrow as pa

    rd = RunDir.open(uri)
    ids = pa.array([[163587, 1, 2, 3, 163601, 4, 5, 163586]] * rows_per_part, pa.list_(pa.int32()))
    mask = pa.array([[0, 0, 0, 0, 0, 1, 1, 1]] * rows_per_part, pa.list_(pa.int8()))
    text = pa.array(["<|im_user|>user<|im_middle|>hi<|im_end|>"] * rows_per_part)
    n_parts = 0
    for start in range(0, rows, rows_per_part):
        n = min(rows_per_part, rows - start)
        table = pa.table(
            {
                "sample_id": pa.array([f"sharegpt:{start + i:08d}" for i in range(n)]),
                "source": pa.array(["sharegpt"] * n),
                "text": text.slice(0, n),
                "input_ids": ids.slice(0, n),
                "loss_mask": mask.slice(0, n),
            }
        )
        stem = f"synthetic-{n_parts:05d}"
        data = part_bytes(table, n)
        rd.write_bytes_atomic(layout.part_path(stem), data)
        one = count_rows([{}])
        layout.part_record_file(stem).write(
            rd,
            make_record(
                stem,
                data,
                {sid: ("sharegpt", one) for sid in table["sample_id"].to_pylist()},
                table.num_rows,
            ),
        )
        n_parts += 1
    return n_parts


def main(argv: list[str] | None = None) -> int:
    """``python -m regen.devkit.synthetic RUN_DIR``: write a production-like running run there."""

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("run_dir")
    ap.add_argument("--state", default="running",
                    choices=["running", "finished", "interrupted", "failed"])  # fmt: skip
    ap.add_argument("--fraction", type=float, default=0.45)
    args = ap.parse_args(argv)
    now = time.time()
    snap = make_snapshot(now, fraction=args.fraction, state=args.state, host="gpu-node-01",
                         pid=48213)  # fmt: skip
    write_run_dir(args.run_dir, snap, now=now, lock="live" if args.state == "running" else "none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
