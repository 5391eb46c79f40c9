"""`regen run` on a target of each family below, served by real vLLM 0.32 (CPU): Qwen3,
DeepSeek-V3.1, Qwen3-Coder and GLM-4.5 (whose templates need history tool-call arguments as
objects), GLM-4.7, DeepSeek-V4 (DSML; vLLM encodes its prompts in Python, ``--tokenizer-mode
deepseek_v4``, and so does regen), and a target of a format no family module describes, known
only by its tokenizer's ``response_template`` (Ember, ``--tool-call-parser hf
--reasoning-parser hf``). Kimi's run on vLLM is the demo loop's first round
(tests/devkit/loop/test_demo_loop.py: the whole demo, served the same way), held to the same
checks.

Per family: its demo target (regen.devkit.demo_target, built once per checkout under
``.cache/demo-model-FAMILY``) is served by one vLLM server with that family's flags
(``Family.vllm_flags``), and ``regen run`` (one worker: the server runs 8 sequences at once,
what one worker keeps in flight) regenerates a short slice of the family's demo manifest (a
few samples of every source, the tool-call sources xlam, glaive and swe_gym included). The
next family's server starts while a family's run goes (a start is mostly imports: ~15 s of
CPU), so at most two servers live at once. No
sample fails permanently (DeepSeek-V3.1's requests with a tool call in their history included:
its demo target is served with the template a real V3.1 needs, its manifest's
``target.chat_template``, which the local render uses too). The rows of the run's parts are
held to tests/_vllm_rows.py: the server's own ids, the local render agreeing with them, tool
calls that parse into the declared tools, the reasoning split.

The per-family numbers are printed (``-s``) and appended as JSON lines to
``$REGEN_FAMILY_TABLE`` when set.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _runs import stored_rows
from _vllm_rows import (
    check_reasoning_split,
    check_render_matches,
    check_server_ids,
    check_tool_calls,
    permanent_failures,
    table,
)

pytestmark = [pytest.mark.vllm, pytest.mark.ray]

REPO = Path(__file__).resolve().parents[2]
#: family → (its demo manifest, the cache folder of its demo target)
CASES: dict[str, tuple[str, str]] = {
    "qwen3": ("demo-qwen3.yaml", "demo-model-qwen3"),
    "deepseek_v3": ("demo-deepseek.yaml", "demo-model-deepseek_v3"),
    "qwen3_coder": ("demo-qwen3-coder.yaml", "demo-model-qwen3_coder"),
    "glm45": ("demo-glm45.yaml", "demo-model-glm45"),
    "glm47": ("demo-glm47.yaml", "demo-model-glm47"),
    "deepseek_v4": ("demo-deepseek-v4.yaml", "demo-model-deepseek_v4"),
    "response_template": ("demo-ember.yaml", "demo-model-response_template"),
}
#: samples per source: the tool-call sources get more (about 25 samples in all)
TOOL_SOURCES = ("xlam", "glaive", "swe_gym")
LIMIT, TOOL_LIMIT = 2, 4


def overrides(manifest: Path) -> list[str]:
    """``-o sources.X.limit=N`` for every regenerated source (native rows left out)."""
    from regen.manifest import load_manifest

    out: list[str] = []
    for s in load_manifest(manifest).sources:
        limit = 0 if s.mode == "native" else TOOL_LIMIT if s.name in TOOL_SOURCES else LIMIT
        out += ["-o", f"sources.{s.name}.limit={limit}"]
    return out


class FamilyServer:
    """One family's demo target served by one vLLM server with its parsers, built and started
    in a thread."""

    def __init__(self, name: str, vllm_python: Path, tmp: Path) -> None:
        from regen.manifest import load_manifest

        self.name, self.vllm_python, self.tmp = name, vllm_python, tmp
        self.manifest = REPO / "manifests" / CASES[name][0]
        m = load_manifest(self.manifest)
        self.family, self.served = m.family(), m.target.model
        self.srv: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._start, name=f"vllm-{name}", daemon=True)
        self.thread.start()

    def _start(self) -> None:
        from regen.devkit.servers import build_demo_target
        from regen.devkit.servers.vllm import VllmServer

        try:
            model = build_demo_target(REPO / ".cache" / CASES[self.name][1], self.manifest)
            self.srv = VllmServer(self.vllm_python, model, served_name=self.served,
                                  family=self.family, max_model_len=4096, max_num_seqs=8,
                                  log_path=self.tmp / "vllm.log")  # fmt: skip
            self.srv.start()
        except BaseException as e:  # raised in the test that needs the server
            self.error = e

    def ready(self) -> Any:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.srv

    def stop(self) -> None:
        self.thread.join()
        if self.srv is not None:
            self.srv.stop()


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, FamilyServer]]:
    """The families' servers started so far (by name); whatever still runs is stopped after
    the module."""
    started: dict[str, FamilyServer] = {}
    yield started
    for fs in started.values():
        fs.stop()


def run_order(request: pytest.FixtureRequest) -> list[str]:
    """The families this module's selected tests run, in their order."""
    order: list[str] = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or Path(str(item.path)) != Path(str(request.path)):
            continue
        name = callspec.params.get("family_run")
        if name is not None and name not in order:
            order.append(name)
    return order


