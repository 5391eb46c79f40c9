"""Fixtures for regen.train: a run directory with an export and train.yaml files.

The Ray head (``ray_head``, 8 logical GPUs) is the session fixture of tests/conftest.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from train_fixtures import demo_config, good_rows, write_export


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
        p.write_text(yaml.safe_dump(cfg if cfg is not None else demo_config()))
        return p

    return write
