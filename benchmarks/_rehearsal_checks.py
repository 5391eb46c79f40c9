"""The rehearsal's checks, made without regen's own counters (issue 32).

Three witnesses regen does not write: the simulators' request logs (one line per request a
server finished handling), the Parquet parts read directly with pyarrow, and the export's
JSONL shards. :func:`check_run` compares them with the input (the samples the manifest's
sources hold, read with regen's adapters, and the generator's own counts):

- **lost**: input samples with no stored row; **unexpected**: stored samples not in the input;
- **duplicated**: a ``(sample_id, turn)`` stored twice;
- **incomplete**: a sample whose turns are not 0..k-1 with k its turns to regenerate, unless its
  last row ends early for a reason regen records (``finish_reason`` ``length``, ``ended``);
- **unanswered**: a stored row whose request (``regen.devkit.simulate.keys.request_key`` of the
  request the row records: messages, tools, the manifest's sampling) no server completed
  (HTTP 200, not cut) in its request log; the reverse, **answers not stored**, are requests a
  server completed whose answer is in no row (work a fault threw away), and **answered again**
  are requests completed more than once (both reported per fault window, not failures);
- **native**: every native row's ids and mask byte-equal to its source row's;
- **export**: every stored row exported exactly once (hash of ``input_ids`` and ``loss_mask``
  against the shards' lines; the export keeps every row), no line that is not a stored row.

Reads only; owns no files.
"""

from __future__ import annotations

import hashlib
import json
import logging
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from benchmarks._rehearsal_fleet import Endpoint, read_log

COLUMNS = ["sample_id", "source", "turn", "attempt", "messages", "tools", "finish_reason",
           "ended", "input_ids", "loss_mask", "token_source"]  # fmt: skip


def ids_hash(ids: Iterable[int], mask: Iterable[int]) -> bytes:
    """A digest of a row's token ids and loss mask."""
    h = hashlib.blake2b(digest_size=16)
    h.update(array("i", ids).tobytes())
    h.update(b"|")
    h.update(array("b", mask).tobytes())
    return h.digest()


