"""Bad input end to end through `regen run`: each fault gives a clear error naming where and
what, and nothing else is lost.

Already covered elsewhere (not repeated here, see docs/guarantees.md): per-row rejections of
every adapter (tests/sources), manifest field errors at load (tests/test_manifest.py), the
fingerprint refusal with and without --force and a lock held by a live pid
(tests/engine/test_crash_resume.py), a half-written part on ENOSPC in the store
(tests/store/test_journal.py), endpoints dropped or all unusable (tests/client/test_endpoints.py).
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from _quota_fs import QuotaDisk
from _reliability import chaos

from regen.cli.main import main as regen_main
from regen.core.errors import RunDirError
from regen.devkit.procs import kill_group
from regen.devkit.simulate.testing import running_simulator, simulator_in_thread
from regen.engine import RunOptions, run_job
from regen.manifest import load_manifest
from regen.store import RunDir
from regen.store import parts as jn
from regen.store.doneset import read_done
from regen.store.failures import read_failures
from regen.store.layout import LOCK as LOCK_FILE
from regen.store.layout import PROGRESS_FILE
from regen.store.segments import read_journal_lines

pytestmark = pytest.mark.ray

CONTEXT = 4000  #: the simulator's context length (tokens)
SIM = {"model_name": chaos.MODEL, "instant": True, "mean_tokens": 16, "context_length": CONTEXT}
GOOD = 12
DISK_SAMPLES = 40
DISK_BYTES = 60_000  #: the quota disk's size: it fills up part-way through DISK_SAMPLES
#: (line content, expected words in the warning) — lines 2.. of the source file
BAD_ROWS: list[tuple[bytes, str]] = [
    (b'{"id": "j", "conversations": [', "row 2: malformed_json"),
    (b'{"id": "m"}', "row 3 field 'conversations': missing_field"),
    (b'{"id": "e", "conversations": [{"from": "human", "value": "   "}]}', "row 4: empty_prompt"),
    (b'{"id": "n", "conversations": [{"from": "gpt", "value": "hi"}]}', "row 5: no_user_turn"),
    (
        b'{"id": "r", "conversations": [{"from": "alien", "value": "x"}]}',
        "row 6 field 'conversations[0].from': unknown_role",
    ),
    (
        b'{"id": "u", "conversations": [{"from": "human", "value": "caf\xe9"}]}',
        "row 7: invalid_utf8",
    ),
    (  # a lone surrogate escape (scraped ShareGPT dumps hold them): no encoder takes it
        b'{"id": "s", "conversations": [{"from": "human", "value": "bad \\ud800 text"}]}',
        "row 8 field 'conversations[0].value': invalid_unicode (lone surrogate U+D800)",
    ),
    (
        b'{"id": "\\udfff", "conversations": [{"from": "human", "value": "fine"}]}',
        "row 9 field 'id': invalid_unicode (lone surrogate U+DFFF)",
    ),
]
HUGE_ID, LONG_ID = "sharegpt:huge", "sharegpt:long"


def upstream(sample_id: str) -> str:
    """The id without the content-hash suffix that non-unique upstream ids carry."""
    return sample_id.split("#", 1)[0]


def human(i: int | str, text: str) -> bytes:
    row = {"id": str(i), "conversations": [{"from": "human", "value": text}]}
    return json.dumps(row).encode()


def write_bad_source(path: Path) -> Path:
    """Row 1 good, rows 2-9 bad, a 10 MB prompt, a prompt over the context, then good rows."""
    lines = [human("g0", "Good question zero?")] + [line for line, _ in BAD_ROWS]
    lines.append(human("huge", "lorem ipsum " * (10 * 1024 * 1024 // 12)))  # ~10 MB
    lines.append(human("long", "word " * (CONTEXT * 2)))  # over the context, well under 10 MB
    lines += [human(f"g{i}", f"Good question {i}?") for i in range(1, GOOD)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.fixture(scope="module")
def sim():
    with running_simulator(**SIM) as s:
        yield s


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory, sim, ray_head, ray_env) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("bad")
    src = write_bad_source(work / "source.jsonl")
    manifest = chaos.write_manifest(work / "manifest.yaml", src, engine={"workers": 1})
    out = work / "run"
    r = subprocess.run(chaos.regen_cmd(manifest, out, sim.url, ray_head.address), env=ray_env,
                       capture_output=True, text=True, timeout=240)  # fmt: skip
    return {"r": r, "out": out, "rd": RunDir.open(out), "manifest": manifest}


def test_every_bad_row_is_named_with_source_row_and_field(bad_run) -> None:
    r = bad_run["r"]
    assert r.returncode == 0, r.stderr[-3000:]
    err = " ".join(r.stderr.split())
    for _, words in BAD_ROWS:
        assert f"skipping source 'sharegpt' {words}" in err
    assert f"source sharegpt: {len(BAD_ROWS)} row(s) skipped as unusable" in err


def test_prompts_over_the_context_are_recorded_permanent_failures(bad_run) -> None:
    fails = read_failures(bad_run["rd"])
    assert sorted(upstream(k) for k in fails) == [HUGE_ID, LONG_ID]
    for f in fails.values():
        # SGLang answers a plain 400 (no structured code): permanent, decided by status
        assert (f.status, f.kind, f.permanent, f.attempts) == (400, "permanent", True, 1)
        assert "longer than the model's context length" in f.message
    assert "2 failed permanently" in " ".join(bad_run["r"].stdout.split())


def test_nothing_else_is_lost(bad_run) -> None:
    done = read_done(bad_run["rd"]).ids
    assert len(done) == GOOD
    assert {upstream(i) for i in done} == {f"sharegpt:g{i}" for i in range(GOOD)}
    v = chaos.verify(bad_run["manifest"], bad_run["out"], chaos.answer_config(SIM))
    assert v.duplicates == 0 and v.answers_wrong == 0 and v.answers_checked == GOOD
    assert v.missing == 2  # exactly the two permanent failures
    assert sum(p.stat().st_size for p in (bad_run["out"] / "parts").glob("*")) < 1_000_000


def test_plan_run_status_and_export_agree_on_the_skipped_rows(bad_run, tmp_path, capsys):
    """One rule for unusable text everywhere: the rows `regen plan` skips are the rows the run
    never planned, `regen status` counts the same total, export holds exactly what is done."""
    assert regen_main(["plan", str(bad_run["manifest"]), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["sources"]["sharegpt"]
    assert plan["rejected"]["invalid_unicode"] == 2
    assert plan["rejected_total"] == len(BAD_ROWS) and plan["kept"] == GOOD + 2
    assert regen_main(["status", str(bad_run["out"]), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["total"], status["done"], status["failed"]) == (GOOD + 2, GOOD, 2)
    from regen.export import ExportSettings, export_run

    # the simulator's rows are local renders: kept whatever their token check (not the point)
    stats = export_run(
        RunDir.open(bad_run["out"], create=False),
        str(tmp_path / "export"),
        ExportSettings.build(keep_unproven=True),
    )
    assert stats.rows_written == GOOD  # one turn per good sample


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        ({"engine": {"workerz": 2}}, "engine.workerz: unknown key"),
        ({"sampling": {"max_tokens": "lots"}}, "sampling.max_tokens: Input should be a valid"),
        ({"dup": True}, "duplicate source name 'sharegpt'"),
    ],
    ids=["unknown-key", "wrong-type", "duplicate-source"],
)
def test_bad_manifest_refused_by_regen_run(tmp_path, capsys, change, expect) -> None:
    src = chaos.write_sharegpt(tmp_path / "s.jsonl", 2)
    path = chaos.write_manifest(tmp_path / "m.yaml", src)
    data = yaml.safe_load(path.read_text())
    if change.pop("dup", False):
        data["sources"].append(dict(data["sources"][0]))
    for k, v in change.items():
        data[k] = {**data.get(k, {}), **v}
    path.write_text(yaml.safe_dump(data))
    rc = regen_main(["run", str(path), "--out", str(tmp_path / "run"), "--no-view"])
    err = capsys.readouterr().err
    assert rc == 2
    assert expect in " ".join(err.split()) and str(path) in " ".join(err.split())
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_wrong_model_and_unreachable_endpoint_refused_then_nothing_lost(
    tmp_path, capsys, sim, ray_head
) -> None:
    src = chaos.write_sharegpt(tmp_path / "s.jsonl", 6)
    path = chaos.write_manifest(tmp_path / "m.yaml", src, engine={"workers": 1})
    out = str(tmp_path / "run")
    dead = f"http://127.0.0.1:{chaos.free_port()}/v1"
    base = ["run", str(path), "--out", out, "--no-view", "--address", ray_head.address]

    rc = regen_main([*base, "--endpoint", dead])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and f"{dead}: unreachable" in err and "no usable endpoint" in err

    other = ["run", str(path), "--out", str(tmp_path / "run2"), "--no-view"]
    rc = regen_main([*other, "--endpoint", sim.url, "-o", "target.model=not-served"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2
    assert f"does not serve model 'not-served' (it serves: '{chaos.MODEL}')" in err

    rd = RunDir.open(out)
    assert rd.list("failures") == [] and read_done(rd).ids == set()  # no sample spent
    assert not rd.exists(LOCK_FILE)
    rc = regen_main([*base, "--endpoint", sim.url])
    assert rc == 0
    assert len(read_done(rd).ids) == 6


def test_second_run_on_a_live_run_directory_is_refused(tmp_path, ray_head, ray_env) -> None:
    src = chaos.write_sharegpt(tmp_path / "s.jsonl", 24)
    path = chaos.write_manifest(tmp_path / "m.yaml", src, engine={"workers": 1, "concurrency": 2})
    out = tmp_path / "run"
    with simulator_in_thread(model_name=chaos.MODEL, max_running_requests=2, step_ms=20,
                             mean_tokens=24) as slow:  # fmt: skip
        cmd = chaos.regen_cmd(path, out, slow.url, ray_head.address)
        with (tmp_path / "first.log").open("wb") as log:
            first = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ray_env,
                                     start_new_session=True)  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while not (out / LOCK_FILE).exists() and time.monotonic() < deadline:
                assert first.poll() is None, (tmp_path / "first.log").read_text()[-2000:]
                time.sleep(0.1)
            second = subprocess.run(cmd, env=ray_env, capture_output=True, text=True, timeout=120)
            assert first.poll() is None  # the refusal happened while the first one ran
            assert second.returncode == 2
            err = " ".join(second.stderr.split())
            assert "is locked by a live run" in err and f"pid {first.pid}" in err
            assert first.wait(timeout=180) == 0
        finally:
            if first.poll() is None:
                kill_group(first, 30)
    assert len(read_done(RunDir.open(out)).ids) == 24  # the first run lost nothing


def _free_when_full(disk: QuotaDisk, after_s: float) -> threading.Thread:
    """A thread that gives the disk its space back ``after_s`` after its first refusal (at
    most 240 s of looking)."""

    def run() -> None:
        for _ in range(4800):
            if disk.full_errors:
                break
            time.sleep(0.05)
        time.sleep(after_s)
        disk.capacity = 10**10

    t = threading.Thread(target=run, name="free-the-disk", daemon=True)
    t.start()
    return t


def _no_leftovers(rd: RunDir, out: Path) -> None:
    """No temporary part left, and every part there whole (not the _*.json records)."""
    assert [n for n in rd.list("parts", include_temp=True) if n.startswith(".tmp-")] == []
    for part in rd.list("parts"):
        if not part.startswith("_"):
            assert pq.read_table(out / "parts" / part).num_rows >= 1


def test_disk_full_mid_run_is_a_pause_and_the_run_finishes_once_space_is_back(
    tmp_path, ray_head
) -> None:
    """A real size limit (a quota filesystem under the run directory) that frees up within
    engine.disk_full_wait_s: whichever write hits it (journal line, part, progress.json), the
    session holds the answers in memory, says so once (the dashboard's ``disk_full``), retries,
    and finishes (exit 0) with every sample stored once, in one session."""
    src = chaos.write_sharegpt(tmp_path / "s.jsonl", DISK_SAMPLES)
    engine = {"workers": 1, "part_size": 8, "part_interval_s": 60}
    path = chaos.write_manifest(tmp_path / "m.yaml", src, engine=engine)
    m = load_manifest(path)
    out = tmp_path / "run"
    disk = QuotaDisk(tmp_path / "disk", DISK_BYTES)
    with simulator_in_thread(**SIM) as s:
        opts = RunOptions(endpoints=[s.url], address=ray_head.address, handle_signals=False)
        freer = _free_when_full(disk, 1.0)
        summary = run_job(m, disk.rundir(out), opts)
        freer.join(timeout=10)
    assert disk.full_errors >= 1  # it did fill up
    assert summary.state == "finished" and summary.done == DISK_SAMPLES
    assert summary.completed_now == DISK_SAMPLES  # no second session
    rd = RunDir.open(out)
    _no_leftovers(rd, out)
    assert rd.list("journal") == []
    snap = PROGRESS_FILE.read(rd)
    assert snap is not None and snap.errors["disk_full"].count == 1  # said once
    assert "No space left on device" in snap.errors["disk_full"].last_message
    v = chaos.verify(path, out, chaos.answer_config(SIM))
    assert v.problems == [] and v.stored == DISK_SAMPLES and v.duplicates == 0


def test_disk_full_past_the_wait_stops_then_resume_once_space_is_back(tmp_path, ray_head) -> None:
    """The same disk that stays full past engine.disk_full_wait_s: the session stops with one
    RunDirError (exit 2), leaves no half-written part, and a rerun with space back stores
    every sample once."""
    src = chaos.write_sharegpt(tmp_path / "s.jsonl", DISK_SAMPLES)
    engine = {"workers": 1, "part_size": 8, "part_interval_s": 60, "disk_full_wait_s": 1}
    path = chaos.write_manifest(tmp_path / "m.yaml", src, engine=engine)
    m = load_manifest(path)
    out = tmp_path / "run"
    disk = QuotaDisk(tmp_path / "disk", DISK_BYTES)
    with simulator_in_thread(**SIM) as s:
        opts = RunOptions(endpoints=[s.url], address=ray_head.address, handle_signals=False)
        with pytest.raises(RunDirError, match=r"cannot .*No space left on device"):
            run_job(m, disk.rundir(out), opts)  # the run directory on the small disk
        assert disk.full_errors >= 2  # refused, retried, refused
        rd = RunDir.open(out)
        _no_leftovers(rd, out)
        stored = read_done(rd).ids | {c.sample_id for c in read_journal_lines(rd)}
        assert 0 < len(stored) < DISK_SAMPLES  # it filled up mid-run
        assert not rd.exists(LOCK_FILE)

        disk.capacity = 10**10  # space is back
        summary = run_job(m, disk.rundir(out), opts)
    assert summary.state == "finished" and summary.done == DISK_SAMPLES
    v = chaos.verify(path, out, chaos.answer_config(SIM))
    assert v.problems == []


def test_disk_full_while_writing_a_part_is_retried_in_the_same_session(
    tmp_path, monkeypatch, ray_head
) -> None:
    """ENOSPC injected into the Parquet writer itself after one good part, twice (half a part
    written each time): nothing half-written is left, the part is written again from memory,
    and the session finishes."""
    src = chaos.write_sharegpt(tmp_path / "s.jsonl", 40)
    engine = {"workers": 1, "part_size": 10, "part_interval_s": 60}
    path = chaos.write_manifest(tmp_path / "m.yaml", src, engine=engine)
    m = load_manifest(path)
    out = tmp_path / "run"
    real = jn.pq.write_table
    calls = {"n": 0, "refused": 0}

    def full_after_one(table, where, **kw):
        if "input_ids" not in table.column_names:  # not a part (the plan index)
            return real(table, where, **kw)
        calls["n"] += 1
        if calls["n"] not in (2, 3):
            return real(table, where, **kw)
        calls["refused"] += 1
        where.write(b"PAR1 half a part")
        raise OSError(errno.ENOSPC, "No space left on device")

    with simulator_in_thread(**SIM) as s:
        opts = RunOptions(endpoints=[s.url], address=ray_head.address, handle_signals=False)
        monkeypatch.setattr(jn.pq, "write_table", full_after_one)
        summary = run_job(m, RunDir.open(out, create=False), opts)
    assert calls["refused"] == 2
    assert summary.state == "finished" and summary.done == 40 and summary.completed_now == 40
    rd = RunDir.open(out)
    _no_leftovers(rd, out)
    assert not rd.exists(LOCK_FILE)
    v = chaos.verify(path, out, chaos.answer_config(SIM))
    assert v.problems == [] and v.duplicates == 0


KILL_IN_PAUSE = """
import logging, sys
from pathlib import Path
sys.path.insert(0, {here!r})
from _quota_fs import QuotaDisk
from regen.engine import RunOptions, run_job
from regen.manifest import load_manifest

logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
manifest, out, root, size, url, address = sys.argv[1:]
disk = QuotaDisk(Path(root), int(size))
opts = RunOptions(endpoints=[url], address=address, handle_signals=False)
run_job(load_manifest(manifest), disk.rundir(Path(out)), opts)
"""


def test_sigkill_during_the_disk_full_pause_loses_only_what_was_in_flight(
    tmp_path, ray_head, ray_env
) -> None:
    """`regen run`'s driver SIGKILLed while the disk is full (answers held in memory, the
    segment sealed): the rerun, with space, folds the segment's whole lines, requests the
    rest again and stores every sample once."""
    src = chaos.write_sharegpt(tmp_path / "s.jsonl", DISK_SAMPLES)
    engine = {"workers": 1, "part_size": 8, "part_interval_s": 60}
    path = chaos.write_manifest(tmp_path / "m.yaml", src, engine=engine)
    out = tmp_path / "run"
    script = tmp_path / "run_on_small_disk.py"
    script.write_text(KILL_IN_PAUSE.format(here=str(Path(__file__).parent)), encoding="utf-8")
    with simulator_in_thread(**SIM) as s:
        argv = [sys.executable, str(script), str(path), str(out), str(tmp_path / "disk"),
                str(DISK_BYTES), s.url, ray_head.address]  # fmt: skip
        proc = subprocess.Popen(argv, env=ray_env, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip
        said: list[str] = []
        try:
            assert proc.stderr is not None
            for line in proc.stderr:  # ends when it exits (it must not: the disk stays full)
                said.append(line)
                if "the disk is full" in line:
                    break
            assert any("the disk is full" in x for x in said), "".join(said)[-3000:]
            time.sleep(1.0)  # more answers held in memory meanwhile
            assert proc.poll() is None  # paused, not stopped
        finally:
            kill_group(proc)
            proc.communicate(timeout=30)  # its pipe closed
        rd = RunDir.open(out)
        before = read_done(rd).ids | {c.sample_id for c in read_journal_lines(rd)}
        assert 0 < len(before) < DISK_SAMPLES
        m = load_manifest(path)
        opts = RunOptions(endpoints=[s.url], address=ray_head.address, handle_signals=False)
        summary = run_job(m, RunDir.open(out), opts)  # space: the real disk
    assert summary.state == "finished" and summary.done == DISK_SAMPLES
    v = chaos.verify(path, out, chaos.answer_config(SIM))
    assert v.problems == [] and v.stored == DISK_SAMPLES and v.duplicates == 0
