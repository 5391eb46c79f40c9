"""Fixtures for regen.train: a run directory with an export and train.yaml files, and one real
demo run (shared by the tests of the session).

The Ray head (``ray_head``, 8 logical GPUs), the demo target (``demo_target``) and its
``transformers serve`` (``demo_server``) are session fixtures of tests/conftest.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from train_fixtures import REPO, good_rows, kimi_config, served_run, write_export

DEMO = REPO / "manifests" / "demo.yaml"
#: bound on the session's one demo run (Ray workers start, ~80 requests on a CPU server)
DEMO_RUN_TIMEOUT_S = 900


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    rd = tmp_path / "run"
    rd.mkdir()
    write_export(rd, good_rows())
    return rd


@pytest.fixture
def write_train_yaml(tmp_path: Path):
    def write(cfg: dict[str, Any] | None = None, name: str = "train.yaml") -> Path:
        p = tmp_path / name
        p.write_text(yaml.safe_dump(cfg if cfg is not None else kimi_config()))
        return p

    return write


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory, demo_server, ray_head, ray_env) -> Path:
    """``regen run manifests/demo.yaml`` against ``transformers serve`` of the demo target (the
    session's, tests/conftest.py), as ``regen demo`` runs it: the run directory (read it; copy
    it before changing it)."""
    tmp = tmp_path_factory.mktemp("demo-run")
    return served_run(DEMO, demo_server, tmp, ray_head.address, ray_env, DEMO_RUN_TIMEOUT_S)
