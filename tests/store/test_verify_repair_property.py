"""`regen verify`, then `regen verify --repair`, always ends with a clean `regen verify`, and no
intact row is discarded: a property test over random damage (issue 21, item 5).

One real run directory is made once for the module: the demo manifest (its ten sources, 73
samples) through `regen run` against `regen simulate`, in parts of 8 samples. Each case copies
it (with its sources), applies one to four damages drawn by a seeded generator, and checks:

- `verify` → `verify --repair` → `verify`: the repair's own second check and the next verify
  find no problem (notes, such as stale answers, are allowed);
- no intact row is discarded, no damaged one kept: every part the case did not damage is still
  there with its rows, every complete line of a journal segment is in a part, and a part the
  case damaged is either set aside in quarantine/ or still there with exactly its rows as
  written (garbage can land where no row reads it: a part whose record is also gone then
  proves itself intact by its footer and page checksums);
- the numbers read back: `regen status` is not `unknown`, no source counts more done than
  planned, and the progress file counts what the parts hold.

The damages: a part cut short, garbage in a part (same size), garbage in or deletion of a
part's record, garbage in progress.json, garbage in or deletion of the plan index
(plan/index.json, plan/samples.parquet), a journal segment whose last line is cut (a crash's
leftover: its part was never written), garbage in checks.json, an edited source row (which may
change its sample's id, its content in place, or drop it as unusable).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from _hostile import hostile_value
from _runs import DEMO, read_numbers, regen_cmd
from hypothesis import event, given, settings
from hypothesis import strategies as hs

from regen.devkit.simulate.testing import running_simulator
from regen.plan.index import rebuild
from regen.store import RunDir, layout
from regen.store.completed import CompletedSample
from regen.store.parts import list_parts
from regen.store.verify import verify_run

pytestmark = pytest.mark.ray

#: random damage cases (the issue asks for at least 200 in CI)
CASES = 200
SIM = {"model_name": "demo-target", "instant": True, "mean_tokens": 24.0}
DEAD_SESSION = "20000101T000000-dead00"

Key = tuple[str, int, int]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, ray_head, ray_env) -> Finished:
    """A finished run of the whole demo: ``BASE/demo.yaml``, ``BASE/demo/``, ``BASE/run``,
    and every part's rows as written."""
    base = tmp_path_factory.mktemp("property")
    shutil.copy(DEMO, base / DEMO.name)
    shutil.copytree(DEMO.parent / "demo", base / "demo")
    with running_simulator(**SIM) as sim:
        p = subprocess.run(
            regen_cmd("run", str(base / DEMO.name), "--out", str(base / "run"), "--endpoint",
                      sim.url, "--address", ray_head.address, "--no-view", "-o",
                      "engine.part_size=8", "-o", "engine.workers=1"),
            env=ray_env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rd = RunDir.open(base / "run", create=False)
    states = list_parts(rd)
    assert len(states) >= 8
    assert verify_run(rd).clean
    return Finished(base, {st.stem: part_rows(Path(rd.path(st.part))) for st in states})


@dataclass(frozen=True, slots=True)
class Finished:
    base: Path
    #: every part's rows as written, by stem
    rows: dict[str, list[dict[str, Any]]] = field(repr=False)


class Case:
    """One copy of the finished run and what its damages spared."""

    def __init__(self, finished: Finished, where: Path, rng: random.Random) -> None:
        shutil.copytree(finished.base, where)
        self.root = where / "run"
        self.rd = RunDir.open(self.root, create=False)
        plan = layout.PLAN_FILE.read(self.rd)
        assert plan is not None  # the run moved with its sources: plan/ resolves them here
        layout.PLAN_FILE.write(self.rd, plan.model_copy(update={"manifest_dir": str(where)}))
        self.rng = rng
        self.demo = where / "demo"
        self.parts = sorted(finished.rows)
        #: every part's rows as written (to tell a kept part's rows from changed ones)
        self.rows = finished.rows
        self.spent: set[str] = set()  #: parts a damage took (their rows are not intact)
        self.journal_keys: set[Key] = set()  #: complete journal lines' rows (intact)
        self.done: list[str] = []

    def part(self) -> str | None:
        """A part no other damage took."""
        free = [s for s in self.parts if s not in self.spent]
        return self.rng.choice(free) if free else None

    def path(self, rel: str) -> Path:
        return self.root / rel

    def intact_keys(self) -> set[Key]:
        keys: set[Key] = set(self.journal_keys)
        for stem in self.parts:
            if stem not in self.spent:
                keys |= {key(r) for r in self.rows[stem]}
        return keys


def key(row: dict[str, Any]) -> Key:
    return (row["sample_id"], row["turn"], row["attempt"])


def part_rows(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


def part_keys(path: Path) -> set[Key]:
    t = pq.read_table(path, columns=["sample_id", "turn", "attempt"]).to_pylist()
    return {key(r) for r in t}


def stored_keys(rd: RunDir) -> Counter[Key]:
    keys: Counter[Key] = Counter()
    for st in list_parts(rd):
        keys.update(part_keys(Path(rd.path(st.part))))
    return keys


def garbage(rng: random.Random, n: int | None = None) -> bytes:
    """Bytes a broken disk or a bad copy leaves: random bytes, cut JSON, or JSON of the wrong
    shape."""
    kind = rng.randrange(4)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(n or rng.randrange(1, 200)))
    if kind == 1:
        return b'{"stem": "x", "rows": 3, "sam'
    if kind == 2:
        return json.dumps({"unexpected": [1, 2, 3], "version": 1}).encode()
    return b""


# ---- the damages ---------------------------------------------------------------------------


def cut_part(c: Case) -> None:
    stem = c.part()
    if stem is None:
        return
    p = c.path(layout.part_path(stem))
    data = p.read_bytes()
    p.write_bytes(data[: c.rng.randrange(0, len(data))])
    c.spent.add(stem)
    c.done.append(f"cut {stem}")


def garbage_in_part(c: Case) -> None:
    """Same size, footer intact: only the checksum (record, or the pages' CRCs) sees it."""
    stem = c.part()
    if stem is None:
        return
    p = c.path(layout.part_path(stem))
    data = bytearray(p.read_bytes())
    at = c.rng.randrange(4, max(5, len(data) // 2))
    data[at : at + 16] = bytes(c.rng.randrange(256) for _ in range(16))
    if bytes(data) == p.read_bytes():
        return
    p.write_bytes(bytes(data))
    c.spent.add(stem)
    c.done.append(f"garbage in {stem}")


def garbage_record(c: Case) -> None:
    stem = c.rng.choice(c.parts)
    c.path(layout.part_record_path(stem)).write_bytes(garbage(c.rng))
    c.done.append(f"garbage record {stem}")


def delete_record(c: Case) -> None:
    stem = c.rng.choice(c.parts)
    c.path(layout.part_record_path(stem)).unlink(missing_ok=True)
    c.done.append(f"deleted record {stem}")


def garbage_progress(c: Case) -> None:
    c.path(layout.PROGRESS).write_bytes(garbage(c.rng))
    c.done.append("garbage progress")


def garbage_index(c: Case) -> None:
    rel = c.rng.choice([layout.PLAN_INDEX, layout.PLAN_SAMPLES])
    p = c.path(rel)
    p.parent.mkdir(exist_ok=True)
    if rel == layout.PLAN_SAMPLES and p.exists() and c.rng.random() < 0.5:
        data = bytearray(p.read_bytes())
        at = c.rng.randrange(len(data))
        data[at] ^= 0xFF
        p.write_bytes(bytes(data))
    else:
        p.write_bytes(garbage(c.rng))
    c.done.append(f"garbage {rel}")


def delete_index(c: Case) -> None:
    if c.rng.random() < 0.5:
        c.path(layout.PLAN_INDEX).unlink(missing_ok=True)
        c.done.append("deleted plan index")
    else:
        shutil.rmtree(c.path(layout.PLAN_DIR), ignore_errors=True)
        c.done.append("deleted plan/")


def cut_journal(c: Case) -> None:
    """A part becomes what a crash leaves: its samples as journal lines of a dead session (the
    part never written), the last line cut mid-way."""
    stem = c.part()
    if stem is None:
        return
    rows = pq.read_table(c.path(layout.part_path(stem))).to_pylist()
    by_sample: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_sample.setdefault(r["sample_id"], []).append(r)
    lines = [CompletedSample(sid, rs[0]["source"], rs).to_line() for sid, rs in by_sample.items()]
    cut = c.rng.randrange(1, len(lines[-1]))
    seg = layout.segment_path(f"{DEAD_SESSION}-{len(c.spent):05d}")
    c.path(seg).parent.mkdir(exist_ok=True)
    c.path(seg).write_bytes(b"".join(lines[:-1]) + lines[-1][:cut])
    for sid, rs in list(by_sample.items())[:-1]:
        c.journal_keys |= {(sid, r["turn"], r["attempt"]) for r in rs}
    c.path(layout.part_path(stem)).unlink()
    c.path(layout.part_record_path(stem)).unlink(missing_ok=True)
    c.spent.add(stem)
    c.done.append(f"journal of {stem} cut")


def garbage_checks(c: Case) -> None:
    c.path(layout.CHECKS).write_bytes(garbage(c.rng) or b"{")
    c.done.append("garbage checks")


def edit_source(c: Case) -> None:
    """One usable row of a source file, edited: its first long string value changes (its
    sample's id may change with it, or only its content, or the row may become unusable)."""
    files = sorted(p for p in c.demo.glob("*.jsonl"))
    path = c.rng.choice(files)
    lines = path.read_bytes().split(b"\n")
    for _ in range(20):
        i = c.rng.randrange(len(lines))
        try:
            row = json.loads(lines[i])
        except ValueError:
            continue
        if isinstance(row, dict) and _edit_first_text(row):
            lines[i] = json.dumps(row, ensure_ascii=False).encode()
            path.write_bytes(b"\n".join(lines))
            c.done.append(f"edited {path.name} row {i + 1}")
            return


def _edit_first_text(node: Any) -> bool:
    if isinstance(node, dict):
        return any(_edit_value(node, k) for k in list(node))
    if isinstance(node, list):
        return any(_edit_value(node, i) for i in range(len(node)))
    return False


def _edit_value(node: Any, key: Any) -> bool:
    value = node[key]
    if isinstance(value, str) and len(value) > 12 and not value.startswith(("[", "{")):
        node[key] = value + " (edited)"
        return True
    return _edit_first_text(value)


DAMAGES: dict[str, Callable[[Case], None]] = {
    "cut_part": cut_part,
    "garbage_in_part": garbage_in_part,
    "garbage_record": garbage_record,
    "delete_record": delete_record,
    "garbage_progress": garbage_progress,
    "garbage_index": garbage_index,
    "delete_index": delete_index,
    "cut_journal": cut_journal,
    "garbage_checks": garbage_checks,
    "edit_source": edit_source,
}


def draw(seed: int) -> tuple[random.Random, list[str]]:
    """The damages of case ``seed``: the first len(DAMAGES) cases take one each, alone; the
    others one to four, drawn with repeats."""
    rng = random.Random(seed)
    names = list(DAMAGES)
    if seed < len(names):
        return rng, [names[seed]]
    return rng, [rng.choice(names) for _ in range(rng.randint(1, 4))]


def test_every_damage_kind_is_drawn_alone_and_combined() -> None:
    alone = [draw(s)[1] for s in range(len(DAMAGES))]
    assert sorted(n for (n,) in alone) == sorted(DAMAGES)
    combined = [draw(s)[1] for s in range(len(DAMAGES), CASES)]
    assert {n for names in combined for n in names} == set(DAMAGES)
    assert sum(len(names) > 1 for names in combined) > CASES // 2


@pytest.mark.parametrize("seed", range(CASES))
def test_verify_then_repair_ends_clean_and_keeps_every_intact_row(
    seed: int, finished: Finished, tmp_path: Path
) -> None:
    rng, names = draw(seed)
    c = Case(finished, tmp_path / "case", rng)
    for name in names:
        DAMAGES[name](c)
    intact = c.intact_keys()
    what = f"case {seed}: {'; '.join(c.done)}"

    first = verify_run(c.rd)
    repaired = verify_run(c.rd, repair=True, rebuild_plan=rebuild)
    assert repaired.problems == [], f"{what}: the repair did not converge: {repaired.problems}"
    again = verify_run(c.rd)
    assert again.problems == [], f"{what}: {again.problems} (first: {first.problems})"

    stored = stored_keys(c.rd)
    assert [k for k, n in stored.items() if n > 1] == [], what
    kept_damaged: set[Key] = set()
    for st in list_parts(c.rd):
        if st.stem in c.spent:  # damaged, yet kept: only with every row as it was written
            assert part_rows(Path(c.rd.path(st.part))) == c.rows[st.stem], f"{what}: {st.part}"
            kept_damaged |= {key(r) for r in c.rows[st.stem]}
    assert set(stored) == intact | kept_damaged, (
        f"{what}: lost {sorted(intact - set(stored))[:5]}, "
        f"appeared {sorted(set(stored) - intact - kept_damaged)[:5]}"
    )
    n = read_numbers(c.root)
    assert n.state != "unknown", f"{what}: {n.state_reason}"
    for s in n.sources:
        assert s.done + s.failed <= s.total, f"{what}: {s.name} {s.done}/{s.total}"
    assert n.overall.done + n.overall.stale.done == len({k[0] for k in stored}), what


# ---- the small files as random bytes and random JSON (issue 42, item 2) --------------------

#: files repair rebuilds from the parts (or drops as a crash's leftover): the next verify is clean
REBUILT = ("progress", "checks", "record", "journal", "schedule")
#: files no repair can rebuild: verify --repair names the file in one line for a person
FOR_A_PERSON = {"manifest": layout.MANIFEST, "lock": layout.LOCK}


def small_file(c: Case, which: str) -> Path:
    """The run directory's ``which`` file (a part's record, a journal segment: the first)."""
    if which == "record":
        return c.path(layout.part_record_path(c.parts[0]))
    if which == "journal":
        seg = c.path(layout.segment_path(f"{DEAD_SESSION}-00000"))
        seg.parent.mkdir(exist_ok=True)
        return seg
    names = {"progress": layout.PROGRESS, "checks": layout.CHECKS,
             "schedule": layout.SCHEDULE, **FOR_A_PERSON}  # fmt: skip
    return c.path(names[which])


def cli(*argv: str) -> tuple[int, str, str]:
    """``regen ARGV`` in this process: (exit code, stdout, stderr)."""
    import contextlib
    import io

    from regen.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def one_line_or_ok(rc: int, err: str, what: str) -> None:
    assert "Traceback" not in err, f"{what}: {err}"
    if rc not in (0, 1):
        assert rc == 2 and len(err.strip().splitlines()) == 1, f"{what}: rc {rc}: {err!r}"


@settings(max_examples=40)
@given(
    which=hs.sampled_from([*REBUILT, *FOR_A_PERSON]),
    data=hs.one_of(
        hs.binary(max_size=300),
        hostile_value().map(lambda v: json.dumps(v).encode()),
        hs.sampled_from([b"", b"{", b"null", b"[]", b'{"version": 99}']),
    ),
)
def test_small_files_as_random_bytes_and_json(
    finished: Finished, tmp_path_factory: pytest.TempPathFactory, which: str, data: bytes
) -> None:
    """Each small file of the run directory replaced by random bytes or JSON: ``verify``
    reports; ``status`` and ``monitor --once`` say it in one line or show the run; ``verify
    --repair`` rebuilds what the parts hold and then checks clean, or names in one line the file
    no repair can rebuild (the manifest: exit 1; the lock, which it would take: exit 2, before
    touching anything) and leaves it for a person to decide."""
    c = Case(finished, tmp_path_factory.mktemp("small") / "case", random.Random(0))
    path = small_file(c, which)
    if which == "journal":
        path.write_bytes(b"\n".join([data, data]))
    else:
        path.write_bytes(data)
    what = f"{which} = {data[:60]!r}"
    root = str(c.root)
    for argv in (("verify", root), ("status", root), ("monitor", root, "--once")):
        rc, _, err = cli(*argv)
        one_line_or_ok(rc, err, f"{what}: {argv[0]}")
    rc, out, err = cli("verify", root, "--repair")
    one_line_or_ok(rc, err, f"{what}: verify --repair")
    event(f"{which}: repair exit {rc}")
    if which in FOR_A_PERSON:  # never a record, whatever the bytes: left for a person
        assert rc == (2 if which == "lock" else 1), f"{what}: verify --repair: rc {rc}: {out}"
        named = [line for line in (err + out).splitlines() if FOR_A_PERSON[which] in line]
        assert named and all("a person decides" in line for line in named), f"{what}: {named}"
        assert cli("verify", root)[0] == 1, what
        return
    assert rc == 0, f"{what}: verify --repair: rc {rc}: {out[-800:]} {err[-400:]}"
    assert cli("verify", root)[0] == 0, what
