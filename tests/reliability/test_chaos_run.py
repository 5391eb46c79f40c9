"""Chaos run, CI size: server faults + the driver SIGKILLed twice; the data is exactly the input.

Runs benchmarks/chaos.py's code (150 samples, 2 kills; the full size is 2,000 and 5) against
the test session's Ray head.
"""

from __future__ import annotations

from typing import Any

import pytest
from _reliability import chaos

pytestmark = pytest.mark.ray

SAMPLES = 150
KILLS = 2


@pytest.fixture(scope="module")
def chaos_run(tmp_path_factory, ray_head, ray_env) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("chaos")
    runs, verdict, stats = chaos.chaos(work, ray_head.address, ray_env, samples=SAMPLES,
                                       kills=KILLS, seed=3, timeout_s=240)  # fmt: skip
    return {"runs": runs, "verdict": verdict, "stats": stats, "work": work}


def test_the_driver_was_killed_mid_run_and_finished_after_restarts(chaos_run) -> None:
    runs = chaos_run["runs"]
    assert len(runs.kills) == KILLS
    assert all(0 <= k.stored < SAMPLES for k in runs.kills)  # work was left at every kill
    assert runs.final_rc == 0
    assert runs.sessions == KILLS + 1


def test_every_fault_kind_happened(chaos_run) -> None:
    stats = chaos_run["stats"]
    assert set(stats["failed"]) == {"fail", "rate_limit", "disconnect"}
    assert stats["stalled"] >= 1


def test_the_data_is_exactly_the_input(chaos_run) -> None:
    v = chaos_run["verdict"]
    assert v.problems == []
    assert (v.inputs, v.stored, v.missing, v.unexpected) == (SAMPLES, SAMPLES, 0, 0)
    assert v.duplicates == 0 and v.wrong_turns == 0
    assert v.answers_checked == v.rows and v.answers_wrong == 0
    assert (v.failures, v.failed, v.state) == (0, 0, "finished")
