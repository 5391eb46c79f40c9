"""Source rows edited after they were answered, and runs continued with --force (issue 21,
items 5 and 6), through the real CLI against `regen simulate`.

A finished run of the whole demo; then two rows of its sources are edited: an xlam row in
place (xlam's ids are the dataset's own, so the sample keeps its id and its content changes)
and a ShareGPT row (its id hashes the conversation: the edited row is a new sample). The rerun
answers the xlam sample again as a new attempt that supersedes its stale rows and the new
ShareGPT sample; the old ShareGPT answer is stale: kept in its part, not counted, never
exported. `regen status` never shows more done than planned, and `regen verify` is clean.

A run continued with `--force` at another temperature keeps provenance: every regenerated row
records the settings id that made it, `regen status` and `regen export` show the mix with the
field that differs, and `regen export --setting ID` keeps one setting (and the native rows).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from _runs import check_answers, copy_demo, inputs, regen_cmd, stored_rows

from regen.devkit.simulate.testing import running_simulator
from regen.manifest import load_manifest
from regen.store import RunDir, layout

pytestmark = pytest.mark.ray

SIM = {"model_name": "demo-target", "instant": True, "mean_tokens": 24.0}
OVERRIDES = ["-o", "engine.part_size=8", "-o", "engine.workers=1"]


@pytest.fixture(scope="module")
def sim():
    with running_simulator(**SIM) as s:
        yield s


def run(manifest: Path, out: Path, sim, ray_head, env, *extra: str) -> subprocess.CompletedProcess:
    p = subprocess.run(
        regen_cmd("run", str(manifest), "--out", str(out), "--endpoint", sim.url, "--address",
                  ray_head.address, "--no-view", *OVERRIDES, *extra),
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "Traceback" not in p.stdout + p.stderr, p.stderr[-3000:]
    return p


def regen(env, *args: str) -> subprocess.CompletedProcess:
    p = subprocess.run(regen_cmd(*args), env=env, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in p.stdout + p.stderr, p.stderr[-3000:]
    return p


@pytest.fixture(scope="module")
def finished(tmp_path_factory, sim, ray_head, ray_env) -> Path:
    """A finished run of the whole demo: ``BASE/demo.yaml``, its sources, ``BASE/run``."""
    base = tmp_path_factory.mktemp("stale")
    manifest = copy_demo(base)
    p = run(manifest, base / "run", sim, ray_head, ray_env)
    assert p.returncode == 0, p.stderr[-3000:]
    return base


def _edit(path: Path, old: bytes, new: bytes, times: int = 1) -> None:
    data = path.read_bytes()
    assert data.count(old) == times
    path.write_bytes(data.replace(old, new))


def test_an_edited_source_row_is_answered_again_and_its_stale_rows_never_counted_or_exported(
    finished, sim, ray_head, ray_env, tmp_path
) -> None:
    base = tmp_path / "case"
    shutil.copytree(finished, base)
    manifest, out = base / "demo.yaml", base / "run"
    before = {s.id: s for s in inputs(load_manifest(manifest))}
    _edit(base / "demo" / "xlam.jsonl", b"weather in Lisbon", b"weather in Porto")
    _edit(base / "demo" / "sharegpt.jsonl", b"first trip to Paris", b"first trip to Rome")
    native_row = b'"native-0001","input_ids":[1014,749,1020,744,47'
    # (the demo repeats that row, a planted duplicate: both copies edited alike)
    _edit(base / "demo" / "kimi_native.jsonl", native_row + b"2,", native_row + b"3,", times=2)
    after = {s.id: s for s in inputs(load_manifest(manifest))}
    for sid in ("xlam:1", "kimi_native:native-0001"):  # edited in place: same id, new content
        assert sid in after and after[sid].content_hash != before[sid].content_hash
    gone = sorted(set(before) - set(after))  # the ShareGPT row's old id, and what it moved
    assert any(sid.startswith("sharegpt:sg_0001") for sid in gone)

    p = run(manifest, out, sim, ray_head, ray_env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "stale answer" in p.stderr  # one line names them

    st = json.loads(regen(ray_env, "status", str(out), "--json").stdout)
    assert st["done"] == st["total"] == len(after)
    for s in st["sources"]:
        assert s["done"] <= s["total"], s
    assert st["stale"]["done"] == len(gone)

    rows = stored_rows(out)
    for sid in ("xlam:1", "kimi_native:native-0001"):
        got = sorted((r["attempt"], r["content_hash"]) for r in rows if r["sample_id"] == sid)
        assert got == [(0, before[sid].content_hash), (1, after[sid].content_hash)], sid
    native = [r for r in rows if r["sample_id"] == "kimi_native:native-0001" and r["attempt"]]
    assert native[0]["input_ids"] == after["kimi_native:native-0001"].input_ids
    assert check_answers(rows, load_manifest(manifest), SIM) > 0  # the new attempt's seed too

    exp = tmp_path / "export"
    # the simulator's rows are local renders: kept whatever their token check (not the point)
    p = regen(ray_env, "export", str(out), "--out", str(exp), "--format", "conversations",
              "--drop-flags", "none", "--keep-truncated", "--keep-unproven")  # fmt: skip
    assert p.returncode == 0, p.stderr
    ids = Counter(json.loads(line)["id"] for f in sorted(exp.glob("conversations-*.jsonl"))
                  for line in f.read_text().splitlines())  # fmt: skip
    native = {sid for sid, s in after.items() if s.mode == "native"}
    assert set(ids) == set(after) - native and max(ids.values()) == 1  # one answer each
    stats = json.loads((exp / layout.EXPORT_STATS).read_text())
    assert stats["dropped"]["not_planned"] >= len(gone)
    assert stats["dropped"]["superseded"] >= 1  # xlam:1's stale attempt
    tok = tmp_path / "pretokenized"
    p = regen(ray_env, "export", str(out), "--out", str(tok), "--drop-flags", "none",
              "--keep-truncated", "--keep-unproven")  # fmt: skip
    lines = [json.loads(x) for f in sorted(tok.glob("shard-*.jsonl"))
             for x in f.read_text().splitlines()]  # fmt: skip
    ids = [x["input_ids"] for x in lines]
    assert after["kimi_native:native-0001"].input_ids in ids
    assert before["kimi_native:native-0001"].input_ids not in ids

    v = regen(ray_env, "verify", str(out))
    assert v.returncode == 0, v.stdout
    assert "stale answer" in v.stdout

    again = run(manifest, out, sim, ray_head, ray_env)
    assert again.returncode == 0 and "0 this session" in " ".join(again.stdout.split())


def test_force_records_the_settings_of_every_row_and_export_keeps_one(
    sim, ray_head, ray_env, tmp_path
) -> None:
    manifest = copy_demo(tmp_path)
    out = tmp_path / "run"
    # the first setting pinned here, not read from the demo manifest (which may change)
    first = run(manifest, out, sim, ray_head, ray_env, "--limit", "30",
                "-o", "sampling.temperature=0.6")  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]

    refused = run(manifest, out, sim, ray_head, ray_env, "-o", "sampling.temperature=0.7")
    err = " ".join(refused.stderr.split())
    assert refused.returncode == 2
    assert "sampling.temperature 0.6 -> 0.7" in err and "--force" in err

    forced = run(manifest, out, sim, ray_head, ray_env, "-o", "sampling.temperature=0.7",
                 "--force")  # fmt: skip
    assert forced.returncode == 0, forced.stderr[-3000:]
    info = layout.RUN_FILE.read(RunDir.open(out, create=False))
    assert info is not None and len(info.settings) == 2
    old, new = sorted(info.settings, key=lambda k: info.settings[k]["sampling.temperature"])
    temps = [info.settings[k]["sampling.temperature"] for k in (old, new)]
    assert temps == [0.6, 0.7]

    rows = stored_rows(out)
    per = Counter(r["settings"] for r in rows if r["token_source"] != "native")
    assert set(per) == {old, new}  # every regenerated row says which settings made it
    samples = {s: len({r["sample_id"] for r in rows if r["settings"] == s}) for s in per}
    assert samples[old] >= 25 and samples[new] > 0
    assert all(r["settings"] is None for r in rows if r["token_source"] == "native")

    st = json.loads(regen(ray_env, "status", str(out), "--json").stdout)
    assert st["settings"] == samples
    assert st["settings_differ"] == {old: {"sampling.temperature": 0.6},
                                     new: {"sampling.temperature": 0.7}}  # fmt: skip
    text = " ".join(regen(ray_env, "status", str(out)).stdout.split())
    assert f"{old} {samples[old]} samples (sampling.temperature 0.6)" in text

    mixed = regen(ray_env, "export", str(out), "--out", str(tmp_path / "all"), "--keep-unproven")
    assert mixed.returncode == 0 and "mix 2 settings" in mixed.stderr
    one = regen(ray_env, "export", str(out), "--out", str(tmp_path / "one"), "--setting", old,
                "--keep-unproven")  # fmt: skip
    assert one.returncode == 0, one.stderr
    stats = json.loads((tmp_path / "one" / layout.EXPORT_STATS).read_text())
    assert set(stats["settings"]) <= {old, "native"} and stats["settings"][old] > 0
    assert stats["dropped"]["other_setting"] == per[new]
    bad = regen(ray_env, "export", str(out), "--out", str(tmp_path / "x"), "--setting", "nope")
    assert bad.returncode == 2 and old in bad.stderr and new in bad.stderr
