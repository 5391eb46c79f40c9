"""Shared simulators: one subprocess per option set, started once per test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _sim_common import PROTOCOL_OPTIONS

from regen.devkit.simulate.testing import RunningSimulator, running_simulator


@pytest.fixture(scope="session")
def sim() -> Iterator[RunningSimulator]:
    """SGLang usage shape, speculative flags, fast steps."""
    with running_simulator(**PROTOCOL_OPTIONS) as s:
        yield s


@pytest.fixture(scope="session")
def sim_finish() -> Iterator[RunningSimulator]:
    """transformers-serve usage shape (usage on the finish_reason chunk)."""
    opts = {k: v for k, v in PROTOCOL_OPTIONS.items() if not k.startswith("spec")}
    with running_simulator(usage_shape="finish", tokens_per_step=4, **opts) as s:
        yield s
