"""The README's cluster line, as written, against a local Ray head (issue 31, items 1 and 2):
the `ray job submit ... -- python -m pipelines.regenerate ...` command is read from README.md's
"On a cluster" block and run with the real `ray` CLI; only the cluster's names are swapped for
this machine's (the head's address, the demo manifest, a simulator as the endpoint, the run
directory). A relative `--out` is refused in one line (nothing written, the job FAILED); an
absolute one finishes, and submitting the same line again resumes with nothing left to do."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from regen.devkit.simulate.testing import running_simulator

pytestmark = [pytest.mark.ray, pytest.mark.ray_dashboard]

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
#: bound on one submission (working-dir upload, job start, the demo run)
SUBMIT_TIMEOUT_S = 300


def readme_submit_line() -> list[str]:
    """The `ray job submit` command of the README's cluster section, as argv."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## On a cluster", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "no bash block in the README's cluster section"
    joined = block.group(1).replace("\\\n", " ")
    (line,) = [ln for ln in joined.splitlines() if ln.lstrip().startswith("ray job submit")]
    return shlex.split(line)


def on_this_machine(argv: list[str], dashboard: str, endpoint: str, out: str) -> list[str]:
    """The README's argv with the cluster's names swapped for the local head's."""
    swap = {"--address": dashboard, "--out": out, "--workers": "2"}
    result: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg in swap:
            next(it)
            result += [arg, swap[arg]]
        elif arg == "--endpoint":
            if next(it) and "--endpoint" not in result:
                result += [arg, endpoint]
        elif arg.endswith("kimi-k25-eagle3.yaml"):
            result.append("manifests/demo.yaml")
        else:
            result.append(arg)
    assert result[0] == "ray"
    return [str(VENV_BIN / "ray"), *result[1:]]


def submit(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the submission (again while a fresh head's job agent is not up: "No available
    agent", which Ray answers before the job exists)."""
    deadline = time.monotonic() + SUBMIT_TIMEOUT_S
    while True:
        p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=SUBMIT_TIMEOUT_S)  # fmt: skip
        if "No available agent" not in p.stderr or time.monotonic() > deadline:
            return p
        time.sleep(1.0)


def whole_log(p: subprocess.CompletedProcess[str], dashboard: str, env: dict[str, str]) -> str:
    """What the job printed, whole: the submission's streamed output may end before the job's
    last lines arrive (its log stream closes when the job ends), so the job's own log is read
    back with ``ray job logs``."""
    streamed = p.stdout + p.stderr
    found = re.search(r"raysubmit_\w+", streamed)
    if found is None:
        return " ".join(streamed.split())
    back = subprocess.run([str(VENV_BIN / "ray"), "job", "logs", found.group(0), "--address",
                           dashboard], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=SUBMIT_TIMEOUT_S)  # fmt: skip
    return " ".join((streamed + back.stdout).split())


def test_the_readmes_submit_line_refuses_a_relative_out_and_finishes_an_absolute_one(
    ray_head, ray_env, tmp_path
) -> None:
    line = readme_submit_line()
    assert line[line.index("--out") + 1].startswith("/")  # the README's own --out is absolute
    with running_simulator(model_name="demo-target", instant=True, mean_tokens=24) as sim:
        rel = on_this_machine(line, ray_head.dashboard_url, sim.url, "runs/readme-relative")
        p = submit(rel, ray_env)
        logs = " ".join((p.stdout + p.stderr).split())
        assert p.returncode != 0, logs[-3000:]
        assert "error: --out runs/readme-relative: under this Ray job it is" in logs, logs[-3000:]
        assert "temporary working directory" in logs
        assert sim.stats()["received"] == 0 and not (REPO / "runs" / "readme-relative").exists()

        out = tmp_path / "shared" / "runs" / "demo"
        absolute = on_this_machine(line, ray_head.dashboard_url, sim.url, str(out))
        p = submit(absolute, ray_env)
        logs = whole_log(p, ray_head.dashboard_url, ray_env)
        assert p.returncode == 0, logs[-3000:]
        assert f"run dir {out}" in logs
        sent = sim.stats()["received"]
        progress = json.loads((out / "progress.json").read_text())
        assert progress["state"] == "finished" and sent > 0

        p = submit(absolute, ray_env)  # the same line again: a resume
        logs = whole_log(p, ray_head.dashboard_url, ray_env)
        assert p.returncode == 0, logs[-3000:]
        assert "(0 this session)" in logs and sim.stats()["received"] == sent
