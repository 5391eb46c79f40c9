"""Overload chaos run, CI size: 10% SGLang 503 overloads + 5% cut streams; the data is exactly
the input and the endpoint never leaves rotation.

Runs benchmarks/overload.py's code (120 samples; the full size is 400, beside the same run
with 429s and without faults) against the test session's Ray head.
"""

from __future__ import annotations

from typing import Any

import pytest
from _reliability import overload

pytestmark = pytest.mark.ray

SAMPLES = 120


@pytest.fixture(scope="module")
def overload_run(tmp_path_factory, ray_head) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("overload")
    return overload.overload_run(work, "503", samples=SAMPLES, address=ray_head.address)


def test_overloads_and_cuts_happened(overload_run) -> None:
    failed = overload_run["server_failed"]
    assert set(failed) == {"overload", "disconnect"} and failed["overload"] >= 5


def test_the_endpoint_never_left_rotation(overload_run) -> None:
    assert overload_run["health_polls"] > 0 and overload_run["unhealthy_polls"] == 0


def test_nothing_lost_or_duplicated(overload_run) -> None:
    v = overload_run["verdict"]
    assert v["problems"] == [] and v["ok"]
    assert (v["inputs"], v["stored"], v["missing"], v["unexpected"]) == (SAMPLES, SAMPLES, 0, 0)
    assert v["duplicates"] == 0 and v["answers_wrong"] == 0 and v["failures"] == 0
    assert overload_run["state"] == "finished"
