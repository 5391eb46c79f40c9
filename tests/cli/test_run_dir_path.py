"""A run directory is always absolute (issue 31, item 1): under a `ray job submit` with a
``--working-dir``, a relative ``--out`` lands in Ray's temporary copy of the working directory,
which Ray deletes, so it is refused with one line unless it resolves outside it; every command
names the run directory by its absolute path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.regenerate import main as job_main
from regen.cli._args import RAY_JOB_CONFIG_ENV, absolute_run_dir
from regen.cli.main import EXIT_CONFIG
from regen.core.errors import ConfigError
from regen.store import RunDir

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def ray_job(tmp_path, monkeypatch) -> Path:
    """This process as a submitted job's entrypoint: in Ray's unpacked copy of the working dir,
    with the job config Ray sets."""
    pkg = tmp_path / "session" / "runtime_resources" / "working_dir_files" / "_ray_pkg_ab12"
    pkg.mkdir(parents=True)
    monkeypatch.chdir(pkg)
    config = {"runtime_env": {"working_dir": "gcs://_ray_pkg_ab12.zip"}, "metadata": {}}
    monkeypatch.setenv(RAY_JOB_CONFIG_ENV, json.dumps(config))
    return pkg


def test_a_relative_out_inside_the_jobs_working_dir_is_refused(ray_job) -> None:
    with pytest.raises(ConfigError, match="temporary working directory") as e:
        absolute_run_dir("runs/relative")
    assert e.value.field == "--out"
    assert str(ray_job / "runs" / "relative") in str(e.value)


def test_an_absolute_path_inside_it_is_refused_too(ray_job) -> None:
    with pytest.raises(ConfigError):
        absolute_run_dir(str(ray_job / "runs" / "x"))


def test_a_path_that_resolves_outside_it_is_kept_absolute(ray_job, tmp_path) -> None:
    assert absolute_run_dir("../../../../shared/run") == str(
        (ray_job / "../../../../shared/run").absolute()
    )
    assert absolute_run_dir(str(tmp_path / "shared" / "run")) == str(tmp_path / "shared" / "run")
    assert absolute_run_dir("s3://bucket/runs/k25") == "s3://bucket/runs/k25"


def test_the_job_entrypoint_refuses_it_in_one_line_and_writes_nothing(ray_job, capsys) -> None:
    code = job_main([str(REPO / "manifests/demo.yaml"), "--out", "runs/relative",
                     "--endpoint", "http://127.0.0.1:9/v1", "--no-view"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == EXIT_CONFIG
    assert err.startswith("error: --out runs/relative") and err.count("\n") == 1, err
    assert not (ray_job / "runs").exists()


def test_outside_a_ray_job_a_relative_out_is_made_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(RAY_JOB_CONFIG_ENV, raising=False)
    assert absolute_run_dir("runs/demo") == str(tmp_path / "runs" / "demo")


def test_a_run_directory_is_named_by_its_absolute_path(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert RunDir.open("runs/demo", create=False).uri == str(tmp_path / "runs" / "demo")
