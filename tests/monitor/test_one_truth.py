"""One truth for a run's state (issue 31, item 4): after a run that finished and was resumed
(a second session with nothing left to do), `regen status`, `regen status --json`,
`regen monitor --once` and regen's metrics read the same whole-run numbers (requests, endpoint
health, answered turns), the same as after the first session: the empty session's counters do
not replace the run's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _runs import read_numbers

from benchmarks import chaos
from regen.cli.main import main as regen_main
from regen.devkit.simulate.testing import simulator_in_thread
from regen.engine.metrics import values

pytestmark = pytest.mark.ray


def four_views(out: Path, capsys) -> dict[str, Any]:
    """What each of the four readers says about the run in ``out``."""
    capsys.readouterr()
    assert regen_main(["status", str(out), "--json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert regen_main(["status", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert regen_main(["monitor", str(out), "--once", "--width", "200"]) == 0
    frame = " ".join(capsys.readouterr().out.split())
    metrics = {name: {tuple(sorted(t.items())): v for t, v in s}
               for name, s in values(read_numbers(out)).items()}  # fmt: skip
    return {"json": as_json, "text": text, "frame": frame, "metrics": metrics}


def check_agree(v: dict[str, Any], sent: int, url: str) -> None:
    j = v["json"]
    assert j["requests"]["sent"] == sent and j["requests"]["ok"] == sent
    assert f"{sent} sent · {sent} ok" in v["frame"]
    assert v["metrics"]["regen_requests"][(("outcome", "sent"),)] == sent
    (ep,) = j["endpoints"]
    assert ep["healthy"] is True and ep["ok"] == sent
    assert "endpoints 1/1 up" in v["text"] and "endpoints 1/1 up" in v["frame"]
    assert v["metrics"]["regen_endpoint_up"][(("endpoint", url),)] == 1.0
    assert v["metrics"]["regen_endpoint_answers"][(("endpoint", url), ("outcome", "ok"))] == sent
    assert sum(j["hist_counts"]) == sent  # one regenerated turn per request here
    assert "no finished turns yet" not in v["frame"]


def test_status_monitor_json_and_metrics_agree_after_a_resume(tmp_path, capsys, ray_head) -> None:
    src = chaos.write_sharegpt(tmp_path / "s.jsonl", 12)
    path = chaos.write_manifest(tmp_path / "m.yaml", src, engine={"workers": 1})
    out = tmp_path / "run"
    with simulator_in_thread(model_name=chaos.MODEL, instant=True, mean_tokens=16) as sim:
        run = ["run", str(path), "--out", str(out), "--no-view", "--endpoint", sim.url,
               "--address", ray_head.address]  # fmt: skip
        assert regen_main(run) == 0
        sent = sim.stats()["received"]
        first = four_views(out, capsys)
        check_agree(first, sent, sim.url)
        assert regen_main(run) == 0  # resumed: nothing left, no request sent
        assert sim.stats()["received"] == sent
    resumed = four_views(out, capsys)
    check_agree(resumed, sent, sim.url)
    assert resumed["json"]["session"] != first["json"]["session"]