def open_fs(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and path for a local path or a URI (s3://...)."""
    if "://" in uri:
        return pafs.FileSystem.from_uri(uri)
    return pafs.LocalFileSystem(), uri


def part_files(uri: str) -> tuple[pafs.FileSystem, list[str]]:
    fs, base = open_fs(uri)
    infos = fs.get_file_info(pafs.FileSelector(f"{base.rstrip('/')}/parts", allow_not_found=True))
    names = sorted(i.path for i in infos if i.path.endswith(".parquet")
                   and not i.base_name.startswith(".tmp"))  # fmt: skip
    return fs, names


def iter_rows(uri: str) -> Iterator[dict[str, Any]]:
    """Every stored row (the columns of :data:`COLUMNS`), part by part, row group by group."""
    fs, names = part_files(uri)
    for name in names:
        with fs.open_input_file(name) as f:
            pf = pq.ParquetFile(f)
            cols = [c for c in COLUMNS if c in pf.schema_arrow.names]
            for g in range(pf.num_row_groups):
                yield from pf.read_row_group(g, columns=cols).to_pylist()


def request_body(row: dict[str, Any], sampling: dict[str, Any]) -> dict[str, Any]:
    """The request a row records, as ``ChatClient.request_body`` sent it (the fields the
    simulator's request key reads)."""
    body = {"model": sampling["model"], "messages": json.loads(row["messages"]),
            "temperature": sampling["temperature"], "top_p": sampling["top_p"],
            "max_completion_tokens": sampling["max_tokens"],
            "chat_template_kwargs": sampling["kwargs"]}  # fmt: skip
    for k in ("top_k", "min_p", "seed"):
        if sampling.get(k) is not None:
            body[k] = sampling[k]
    if row["tools"]:
        body["tools"] = json.loads(row["tools"])
    return body


@dataclass
class Served:
    """What the request logs say: completions per request key, with when each finished."""

    completed: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: Counter[str] = field(default_factory=Counter)
    lines: int = 0
    by_endpoint: dict[int, Counter[str]] = field(default_factory=dict)
    #: conversation -> when its first request reached a server (the first line's time less
    #: its answer's length at ``step_s`` a token: the log has no receive time)
    first_seen: dict[str, float] = field(default_factory=dict)
    cut: list[tuple[float, int, str]] = field(default_factory=list)  #: (at, endpoint, why)


def read_served(endpoints: list[Endpoint], step_s: float = 0.0) -> Served:
    s = Served()
    for ep in endpoints:
        c = s.by_endpoint.setdefault(ep.index, Counter())
        for inc in ep.incarnations:
            for rec in read_log(inc):
                s.lines += 1
                status = rec.get("status")
                fault = rec.get("fault")
                gone = bool(rec.get("client_gone"))
                kind = (
                    f"{status}" + (f" {fault}" if fault else "") + (" client_gone" if gone else "")
                )
                s.statuses[kind] += 1
                c[kind] += 1
                conv = rec.get("conversation", "")
                began = rec["at"] - step_s * (rec.get("completion_tokens") or 0)
                s.first_seen[conv] = min(s.first_seen.get(conv, began), began)
                ok = status == 200 and not gone and fault in (None, "stall")
                if ok and "completion_tokens" in rec:
                    s.completed[rec["key"]].append(rec["at"])
                else:
                    s.cut.append((rec["at"], ep.index, kind))
    return s


@dataclass
class Verdict:
    """The independent checks' numbers; ``problems`` lists every check that failed."""

    inputs: int = 0
    inputs_by_source: dict[str, int] = field(default_factory=dict)
    generated_by_source: dict[str, int] = field(default_factory=dict)
    stored_samples: int = 0
    rows: int = 0
    lost: int = 0
    unexpected: int = 0
    duplicated: int = 0
    incomplete: int = 0
    ended_early: dict[str, int] = field(default_factory=dict)
    unanswered: int = 0
    answers_not_stored: int = 0
    answered_again: int = 0
    native_rows: int = 0
    native_wrong: int = 0
    requests_logged: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    exported_lines: int = 0
    exported_once: int = 0  #: stored rows exported once
    exported_twice: int = 0  #: exported lines beyond one per stored row
    not_exported: int = 0  #: stored rows not exported
    export_extra: int = 0
    verify_rc: int | None = None
    problems: list[str] = field(default_factory=list)
    #: (completion time, request key) of the answers not stored / answered again, for faults
    wasted: list[tuple[float, str]] = field(default_factory=list)
    again: list[tuple[float, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        skip = {"wasted", "again"}
        out = {k: v for k, v in self.__dict__.items() if k not in skip}
        out["ok"] = self.ok
        return out


def check_run(
    run_uri: str,
    manifest_path: str,
    generated: dict[str, int],
    endpoints: list[Endpoint],
    export_dir: str | None,
    verify_rc: int | None,
) -> Verdict:
    """Every check of the module docstring on one finished run."""
    from regen.devkit.simulate.keys import request_key
    from regen.manifest import load_manifest
    from regen.sources import read_samples, source_set

    logging.getLogger("regen.sources").setLevel(logging.ERROR)  # the rows skipped, again
    m = load_manifest(manifest_path)
    v = Verdict(generated_by_source=dict(generated), verify_rc=verify_rc)
    expected: dict[str, int] = {}
    last_only: set[str] = set()  #: samples of a ``turns: last`` source: one row, any turn
    native: dict[str, bytes] = {}
    by_source: Counter[str] = Counter()
    for s in read_samples(source_set(m)):
        expected[s.id] = s.turns_to_regenerate()
        if s.turns == "last":
            last_only.add(s.id)
        by_source[s.source] += 1
        if s.mode == "native":
            native[s.id] = ids_hash(s.input_ids or (), s.loss_mask or ())
    v.inputs, v.inputs_by_source = len(expected), dict(by_source)
    sampling = {"model": m.target.model, "temperature": m.sampling.temperature,
                "top_p": m.sampling.top_p, "max_tokens": m.sampling.max_tokens,
                "top_k": getattr(m.sampling, "top_k", None),
                "min_p": getattr(m.sampling, "min_p", None), "seed": m.sampling.seed,
                "kwargs": m.template_kwargs()}  # fmt: skip
    served = read_served(endpoints) if endpoints else None
    turns: dict[str, list[int]] = defaultdict(list)
    last: dict[str, tuple[int, str | None, str | None]] = {}
    keys: Counter[tuple[str, int]] = Counter()
    stored_keys: set[str] = set()
    row_hashes: Counter[bytes] = Counter()
    for r in iter_rows(run_uri):
        v.rows += 1
        sid, turn = r["sample_id"], r["turn"]
        keys[(sid, turn)] += 1
        turns[sid].append(turn)
        if sid not in last or turn > last[sid][0]:
            last[sid] = (turn, r["finish_reason"], r.get("ended"))
        row_hashes[ids_hash(r["input_ids"], r["loss_mask"])] += 1
        if r["token_source"] == "native":
            v.native_rows += 1
            v.native_wrong += int(native.get(sid) != ids_hash(r["input_ids"], r["loss_mask"]))
            continue
        if served is not None:
            key = request_key(request_body(r, sampling))
            stored_keys.add(key)
            v.unanswered += int(key not in served.completed)
    ids = set(turns)
    v.stored_samples = len(ids)
    v.lost = len(expected.keys() - ids)
    v.unexpected = len(ids - expected.keys())
    v.duplicated = sum(n - 1 for n in keys.values() if n > 1)
    ended: Counter[str] = Counter()
    for sid, ts in turns.items():
        k = len(set(ts))
        if sid in native or sid in last_only:  # one row: the pre-tokenized one, the last turn
            v.incomplete += int(k != 1)
            continue
        complete = sorted(set(ts)) == list(range(k))
        want = expected.get(sid, k)
        _, finish, why = last[sid]
        if complete and k == want:
            continue
        if complete and k < want and (finish == "length" or why):
            ended[why or "length"] += 1
            continue
        v.incomplete += 1
    v.ended_early = dict(ended)
    if served is not None:
        v.requests_logged = served.lines
        v.statuses = dict(served.statuses)
        for key, times in served.completed.items():
            if key not in stored_keys:
                v.answers_not_stored += 1
                v.wasted.append((times[0], key))
            if len(times) > 1:
                v.answered_again += len(times) - 1
                v.again.extend((t, key) for t in times[:-1])
    if export_dir is not None:
        fs, base = open_fs(export_dir)
        infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
        seen: Counter[bytes] = Counter()
        for info in sorted(infos, key=lambda i: i.path):
            if not (info.base_name.startswith("shard-") and info.base_name.endswith(".jsonl")):
                continue
            with fs.open_input_stream(info.path) as f:
                buf = b""
                while chunk := f.read(1 << 22):
                    *lines, buf = (buf + chunk).split(b"\n")
                    for line in lines:
                        if line.strip():
                            rec = json.loads(line)
                            seen[ids_hash(rec["input_ids"], rec["loss_mask"])] += 1
                if buf.strip():
                    rec = json.loads(buf)
                    seen[ids_hash(rec["input_ids"], rec["loss_mask"])] += 1
        v.exported_lines = sum(seen.values())
        for h, n in row_hashes.items():  # n rows of the same tokens (turns may coincide)
            got = seen.get(h, 0)
            v.exported_once += min(got, n)
            v.exported_twice += max(0, got - n)
            v.not_exported += max(0, n - got)
        v.export_extra = sum(n for h, n in seen.items() if h not in row_hashes)
    checks = {
        "input samples with no stored row (lost)": v.lost,
        "stored samples not in the input": v.unexpected,
        "(sample_id, turn) stored more than once (duplicated)": v.duplicated,
        "samples without all their turns": v.incomplete,
        "stored rows no server completed (request logs)": v.unanswered,
        "native rows that differ from their source": v.native_wrong,
        "input counts differ from the generated counts": sum(
            abs(by_source.get(k, 0) - n) for k, n in generated.items()
        ),
        "stored rows not exported exactly once": (v.not_exported + v.exported_twice)
        if export_dir is not None else 0,
        "exported lines that are no stored row": v.export_extra if export_dir else 0,
        "regen verify is not clean": verify_rc not in (0, None),
        "nothing stored": not v.rows,
    }  # fmt: skip
    v.problems = [f"{k} ({val})" for k, val in checks.items() if val]
    return v
