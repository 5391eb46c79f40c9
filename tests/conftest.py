"""Shared fixtures: a session-scoped local Ray head (loopback only), isolated from leftovers.

``ray_head`` starts ``ray start --head --block`` in its own process group with its own
--temp-dir, HOME and PATH (the venv's bin first: a job entrypoint's ``python`` is looked up on
the head's PATH), token auth off and no RAY_ADDRESS / RAY_AUTH_TOKEN* inherited, so a
``~/.ray/auth_token`` left by some local ``ray.init()`` changes nothing. For the whole session
this process also runs with RAY_AUTH_MODE=disabled and RAY_ADDRESS unset. It yields
``RayHead(address, dashboard_url)`` (unpackable as a pair); ``ray_env`` is the environment
for subprocesses that talk to it. At the end the head's process group is stopped (SIGTERM,
then SIGKILL); ``ray stop`` is not used because it would stop every Ray on this machine.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from regen.procs import stop_group

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent

#: seconds the head may take to answer the job API
RAY_START_TIMEOUT_S = 120.0
#: seconds the head gets to stop on SIGTERM before its process group is killed
HEAD_STOP_TIMEOUT_S = 5.0


class RayHead(NamedTuple):
    address: str  #: GCS address, for ray.init(address=...) / --address
    dashboard_url: str  #: job API, for JobSubmissionClient / ray job submit --address


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def isolated_ray_env(home: Path) -> dict[str, str]:
    """os.environ without Ray leftovers: own HOME, auth off, venv bin first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH_TOKEN",))}
    env.pop("RAY_ADDRESS", None)
    env.update(
        HOME=str(home),
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
        PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    return env


@pytest.fixture(scope="session")
def ray_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("ray-home")
    return isolated_ray_env(home)


@pytest.fixture(scope="session")
def ray_head(
    tmp_path_factory: pytest.TempPathFactory, ray_env: dict[str, str]
) -> Iterator[RayHead]:
    """A real local Ray head: 2 CPUs, 8 logical GPUs, dashboard on 127.0.0.1."""
    tmp = tmp_path_factory.mktemp("ray-head")
    gcs_port, dash_port = free_port(), free_port()
    argv = [
        str(VENV_BIN / "ray"), "start", "--head", "--block",
        f"--port={gcs_port}", "--node-ip-address=127.0.0.1",
        "--num-cpus=2", "--num-gpus=8",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash_port}",
        f"--ray-client-server-port={free_port()}", f"--temp-dir={tmp}", "--disable-usage-stats",
        # every port explicit: fixed defaults (agent 52365, ...) collide with other heads
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
        f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
    ]  # fmt: skip
    log = (tmp / "ray-start.log").open("wb")
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=ray_env, start_new_session=True
    )
    head = RayHead(f"127.0.0.1:{gcs_port}", f"http://127.0.0.1:{dash_port}")
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.pop("RAY_ADDRESS", None)
    try:
        from ray.job_submission import JobSubmissionClient

        deadline = time.monotonic() + RAY_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ray start exited with {proc.returncode}: see {tmp}/ray-start.log")
            try:
                JobSubmissionClient(head.dashboard_url).list_jobs()
                break
            except Exception:
                if time.monotonic() > deadline:
                    pytest.fail(f"the Ray head did not come up in {RAY_START_TIMEOUT_S:.0f} s")
                time.sleep(0.5)
        yield head
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        stop_group(proc, HEAD_STOP_TIMEOUT_S)
        log.close()


@pytest.fixture(scope="session")
def demo_target() -> Path:
    """The demo target (regen.serving.demo_target), built once per checkout into
    ``.cache/demo-model``: the build ``./scripts/demo`` serves (its key decides reuse)."""
    from regen.serving import build_demo_target

    return build_demo_target(REPO / ".cache" / "demo-model", REPO / "manifests" / "demo.yaml")
