"""Storage damage to a finished run directory (issue 13 acceptance), through the real CLI.

A run of the demo against the simulator finishes; copies of it are damaged four ways: a part
cut short, a part deleted, garbage written into a part (same size), a journal segment whose
last line is cut (a crash's leftover: its part was never written). After each, `regen verify`
exits 1 naming the damaged file and `regen status` no longer counts the samples of a part cut
or gone (seen from one listing; garbage of the same size needs the checksum). With all four
at once (one run, to keep the suite short), `regen run` names each damaged part in one
warning, quarantines it, requests its samples again and finishes: the crash checks pass (ids
equal the input, no duplicate, every answer byte-for-byte the simulator's), `regen verify` is
clean, and no traceback is printed anywhere.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from _runs import DEMO, check_answers, check_ids_once, inputs, regen_cmd, stored_rows

from regen.cli.main import main as regen_main
from regen.devkit.simulate.testing import running_simulator
from regen.manifest import load_manifest
from regen.store import RunDir, layout
from regen.store.completed import CompletedSample
from regen.store.parts import list_parts

pytestmark = pytest.mark.ray

LIMIT = 30
OVERRIDES = ["-o", "engine.part_size=4", "-o", "engine.workers=1"]
SIM = {"model_name": "demo-target", "instant": True, "mean_tokens": 24.0}


def run_cmd(out: Path, url: str, address: str) -> list[str]:
    return regen_cmd("run", str(DEMO), "--out", str(out), "--endpoint", url, "--address",
                     address, "--no-view", "--limit", str(LIMIT), *OVERRIDES)  # fmt: skip


def cli(args: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in p.stdout + p.stderr, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def _drop_log_handlers() -> None:
    for h in list(logging.root.handlers):
        logging.root.removeHandler(h)


@pytest.fixture(autouse=True)
def _no_stale_log_handlers():
    """An in-process CLI binds the root logger to a test's captured stderr, closed after that
    test: unbind it before and after (another module's test may have left one)."""
    _drop_log_handlers()
    yield
    _drop_log_handlers()


@pytest.fixture(scope="module")
def sim():
    with running_simulator(**SIM) as s:
        yield s


@pytest.fixture(scope="module")
def finished(tmp_path_factory, sim, ray_head, ray_env) -> Path:
    out = tmp_path_factory.mktemp("damage") / "run"
    p = cli(run_cmd(out, sim.url, ray_head.address), ray_env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert len(list_parts(RunDir.open(out))) >= 3
    return out


def _part(rd: RunDir, k: int) -> Path:
    return Path(rd.path(list_parts(rd)[k].part))


def cut_short(rd: RunDir) -> str:
    p = _part(rd, 0)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    return str(p.relative_to(rd.root))


def delete(rd: RunDir) -> str:
    p = _part(rd, 1)
    p.unlink()
    return str(p.relative_to(rd.root))


def garbage(rd: RunDir) -> str:
    p = _part(rd, 2)
    data = bytearray(p.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = b"\xde\xad\xbe\xef" * 16  # same size, footer intact
    p.write_bytes(bytes(data))
    return str(p.relative_to(rd.root))


def cut_journal(rd: RunDir) -> str:
    """The last part becomes what a crash leaves: its samples as journal lines of a dead
    session (the part never written), the last line cut mid-way."""
    st = list_parts(rd)[-1]
    import pyarrow.parquet as pq

    rows = pq.read_table(rd.path(st.part)).to_pylist()
    by_sample: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_sample.setdefault(r["sample_id"], []).append(r)
    lines = b"".join(CompletedSample(sid, rs[0]["source"], rs).to_line()
                     for sid, rs in by_sample.items())  # fmt: skip
    seg = layout.segment_path("20000101T000000-dead00-00000")
    rd.write_bytes_atomic(seg, lines[:-40])  # the last line cut 40 bytes short
    rd.delete(st.part)
    rd.delete(layout.part_record_path(st.stem))
    return seg


DAMAGES = {"cut_short": cut_short, "deleted": delete, "garbage": garbage,
           "journal_cut": cut_journal}  # fmt: skip


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_verify_names_each_damage_and_status_does_not_count_it(
    damage, finished, tmp_path, capsys
) -> None:
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    total = len(inputs(load_manifest(DEMO), LIMIT))
    damaged = DAMAGES[damage](RunDir.open(out))

    def regen(*args: str) -> tuple[int, str]:
        rc = regen_main(["--log-level", "WARNING", *args])
        got = capsys.readouterr()
        assert "Traceback" not in got.out + got.err
        return rc, got.out

    rc, text = regen("verify", str(out))
    assert rc == 1, text
    assert damaged in text  # the damaged file is named
    rc, text = regen("verify", str(out), "--json")
    js = json.loads(text)
    assert rc == 1 and not js["clean"] and any(p["path"] == damaged for p in js["problems"])

    st = json.loads(regen("status", str(out), "--json")[1])
    if damage in ("cut_short", "deleted"):  # seen from one listing: size or file gone
        assert st["done"] < total and damaged in st["damaged"][0], st["damaged"]
    else:  # same-size garbage needs the checksum (verify, resume); journal lines are kept
        assert st["done"] <= total


def test_run_repairs_every_damage_and_finishes(finished, sim, ray_head, ray_env, tmp_path) -> None:
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    rd = RunDir.open(out)
    damaged = {name: fn(rd) for name, fn in DAMAGES.items()}

    run = cli(run_cmd(out, sim.url, ray_head.address), ray_env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    moved = rd.list(layout.QUARANTINE_DIR)
    for name in ("cut_short", "deleted", "garbage"):
        part = damaged[name]
        assert run.stderr.count(part) == 1, run.stderr  # one warning names it
        stem = layout.part_stem(Path(part).name)
        assert Path(layout.quarantine_path(layout.part_record_path(stem))).name in moved
        if name != "deleted":
            assert Path(layout.quarantine_path(part)).name in moved
    manifest = load_manifest(DEMO, [o for o in OVERRIDES if o != "-o"])
    rows = stored_rows(out)
    check_ids_once(rows, inputs(manifest, LIMIT))
    assert check_answers(rows, manifest, SIM) > 0
    again = cli(regen_cmd("verify", str(out)), ray_env)
    assert again.returncode == 0, again.stdout
    st = json.loads(cli(regen_cmd("status", str(out), "--json"), ray_env).stdout)
    assert st["done"] == st["total"] == len(inputs(manifest, LIMIT)) and st["damaged"] == []


def test_train_refuses_a_damaged_directory(finished, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    damaged = cut_short(RunDir.open(out))
    rc = regen_main(["train", str(out), "--config", str(DEMO.parent / "demo-train.yaml"),
                     "--dry-run"])  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and damaged in err and "regen verify" in err and "training refused" in err
    assert not (out / layout.TRAIN_DIR).exists()


def test_export_refuses_a_damaged_directory_until_repaired(finished, tmp_path, ray_env) -> None:
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    damaged = cut_short(RunDir.open(out))
    p = cli(regen_cmd("export", str(out), "--out", str(tmp_path / "exp")), ray_env)
    assert p.returncode == 2
    assert damaged in p.stderr and "regen verify" in p.stderr and "--repair" in p.stderr
    assert not (tmp_path / "exp").exists() or not list((tmp_path / "exp").iterdir())
    fixed = cli(regen_cmd("verify", str(out), "--repair"), ray_env)
    assert fixed.returncode == 0, fixed.stdout
    assert "quarantine" in fixed.stdout
    p = cli(regen_cmd("export", str(out), "--out", str(tmp_path / "exp")), ray_env)
    assert p.returncode == 0, p.stderr
