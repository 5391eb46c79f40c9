"""A REAL demo run directory (engine + simulator + Ray) exported and fed to SpecForge.

``regen run manifests/demo.yaml`` against ``regen simulate`` on the shared local Ray head, then
``regen export``, then SpecForge 0.2.0's own ``prepare_prompt_tasks``: every exported row is
accepted with its mask unchanged and native rows come out byte-identical to the bundled file.
The simulator tokenizes with the demo's tiny tokenizer. By default (``sampling.token_ids:
stream``) every regenerated row must be a ``server`` row holding the ids streamed through
SGLang's ``sglext``, and its local render must match them exactly; a second run with
``-o sampling.token_ids=local`` renders locally: every local row's length must agree with the
server's completion_tokens (same tokenizer), and rows with tool calls are flagged
``tool_calls_rebuilt`` (a rebuilt section cannot be proven equal).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from regen.cli.main import main as regen_main
from regen.devkit.simulate.testing import running_simulator

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "manifests" / "demo.yaml"
TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"
NATIVE = REPO / "manifests" / "demo" / "kimi_native.jsonl"
#: bound on one `regen run` of the demo (Ray workers start, ~100 requests)
RUN_TIMEOUT_S = 240


def _regen_run(out: Path, sim_url: str, address: str, env: dict[str, str], *extra: str) -> None:
    cmd = [sys.executable, "-m", "regen", "--log-level", "WARNING", "run", str(DEMO),
           "--out", str(out), "--endpoint", sim_url, "--address", address,
           "--workers", "1", "--concurrency", "8", *extra]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [r for p in sorted((run_dir / "parts").glob("*.parquet"))
            for r in pq.read_table(p).to_pylist()]  # fmt: skip


def _export(run_dir: Path, out: Path) -> tuple[dict[str, Any], list[str]]:
    """Every row (the demo manifest drops flagged and truncated rows like a real run; this
    contract is about the rows themselves)."""
    argv = ["export", str(run_dir), "--out", str(out), "--shard-rows", "0",
            "--drop-flags", "none", "--keep-truncated"]  # fmt: skip
    assert regen_main(argv) == 0
    stats = json.loads((out / "stats.json").read_text())
    return stats, (out / "shard-00000.jsonl").read_text().splitlines()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ray_head, ray_env) -> Iterator[dict[str, Path]]:
    tmp = tmp_path_factory.mktemp("demo-contract")
    with running_simulator(
        model_name="demo-target", instant=True, mean_tokens=24, tokenizer=str(TOKENIZER)
    ) as sim:
        _regen_run(tmp / "local", sim.url, ray_head.address, ray_env,
                   "-o", "sampling.token_ids=local")  # fmt: skip
        _regen_run(tmp / "server", sim.url, ray_head.address, ray_env)
    yield {"local": tmp / "local", "server": tmp / "server", "tmp": tmp}


@pytest.mark.parametrize("kind", ["local", "server"])
def test_specforge_accepts_every_exported_row_with_masks_unchanged(
    runs: dict[str, Path], kind: str
) -> None:
    from regen.train.preflight import prompt_tasks

    stats, lines = _export(runs[kind], runs["tmp"] / f"export-{kind}")
    rows = _rows(runs[kind])
    assert stats["rows_read"] == len(rows) and stats["rows_written"] == len(lines) > 60
    tasks = prompt_tasks(runs["tmp"] / f"export-{kind}" / "shard-00000.jsonl",
                         max_length=1_000_000)  # fmt: skip
    assert len(tasks) == len(lines)  # 100 % accepted
    for task, line in zip(tasks, lines, strict=True):
        assert task["payload"] == json.loads(line)  # ids and masks unchanged
    # every exported row is one stored row, mask for mask
    stored = Counter(
        json.dumps({"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]},
                   separators=(",", ":"))
        for r in rows
    )  # fmt: skip
    assert all(stored[line] for line in lines)


def test_native_rows_are_byte_identical_to_the_bundled_file(runs: dict[str, Path]) -> None:
    _, lines = _export(runs["local"], runs["tmp"] / "export-native")
    out = set(lines)
    source = {}
    for raw in NATIVE.read_text().splitlines():
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "id" in rec:
            source.setdefault(str(rec["id"]), raw)
    natives = [r for r in _rows(runs["local"]) if r["token_source"] == "native"]
    trained = [r for r in natives if r["loss_tokens"] > 0]
    assert len(trained) >= 4
    for r in trained:
        raw = source[r["sample_id"].split(":", 1)[1]]
        ids_text = raw.split('"input_ids":', 1)[1].split("]", 1)[0] + "]"
        mask_text = raw.split('"loss_mask":', 1)[1].split("]", 1)[0] + "]"
        line = f'{{"input_ids":{ids_text.strip()},"loss_mask":{mask_text.strip()}}}'
        assert line in out, r["sample_id"]


def test_streamed_runs_store_the_servers_exact_ids(runs: dict[str, Path]) -> None:
    rows = [r for r in _rows(runs["server"]) if r["token_source"] != "native"]
    assert len(rows) > 60
    assert Counter(r["token_source"] for r in rows) == {"server": len(rows)}
    assert Counter(r["token_check"] for r in rows) == {"match": len(rows)}
    assert all(r["ttft_s"] is not None for r in rows)  # streamed: the TTFT signal is kept


def test_local_rows_agree_with_the_server_token_count(runs: dict[str, Path]) -> None:
    """The simulator tokenizes with the demo tokenizer: a faithful local render has the
    server's completion_tokens (count_match), and export reports no token-check problem."""
    rows = [r for r in _rows(runs["local"]) if r["token_source"] != "native"]
    assert len(rows) > 60
    calls = sum(1 for r in rows if json.loads(r["tool_calls"]))
    assert 0 < calls < len(rows)
    want = {"count_match": len(rows) - calls, "tool_calls_rebuilt": calls}
    assert Counter(r["token_check"] for r in rows) == want
    assert all(r["token_source"] == "local" for r in rows)
    stats, _ = _export(runs["local"], runs["tmp"] / "export-counts")
    assert stats["token_check"] == want
    assert stats["token_check_problems"] == calls  # counted, never trained on silently
