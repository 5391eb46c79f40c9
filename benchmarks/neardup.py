"""Benchmark: near-duplicate detection on synthetic prompts — time, and peak memory of its state.

``scale``: ``--sizes`` (default 100,000, 200,000, 400,000) synthetic prompts streamed through
:class:`regen.sources.neardup.NearDuplicates` (the manifest's default ``dedup``), each size in a
fresh process; ``--full`` adds 1,400,000 (about 3-4 min on 2 cores). Per size: seconds,
microseconds per prompt, the state's own bytes (``nbytes``), and the peak RSS of the process above
its RSS before the first prompt (VmHWM − VmRSS: the index, signatures, ids and every transient,
prompts excluded: they are generated one at a time). Prompts: words of a Zipf-like vocabulary of
50,000, lognormal length around 40 words (5-1,500); every tenth is a planted near-duplicate of an
earlier one (other casing, other whitespace, a trailing "Thanks!" or one word changed), so the
match path runs too and the drops are counted.

``compare``: the same ``--n`` prompts (default 30,000) through each library's own streaming dedup
— datasketch ``MinHash`` + ``MinHashLSH`` (its own banding), rensa ``RMinHash`` +
``RMinHashDeduplicator`` (16 bands × 8 rows: its bands must divide ``num_perm``), and
regen's index (rensa ``RMinHash`` signatures, compact LSH) — one fresh process each: seconds per
prompt, bytes per prompt of peak RSS, and drops.

Run: ``.venv/bin/python benchmarks/neardup.py scale [--full]`` and
``.venv/bin/python benchmarks/neardup.py compare`` (needs datasketch: ``pip install -e .[bench]``).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from itertools import accumulate

from regen.core.sample import Message, Sample
from regen.manifest import Dedup
from regen.sources.neardup import SEED, NearDuplicates, lsh_params, near_text, shingles

VOCAB = [f"{chr(97 + i % 26)}{i:x}" for i in range(50_000)]
CUM = list(accumulate(1.0 / (r + 1) for r in range(len(VOCAB))))  # Zipf weights
PLANT_EVERY = 10


def _words(i: int) -> list[str]:
    rng = random.Random(i)
    n = int(min(1500, max(5, rng.lognormvariate(3.7, 0.8))))
    return rng.choices(VOCAB, cum_weights=CUM, k=n)


def _variant(i: int, words: list[str]) -> str:
    rng = random.Random(-i)
    kind = i // PLANT_EVERY % 4
    if kind == 0:
        return " ".join(words).upper()
    if kind == 1:
        return "\n ".join("  ".join(words[j : j + 7]) for j in range(0, len(words), 7))
    if kind == 2:
        return " ".join(words) + " Thanks!"
    w = list(words)
    w[rng.randrange(len(w))] = "changed"
    return " ".join(w)


def prompts(n: int) -> Iterator[tuple[int, str, int | None]]:
    """``(i, prompt, j)``: every ``PLANT_EVERY``-th prompt repeats the earlier original ``j``
    (``j`` is None for an original)."""
    for i in range(n):
        if i % PLANT_EVERY == PLANT_EVERY - 1:
            j = random.Random(i).randrange(i // PLANT_EVERY + 1) * PLANT_EVERY  # an original
            yield i, _variant(i, _words(j)), j
        else:
            yield i, " ".join(_words(i)), None


def true_jaccard(text: str, j: int, k: int) -> float:
    a, b = set(shingles(text, k)), set(shingles(" ".join(_words(j)), k))
    return len(a & b) / len(a | b) if a | b else 1.0


def _rss_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(key)


def run_one(kind: str, n: int) -> dict[str, object]:
    """One measurement in this process (called in a fresh child). Only the dedup is timed:
    generating the prompts and checking the planted ones' true similarity are not."""
    dedup = Dedup()
    k = dedup.shingle
    base = _rss_kib("VmRSS")
    counts = {"dropped": 0, "planted_above": 0, "found_above": 0, "planted_below": 0,
              "dropped_below": 0}  # fmt: skip
    nbytes = None
    if kind == "regen":
        idx = NearDuplicates(dedup)

        def is_dup(i: int, text: str) -> bool:
            s = Sample(
                id=f"synthetic:{i:08d}", source="synthetic", messages=[Message("user", text)]
            )
            return idx.match_or_add(s, near_text(s)) is not None

    elif kind == "rensa":
        import rensa

        bands, _ = lsh_params(dedup.threshold, dedup.num_perm)
        while dedup.num_perm % bands:  # rensa's bands must divide num_perm: 16 x 8 here
            bands += 1
        rd = rensa.RMinHashDeduplicator(dedup.threshold, dedup.num_perm, True, bands, SEED)

        def is_dup(i: int, text: str) -> bool:
            mh = rensa.RMinHash(dedup.num_perm, SEED)
            mh.update(shingles(text, k))
            return not rd.add(f"synthetic:{i:08d}", mh)

    elif kind == "datasketch":
        from datasketch import MinHash, MinHashLSH

        lsh = MinHashLSH(threshold=dedup.threshold, num_perm=dedup.num_perm)
        kept: dict[str, MinHash] = {}  # candidates are verified on the stored signatures

        def is_dup(i: int, text: str) -> bool:
            mh = MinHash(num_perm=dedup.num_perm, seed=SEED)
            mh.update_batch([s.encode() for s in shingles(text, k)])
            if any(mh.jaccard(kept[c]) >= dedup.threshold for c in lsh.query(mh)):
                return True
            key = f"synthetic:{i:08d}"
            lsh.insert(key, mh)
            kept[key] = mh
            return False

    else:
        raise ValueError(kind)
    secs = 0.0
    for i, text, j in prompts(n):
        t0 = time.perf_counter()
        hit = is_dup(i, text)
        secs += time.perf_counter() - t0
        counts["dropped"] += hit
        if j is not None:
            above = true_jaccard(text, j, k) >= dedup.threshold
            counts["planted_above" if above else "planted_below"] += 1
            counts["found_above" if above else "dropped_below"] += hit
    if kind == "regen":
        nbytes = idx.nbytes()
    peak = (_rss_kib("VmHWM") - base) * 1024
    return {
        "kind": kind,
        "n": n,
        "seconds": round(secs, 1),
        "us_per_prompt": round(secs / n * 1e6, 1),
        "peak_rss_mib": round(peak / 2**20, 1),
        "peak_bytes_per_prompt": round(peak / n),
        "state_bytes_per_prompt": None if nbytes is None else round(nbytes / n),
        **counts,
    }