@pytest.fixture(scope="module", params=list(CASES))
def family_run(
    request: pytest.FixtureRequest, servers: dict[str, FamilyServer], vllm_python: Path,
    ray_head: Any, tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:  # fmt: skip
    """One family's run on its server; the next family's server starts beside it."""
    from regen.cli.main import main as regen_main

    def server(name: str) -> FamilyServer:
        if name not in servers:
            servers[name] = FamilyServer(
                name, vllm_python, tmp_path_factory.mktemp(f"family-{name}")
            )
        return servers[name]

    name = request.param
    this = server(name)
    fam, manifest = this.family, this.manifest
    assert fam is not None and fam.name == name, f"{manifest.name}: recognised {fam}"
    srv = this.ready()
    order = run_order(request)
    later = order[order.index(name) + 1 :] if name in order else []
    if later:
        server(later[0])  # starts while this run goes
    try:
        out = this.tmp / "run"
        argv = ["run", str(manifest), "--out", str(out), "--endpoint", srv.url,
                "--address", ray_head.address, "--workers", "1", "--no-view",
                *overrides(manifest)]  # fmt: skip
        rc = regen_main(argv)
    finally:
        srv.stop()

    yield {"family": fam, "rc": rc, "rows": stored_rows(out), "start_s": srv.start_s,
           "failed": permanent_failures(out)}  # fmt: skip


def test_the_run_finishes_and_reports(family_run: dict[str, Any]) -> None:
    name = family_run["family"].name
    numbers = {"family": name, **table(family_run["rows"]),
               "failed_permanently": len(family_run["failed"]),
               "vllm_start_s": family_run["start_s"]}  # fmt: skip
    print(f"\n{json.dumps(numbers)}")
    path = os.environ.get("REGEN_FAMILY_TABLE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(numbers) + "\n")
    assert family_run["rc"] == 0
    assert not family_run["failed"], family_run["failed"]
    assert numbers["rows"] >= 25


def test_every_row_is_the_servers_ids(family_run: dict[str, Any]) -> None:
    check_server_ids(family_run["rows"], family_run["family"])


def test_the_local_render_matches_the_server(family_run: dict[str, Any]) -> None:
    check_render_matches(family_run["rows"], family_run["family"])


def test_tool_calls_parse_into_declared_tools(family_run: dict[str, Any]) -> None:
    check_tool_calls(family_run["rows"], family_run["family"])


def test_reasoning_is_split(family_run: dict[str, Any]) -> None:
    check_reasoning_split(family_run["rows"], family_run["family"])
