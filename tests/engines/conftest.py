"""Fixtures of the real-engine tests: vLLM 0.32's CPU build, started once per test session.

vLLM lives in its own environment, installed by ``scripts/vllm-env`` (``scripts/test`` runs it
first; a fresh clone's ``.ci/run`` gets it that way) from the committed lock. Where that
install failed, every test here skips with the install's own reason (``.install-failed``);
where it is simply absent (a run that skipped ``scripts/test``), they skip saying so.

Two servers at most, each started on first use and shared by the modules of tests/conftest.py's
``vllm-servers`` group (~3 GB and 30-150 s of start each on this machine), which run one after
the other on one xdist worker; they are stopped when that worker's next test is outside the
group (tests/conftest.py's ``pytest_runtest_teardown``): the Ray and server modules run first,
so a server kept to the session's end would hold its memory beside every later test; should a
test of the group come again, its server starts again:

- ``vllm_server``: the scripted target (tests/engines/_models.py) with vLLM's Kimi parsers;
- ``vllm_spec_server``: the same target speculating with an untrained EAGLE-3 draft (its vLLM
  copy, written by ``regen serve-command``'s own code) and ``--max-num-queued-reqs``
  (overload answers 503), for what needs those flags.

Start times are appended to ``$REGEN_VLLM_TIMES`` when set (the numbers in the report).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _models import build_eagle3_draft, build_scripted_target
from _vllm_env import vllm_python_or_skip

from regen.devkit.servers.vllm import VllmServer

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SERVED = "demo-target"
#: SpecForge-numbered aux layers of the test draft (4-layer target; first id 1, as SpecForge's
#: default list starts): vLLM must be given [2, 3, 4]
DRAFT_AUX_IDS = [1, 2, 3]
#: the speculative server: 2 sequences at once, 3 more may wait, then 503
SPEC_MAX_SEQS = 2
SPEC_QUEUED = 3
NUM_SPEC_TOKENS = 3


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM environment's Python (skips, naming why, when the install is not there)."""
    return vllm_python_or_skip()


@pytest.fixture(scope="session")
def engine_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The scripted target, an untrained draft (SpecForge numbering) and its vLLM copy."""
    from regen.serve.vllm import write_vllm_draft

    root = tmp_path_factory.mktemp("engine-models")
    target = build_scripted_target(root / "target")
    draft = build_eagle3_draft(root / "draft", target, DRAFT_AUX_IDS)
    return {"target": target, "draft": draft, "draft_vllm": write_vllm_draft(draft)}


def _record_start(name: str, srv: VllmServer) -> None:
    path = os.environ.get("REGEN_VLLM_TIMES")
    if path and srv.start_s is not None:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"server": name, "start_s": round(srv.start_s, 1),
                                "at": time.time()}) + "\n")  # fmt: skip


@pytest.fixture(scope="session")
def vllm_server(
    vllm_python: Path, engine_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    logs = tmp_path_factory.mktemp("vllm-logs")
    srv = VllmServer(vllm_python, engine_models["target"], served_name=SERVED,
                     max_num_seqs=8, log_path=logs / "vllm.log")  # fmt: skip
    with srv:
        _record_start("plain", srv)
        yield srv


@pytest.fixture(scope="session")
def vllm_spec_server(
    vllm_python: Path, engine_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    from regen.serve.vllm import speculative_config

    logs = tmp_path_factory.mktemp("vllm-spec-logs")
    spec = speculative_config(str(engine_models["draft_vllm"]), NUM_SPEC_TOKENS)
    srv = VllmServer(vllm_python, engine_models["target"], served_name=SERVED,
                     max_num_seqs=SPEC_MAX_SEQS, max_num_queued_reqs=SPEC_QUEUED,
                     speculative_config=spec, log_path=logs / "vllm.log")  # fmt: skip
    with srv:
        _record_start("speculative", srv)
        yield srv
