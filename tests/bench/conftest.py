"""Real simulated SGLang servers for the bench's runner tests, started once per session:
a baseline, an EAGLE3 server with a draft, and the EAGLE-misconfigured one (acceptance 1.0)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _bench_common import SIM, SPEC

from regen.devkit.simulate.testing import RunningSimulator, running_simulator


@pytest.fixture(scope="session")
def sim_base() -> Iterator[RunningSimulator]:
    with running_simulator(**SIM) as s:
        yield s


@pytest.fixture(scope="session")
def sim_eagle3() -> Iterator[RunningSimulator]:
    # reports only /server_info's running average: the bench's fallback path
    with running_simulator(
        **SIM, **SPEC, speculative_algorithm="EAGLE3", spec_tokens_details=False
    ) as s:
        yield s


@pytest.fixture(scope="session")
def sim_eagle() -> Iterator[RunningSimulator]:
    with running_simulator(
        **SIM, **SPEC, speculative_algorithm="EAGLE", spec_tokens_details=False
    ) as s:
        yield s