def child(kind: str, n: int) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, __file__, "_one", kind, str(n)],
        capture_output=True,
        text=True,
        check=True,
        timeout=3600,
    )
    return json.loads(out.stdout)


def show(r: dict[str, object]) -> None:
    state = r["state_bytes_per_prompt"]
    others = r["dropped"] - r["found_above"] - r["dropped_below"]
    print(
        f"{r['kind']:>10} {r['n']:>9,} prompts: {r['seconds']:>7.1f} s "
        f"({r['us_per_prompt']:>6.1f} µs/prompt), peak RSS +{r['peak_rss_mib']:>7.1f} MiB "
        f"({r['peak_bytes_per_prompt']:>5} B/prompt"
        + (f", state {state} B/prompt" if state is not None else "")
        + f"); planted at/above the threshold: {r['found_above']:,}/{r['planted_above']:,} "
        f"dropped; below: {r['dropped_below']:,}/{r['planted_below']:,}; others {others:,}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sc = sub.add_parser("scale")
    sc.add_argument("--sizes", default="100000,200000,400000")
    sc.add_argument("--full", action="store_true", help="also 1,400,000 prompts")
    cp = sub.add_parser("compare")
    cp.add_argument("--n", type=int, default=30_000)
    one = sub.add_parser("_one")
    one.add_argument("kind")
    one.add_argument("n", type=int)
    args = ap.parse_args()
    if args.cmd == "_one":
        print(json.dumps(run_one(args.kind, args.n)))
        return
    d = Dedup()
    bands, rows = lsh_params(d.threshold, d.num_perm)
    print(f"dedup: threshold {d.threshold}, shingle {d.shingle}, num_perm {d.num_perm} "
          f"({bands} bands x {rows} rows)")  # fmt: skip
    if args.cmd == "scale":
        sizes = [int(s) for s in args.sizes.split(",") if s]
        if args.full:
            sizes.append(1_400_000)
        for n in sizes:
            show(child("regen", n))
    else:
        for kind in ("datasketch", "rensa", "regen"):
            show(child(kind, args.n))


if __name__ == "__main__":
    main()
