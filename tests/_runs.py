"""Helpers shared by the tests that run `regen run` for real and check the data it stored
(the crash checks: ids equal the input, no duplicate (sample_id, turn, attempt), every answer
byte-for-byte the simulator's for the seed its attempt sent)."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from regen.core.result import LOOP
from regen.devkit.simulate import answer
from regen.manifest import Manifest
from regen.plan.attempts import attempt_seed
from regen.plan.index import native_check
from regen.sources import read_samples, source_set
from regen.status import RunNumbers, RunView
from regen.store import RunDir, layout

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "manifests" / "demo.yaml"
REGEN = Path(sys.executable).with_name("regen")


def copy_demo(tmp: Path) -> Path:
    """A copy of the demo manifest and its files under ``tmp`` (a test may change them)."""
    import shutil

    shutil.copy(DEMO, tmp / DEMO.name)
    shutil.copytree(DEMO.parent / "demo", tmp / "demo")
    return tmp / DEMO.name


def sim_answer_config(options: dict[str, Any]):
    from regen.devkit.simulate.config import SimConfig

    return SimConfig.from_flat(options).answer


def stored_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every row of every part (any run-directory URI)."""
    rd = RunDir.open(str(run_dir), create=False)
    rows: list[dict[str, Any]] = []
    for name in rd.list(layout.PARTS_DIR):
        if layout.part_stem(name) is not None:
            rows += pq.read_table(rd.path(f"{layout.PARTS_DIR}/{name}"),
                                  filesystem=rd.fs).to_pylist()  # fmt: skip
    return rows


def inputs(manifest: Manifest, limit: int | None = None) -> list[Any]:
    sources = source_set(manifest)
    out = list(read_samples(sources, None, native_check(sources)))
    return out[:limit] if limit is not None else out


def check_ids_once(rows: list[dict[str, Any]], samples: list[Any]) -> None:
    """Ids equal the input's, no (sample_id, turn, attempt) twice, every attempt of every
    sample has its turns (attempts numbered 0..n without gaps)."""
    assert {r["sample_id"] for r in rows} == {s.id for s in samples}
    keys = Counter((r["sample_id"], r["turn"], r.get("attempt") or 0) for r in rows)
    assert [k for k, n in keys.items() if n > 1] == []
    turns = Counter((r["sample_id"], r.get("attempt") or 0) for r in rows)
    for s in samples:
        attempts = sorted(a for sid, a in turns if sid == s.id)
        assert attempts == list(range(len(attempts))), s.id
        for a in attempts:
            if s.mode == "native":
                assert turns[s.id, a] == 1
            else:  # a turn may stop early when our reply changed the tool calls or was cut
                assert 1 <= turns[s.id, a] <= s.turns_to_regenerate()


def request_body(row: dict[str, Any], manifest: Manifest) -> dict[str, Any]:
    """The parts of the request that produced a stored row that the simulator's answer reads."""
    return {
        "messages": json.loads(row["messages"]),
        "tools": json.loads(row["tools"]) if row["tools"] else None,
        "seed": attempt_seed(manifest.sampling.seed, row.get("attempt") or 0),
        "max_tokens": manifest.sampling.max_tokens,
        "chat_template_kwargs": manifest.template_kwargs(),
    }


def check_answers(rows: list[dict[str, Any]], manifest: Manifest, sim_options: dict) -> int:
    """Every regenerated row's answer is the simulator's, byte for byte (a turn regen cut
    because it looped: the simulator's loop up to the cut); returns how many."""
    cfg = sim_answer_config(sim_options)
    checked = 0
    for r in rows:
        if r["token_source"] == "native":
            continue
        want = answer(request_body(r, manifest), cfg)
        if r["finish_reason"] == LOOP:
            assert want.degenerate == "loop", r["sample_id"]
            assert want.content.startswith(r["content"]), r["sample_id"]
            assert want.reasoning.startswith(r["reasoning"] or ""), r["sample_id"]
            assert r["cut_saved"] == manifest.sampling.max_tokens - r["completion_tokens"] > 0
            checked += 1
            continue
        assert r["content"] == want.content, r["sample_id"]
        assert (r["reasoning"] or "") == want.reasoning, r["sample_id"]
        assert r["finish_reason"] == want.finish_reason
        assert [c["id"] for c in json.loads(r["tool_calls"])] == [c.id for c in want.tool_calls]
        checked += 1
    return checked


def regen_cmd(*args: str) -> list[str]:
    return [str(REGEN), "--log-level", "WARNING", *args]


def wait_until(pred, timeout_s: float, step_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step_s)
    return pred()


def read_numbers(uri: Any, now: float | None = None, **kw: Any) -> RunNumbers:
    """The run directory's numbers, computed once (what `regen status` shows)."""
    return RunView(uri).numbers(now, **kw)
