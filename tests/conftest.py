"""Shared fixtures and the test tiers.

**Tiers.** A test marked ``ray`` needs Ray, ``server`` a real ``transformers serve``, ``vllm``
a real vLLM server (tests/engines); ``slow`` (given here, by :data:`SLOW`) starts server
processes (``regen simulate``, moto, SGLang's or SpecForge's code in a subprocess) or runs a
timed workload. Every other test is marked ``fast``: ``./scripts/test -m fast`` is the tier a
developer runs often (no Ray, no server process; in-thread simulators and short ``python -c``
checks only).

**Ray.** A session-scoped local Ray head (loopback only), isolated from leftovers.

``ray_head`` starts ``ray start --head --block`` in its own process group with its own
--temp-dir, HOME and PATH (the venv's bin first: a job entrypoint's ``python`` is looked up on
the head's PATH), token auth off and no RAY_ADDRESS / RAY_AUTH_TOKEN* inherited, so a
``~/.ray/auth_token`` left by some local ``ray.init()`` changes nothing. For the whole session
this process also runs with RAY_AUTH_MODE=disabled and RAY_ADDRESS unset. It yields
a :class:`RayHead`; ``ray_env`` is the environment for subprocesses
that talk to it. The head runs no log monitor (``--include-log-monitor=false``): that process
polls every log file of the node ten times a second to forward the actors' output to drivers'
consoles, ~0.03 CPU-s a second per head here; the actors' logs stay in the head's
``temp_dir``, where tests read them. Its dashboard agent reports the node's stats every
:data:`RAY_REPORTER_INTERVAL_MS` instead of every 5 s (no test reads them). The head runs Ray's
dashboard (the job API of ``ray job submit`` and ``JobSubmissionClient``, the state API of
``ray.util.state``) only for the modules with a test marked ``ray_dashboard``: idle, a head
with it took 4.3 CPU-s a minute here, one without 1.9 (2026-12-07); a test reading
``dashboard_url`` from a head without one fails with a pointer to the mark. Those modules run on
one worker, one after the other (:data:`SHARED`'s ``ray-dashboard`` group), so one head in the
suite runs it. A head that runs the dashboard or not, where the next test's module wants the
other, is stopped and started again the other way. At the end the head's process group is
stopped (SIGTERM, then SIGKILL); ``ray stop`` is not used because it would stop every Ray on
this machine. A worker's head is also stopped as soon as its next test is in a module with no
test on the head (:func:`pytest_runtest_teardown`; the modules that have one run first on each
worker, :func:`pytest_collection_modifyitems`): an idle head costs 0.03 CPU-s a second (0.07
with its dashboard), and a later test that needs one starts it again.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import IO, TYPE_CHECKING

import _leaks
import pytest
from _fixtures import finish_fixture
from hypothesis import HealthCheck, settings

from regen.devkit.procs import stop_group

if TYPE_CHECKING:
    from regen.devkit.servers import TransformersServer

REPO = Path(__file__).resolve().parents[1]
HERE = REPO / "tests"
VENV_BIN = Path(sys.executable).parent
#: vLLM's cache (its model-class inspections: without one, every server start runs a third
#: process that imports vLLM, ~12 CPU-s here), kept in the checkout for every test process and
#: the subprocesses they start, whose HOME is often a temporary one (``ray_env``)
os.environ.setdefault("VLLM_CACHE_ROOT", str(REPO / ".cache" / "vllm"))
#: OpenMP threads sleep when they have no work instead of spinning first (libgomp's default):
#: the suite's three workers and their servers share two cores, where a spinning thread takes
#: a core from a process with work (a vLLM server's 48 answers under two busy cores: 11-12
#: CPU-s instead of 31-68, 2026-12-07); every test process and subprocess inherits it
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
#: one compute thread per process: torch's second thread, on these tiny models, mostly costs a
#: core without shortening anything, and the suite's processes share two cores (measured
#: 2026-12-07 with OMP_WAIT_POLICY=PASSIVE, on a quiet machine: a vLLM server's 48 answers 7.3-7.9
#: CPU-s in 6.6-7.1 s instead of 10.4-12.0 CPU-s in 10.3-11.6 s; SpecForge's 60 CPU training
#: steps on the demo run 23 CPU-s instead of 30; transformers' generate 2.8-4.4 CPU-s instead of
#: 4.9); every test process and subprocess inherits it (torch reads it when it loads)
os.environ.setdefault("OMP_NUM_THREADS", "1")
#: no remembered tokenizer classes in the test processes themselves
#: (regen.template.tokenizer_classes): a test that loads a tokenizer directory in process gets
#: AutoTokenizer's own resolution each time (the golden test's ``autotokenizer`` case); the
#: subprocesses started with ``ray_env`` remember them below its HOME
os.environ["REGEN_CACHE_DIR"] = ""

#: Hypothesis (the property tests, tests/_hostile.py): no deadline (two busy cores), no example
#: database written under the checkout, a fixed budget per test: ``ci`` (the default) draws the
#: same examples on every run (derandomised); ``long`` (``REGEN_HYPOTHESIS=long``, README's
#: "Property tests") draws new ones, 5,000 a test, for a local hunt
_QUIET = dict(deadline=None, database=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])  # fmt: skip
settings.register_profile("ci", max_examples=100, derandomize=True, **_QUIET)
settings.register_profile("long", max_examples=5000, **_QUIET)
settings.load_profile(os.environ.get("REGEN_HYPOTHESIS", "ci"))

#: seconds the head may take to start (and answer the job API, when it runs the dashboard)
RAY_START_TIMEOUT_S = 120.0
#: ``ray start`` tries before a head's fixture fails (:func:`start_head`)
RAY_START_TRIES = 3
#: what ``ray start --block`` prints once the node's processes run and it is registered
RAY_STARTED = "Ray runtime started"

#: seconds the head gets to stop on SIGTERM before its process group is killed
HEAD_STOP_TIMEOUT_S = 5.0
#: how often the head's dashboard agent samples the node's processes (Ray's default: 5,000)
RAY_REPORTER_INTERVAL_MS = 60_000
#: no Python worker started ahead of a task or actor (the raylet's ``enable_worker_prestart``
#: and ``prestart_worker_first_driver``): a driver's actors start their own workers anyway, and
#: a prestarted one that no actor takes idles until it is stopped (~2 CPU-s each to start; 12
#: in a run, 2026-12-07)
NO_PRESTART = {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}


#: tests (a module, or one test by node id below tests/) out of the fast tier: they start server
#: processes or run timed workloads (measured with --durations: each module takes seconds)
SLOW = (
    "bench/test_bench_cli.py",
    "bench/test_bench_e2e.py",
    "bench/test_bench_runner.py",
    "bench/test_bench_reweight.py::test_plan_reweight_writes_an_overlay_that_plan_loads",
    "bench/test_bench_reweight.py::test_plan_reweight_refuses_a_bad_bench",
    "contract/test_sglang_wheel.py",
    "devkit/simulate/test_sim_capacity.py",
    "devkit/simulate/test_sim_cli.py",
    "devkit/simulate/test_sim_faults_server.py",
    "devkit/simulate/test_sim_spec_server.py",
    "store/test_run_lock.py::test_two_processes_racing_for_a_stale_lock_one_wins",
    "store/test_s3_store.py",
    # vLLM's own parsers, in its environment's worker process (tests/_vllm_call.py)
    "targets/test_deepseek_v3_contract.py::test_vllm_round_trip",
    "targets/test_deepseek_v3_contract.py::test_vllm_loses_a_call_whose_arguments_hold_a_newline",
    "targets/test_glm45_contract.py::test_vllm_round_trip",
    "targets/test_gpt_oss_contract.py::test_vllm_round_trip",
    "targets/test_gpt_oss_contract.py::test_compact_arguments_come_back_spaced",
    "targets/test_gpt_oss_contract.py::test_vllm_ids_end_with_harmonys_stop_tokens",
    "targets/test_gpt_oss_contract.py::test_published_ids_are_the_harmony_encodings",
    "targets/test_kimi_contract.py::test_vllm_round_trip",
    "targets/test_llama3_contract.py::test_vllm_round_trip",
    "targets/test_qwen3_coder_contract.py::test_vllm_round_trip",
    "targets/test_qwen3_contract.py::test_vllm_round_trip",
    "targets/test_gemma4_contract.py::test_vllm_round_trip",
    "targets/test_gemma4_contract.py::test_vllm_keeps_the_special_tokens",
    "targets/test_mistral_contract.py::test_vllm_round_trip",
    "targets/test_mistral_contract.py::test_vllm_keeps_the_special_tokens",
    "targets/test_kimi_k3_contract.py::test_vllm_prompt",
    "targets/test_kimi_k3_contract.py::test_vllm_refuses_an_effort_k3_does_not_take",
    "targets/test_kimi_k3_contract.py::test_regen_sends_what_both_engines_hand_the_encoder",
    "targets/test_kimi_k3_contract.py::test_vllm_round_trip",
    "targets/test_kimi_k3_contract.py::test_vllm_gives_no_reasoning_for_an_empty_think_channel",
    "targets/test_glm47_contract.py::test_vllm_round_trip",
    "targets/test_minimax_m2_contract.py::test_vllm_round_trip",
    "targets/test_minimax_m2_contract.py::test_vllm_keeps_special_tokens",
    "targets/test_minimax_m3_contract.py::test_vllm_round_trip",
    "targets/test_minimax_m3_contract.py::test_vllm_leaves_special_tokens_skipped",
    "targets/test_deepseek_v32_contract.py::test_vllm_round_trip",
    "targets/test_deepseek_v32_contract.py::test_the_prompt_is_vllms",
    "targets/test_deepseek_v32_contract.py::test_plain_and_legacy_render_as_vllm",
    "targets/test_deepseek_v32_contract.py::test_the_engines_order_a_system_message_and_tools_differently",
    "targets/test_deepseek_v32_contract.py::test_what_the_engines_refuse_regen_refuses",
    "targets/test_deepseek_v4_contract.py::test_vllm_round_trip",
    "targets/test_deepseek_v4_contract.py::test_the_prompt_is_vllms",
    "targets/test_deepseek_v4_contract.py::test_where_the_engines_part_ways",
    "targets/test_deepseek_v4_contract.py::test_plain_and_legacy_render_as_vllm",
    "targets/test_deepseek_v4_contract.py::test_v41s_effort_is_a_budget_line",
    # vLLM's own request preparation and template render, in its environment's worker process
    "template/test_served_render.py::test_vllm_renders_what_regen_renders",
    "train/test_train_pipeline.py",
    "train/test_train_serving.py",
)
#: markers that keep a test out of the fast tier
NOT_FAST = ("ray", "server", "vllm", "slow")
#: fixtures that start a Ray head or a vLLM server: a test using one (directly or through
#: another fixture) gets the marker, so no such test lands in the fast tier by a missing mark
FIXTURE_MARKERS = {"ray_head": "ray", "vllm_python": "vllm"}
#: the longest modules (minutes each: the whole loop with vLLM and SpecForge; the reference
#: job rehearsed at CI size), started first, one per xdist worker, the rest beside them
LONGEST = ("devkit/loop/test_demo_loop.py", "reliability/test_rehearsal.py")
#: modules that share what is costly to start, by name: the patterns of their paths, and the
#: session fixtures the group holds. Each group is one xdist work unit
#: (:func:`pytest_xdist_make_scheduler`), run on one worker one module after the other, so what
#: they share starts once in the suite, and its fixtures are finished as soon as the worker's
#: next test is outside the group (:func:`pytest_runtest_teardown`; a later test that asks for
#: one starts it again); the groups start right after :data:`LONGEST`:
#:
#: - ``vllm-servers``: tests/engines/conftest.py's vLLM session servers;
#: - ``vllm-worker``: the vLLM environment's worker process (tests/_vllm_call.py: ~12 CPU-s of
#:   vLLM imports, once per pytest process, closed at its exit), which the targets' contract
#:   modules and the served render call; spread over three xdist workers they started three;
#: - ``demo-server``: :func:`demo_server`, ``transformers serve`` of the demo target (~20
#:   CPU-s a start with its model process);
#: - ``ray-dashboard``: the modules with a test marked ``ray_dashboard`` (this list is checked
#:   against the marks), on one head with the dashboard: spread over three workers, each worker
#:   started a head with it (its dashboard's six module processes, ~16 CPU-s) after one
#:   without (2026-12-07).
SHARED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "vllm-servers": (("engines/test_vllm_*",), ("vllm_server", "vllm_spec_server")),
    "vllm-worker": (("targets/test_*_contract.py", "template/test_served_render.py"), ()),
    "demo-server": (
        (
            "devkit/servers/test_transformers_server.py",
            "targets/test_markup_in_content.py",
            "train/test_train_demo_run.py",
        ),
        ("demo_server",),
    ),
    "ray-dashboard": (
        (
            "reliability/test_rehearsal.py",
            "reliability/test_node_loss.py",
            "pipelines/test_readme_cluster.py",
            "pipelines/test_regenerate.py",
            "engine/test_fail_fast.py",
            "train/test_then_train.py",
            "train/test_train_ray_job.py",
        ),
        (),
    ),
}
#: the longest modules of the fast tier (5-20 s each, measured with --durations: outages that
#: last seconds, subprocesses, lock races), first among the modules that start no server, so
#: the two workers end together there too
LONGEST_FAST = (
    "devkit/simulate/test_sim_outage.py",
    "reliability/test_secrets.py",
    "store/test_run_lock.py",
    "plan/test_report.py",
    "plan/test_index.py",
    "engine/test_stall.py",
    "bench/test_bench_reweight.py",
    "targets/test_markup_in_content.py",
)


def pytest_configure(config: pytest.Config) -> None:
    """A test that leaves a file, socket, subprocess or aiohttp session open fails
    (tests/_leaks.py)."""
    config.pluginmanager.register(_leaks, "regen-leaks")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of :data:`SLOW` ``slow``, those using a fixture of
    :data:`FIXTURE_MARKERS` with its marker, and every test without a :data:`NOT_FAST` marker
    ``fast`` (a SLOW entry that matches no test is an error: the list stays true), then put
    the modules with a ``ray``, ``server`` or ``vllm`` test first (in collection order
    otherwise): the longest run first (:data:`LONGEST`, then :data:`LONGEST_FAST` among the
    rest), so the xdist workers (``--dist loadfile``) end together; before them the work units
    (a :data:`SHARED` group or a module) whose modules are all on the Ray head, then those with
    some on it, then the others, the groups first in each, so that a worker goes from one unit
    on the head to the next and its head stops once (:func:`pytest_runtest_teardown`): with
    units off the head between them, one worker started three heads (2026-12-07); within a
    unit the modules on the head first, and among those the ones that want its dashboard
    last."""
    matched: set[str] = set()
    for item in items:
        rel = rel_path(item)
        node = f"{rel}::{item.name.split('[', 1)[0]}"
        for entry in SLOW:
            if entry in (rel, node):
                item.add_marker(pytest.mark.slow)
                matched.add(entry)
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()) and not item.get_closest_marker(marker):
                item.add_marker(getattr(pytest.mark, marker))
        if not any(item.get_closest_marker(m) for m in NOT_FAST):
            item.add_marker(pytest.mark.fast)
    heavy = {
        i.path for i in items if any(i.get_closest_marker(m) for m in ("ray", "server", "vllm"))
    }
    on_ray = {i.path for i in items if uses_ray_head(i)}
    on_dashboard = {i.path for i in items if wants_dashboard(i)}
    _MODULES["ray"], _MODULES["dashboard"] = on_ray, on_dashboard

    groups = list(SHARED)

    def unit(item: pytest.Item) -> str:
        """The xdist work unit of ``item``: its SHARED group, else its module."""
        return shared_group(rel_path(item)) or str(item.path)

    modules: dict[str, set[Path]] = {}
    for item in items:
        modules.setdefault(unit(item), set()).add(item.path)
    # a unit on the head: 0 every module of it, 1 some (a group whose modules off the head, which
    # run last in it, stop the head), 2 none
    on_head = {u: 0 if paths <= on_ray else 1 if paths & on_ray else 2
               for u, paths in modules.items()}  # fmt: skip

    def rank(item: pytest.Item) -> tuple[bool, int, int, bool, bool, bool, int]:
        rel = rel_path(item)
        fast_first = LONGEST_FAST.index(rel) if rel in LONGEST_FAST else len(LONGEST_FAST)
        group = shared_group(rel)  # a group's modules together, the groups in SHARED's order
        shared = groups.index(group) if group is not None else len(groups)
        return (rel not in LONGEST, on_head[unit(item)], shared,
                item.path not in heavy, item.path not in on_ray, item.path in on_dashboard,
                fast_first)  # fmt: skip

    items.sort(key=rank)  # stable: the order within each group stays
    ran_all = {rel_path(i) for i in items}
    stale = [e for e in SLOW if e not in matched and e.split("::", 1)[0] in ran_all]
    stale += [m for m in (*LONGEST, *LONGEST_FAST) if not (HERE / m).is_file()]
    # every module that wants the dashboard is in its group, which names only modules that exist
    stale += sorted({_rel(str(m)) for m in on_dashboard} - set(SHARED["ray-dashboard"][0]))
    stale += [m for m in SHARED["ray-dashboard"][0] if not (HERE / m).is_file()]
    if stale:
        raise pytest.UsageError(
            f"tests/conftest.py SLOW, LONGEST or SHARED['ray-dashboard'] is stale: {stale}"
        )


def uses_ray_head(item: pytest.Item) -> bool:
    """Whether ``item`` uses the session's Ray head (directly or through another fixture)."""
    return "ray_head" in getattr(item, "fixturenames", ())


def wants_dashboard(item: pytest.Item) -> bool:
    """Whether ``item`` uses the head's dashboard (marked ``ray_dashboard``)."""
    return uses_ray_head(item) and item.get_closest_marker("ray_dashboard") is not None


#: this worker's live Ray head, if any, and whether the next one to start runs the dashboard
_HEAD: dict[str, RayHead | None] = {"live": None}
_WANT = {"dashboard": False}
#: the modules (paths) with a test on the Ray head, and those with a test that wants its
#: dashboard (:func:`pytest_collection_modifyitems`): the head's life is decided per module
_MODULES: dict[str, set[Path]] = {"ray": set(), "dashboard": set()}


def module_wants_dashboard(item: pytest.Item) -> bool:
    """Whether a test of ``item``'s module wants the head's dashboard: the head of every test of
    that module then runs it (a module whose tests differ would otherwise restart the head)."""
    return item.path in _MODULES["dashboard"]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A Ray head started for ``item`` runs the dashboard when ``item``'s module wants it."""
    _WANT["dashboard"] = module_wants_dashboard(item)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Finish what a fixture holds once this worker's next test does not need it (the session's
    end does otherwise): pytest finishes the fixture, and those that use it, as at the
    session's end, and a later test that asks for it starts it again.

    - A :data:`SHARED` group's fixtures, once the next test is outside the group.
    - The Ray head, once the next test is in a module with no test on the head, or in a module
      that wants the dashboard where the head runs none or the other way round. A module's
      tests off the head keep it: six modules mix tests on and off the head or with and
      without its dashboard (2026-12-07: ten switches in their order), each switch was a stop
      and a start of the head (~8 CPU-s)."""
    group = shared_group(rel_path(item))
    if group is not None and (nextitem is None or shared_group(rel_path(nextitem)) != group):
        for name in SHARED[group][1]:
            finish_fixture(item, name)
    live = _HEAD["live"]
    if nextitem is None or live is None:
        return
    on_head = nextitem.path in _MODULES["ray"]
    if not on_head or live.has_dashboard != module_wants_dashboard(nextitem):
        finish_fixture(item, "ray_head")


def rel_path(item: pytest.Item) -> str:
    """The path of ``item``'s module below tests/, as the lists here name it."""
    return _rel(str(item.path))


@functools.cache
def _rel(path: str) -> str:
    return Path(path).resolve().relative_to(HERE).as_posix()


def shared_group(rel: str) -> str | None:
    """The :data:`SHARED` group of the module at ``rel`` (below tests/), None when none."""
    return next((g for g, (pats, _) in SHARED.items() if any(fnmatch(rel, p) for p in pats)), None)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` with each :data:`SHARED` group as one work unit (one file each
    otherwise); any other mode is xdist's own."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedScopes(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            group = shared_group(scope.removeprefix("tests/"))
            return f"shared:{group}" if group is not None else scope

    return SharedScopes(config, log)


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """Each test leaves the root logger as it found it. A test that runs a regen command in
    process (``regen.cli.main.main``) gets its logging set up on the stderr pytest captured for
    that test; once the capture closes, every later log line in that worker printed "Logging
    error: I/O operation on closed file" into the CI's output. pytest's own handlers are its to
    add and remove."""
    root = logging.getLogger()
    handlers, level = set(root.handlers), root.level
    yield
    for h in root.handlers[:]:
        if h not in handlers and type(h).__module__ != "_pytest.logging":
            root.removeHandler(h)
    root.setLevel(level)


@dataclass(frozen=True)
class RayHead:
    address: str  #: GCS address, for ray.init(address=...) / --address
    temp_dir: Path  #: the head's --temp-dir: its session's logs, the actors' among them
    dashboard: str | None = None  #: the dashboard's URL, when the head runs one

    @property
    def has_dashboard(self) -> bool:
        return self.dashboard is not None

    @property
    def dashboard_url(self) -> str:
        """The job and state APIs (JobSubmissionClient, ``ray job submit --address``,
        ``ray.util.state``); only a test marked ``ray_dashboard`` gets a head that has them."""
        if self.dashboard is None:
            raise pytest.UsageError(
                "this Ray head runs no dashboard: mark the test `ray_dashboard` (tests/conftest.py)"
            )
        return self.dashboard


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def isolated_ray_env(home: Path) -> dict[str, str]:
    """os.environ without Ray leftovers: own HOME (regen's cache below it), auth off, venv bin
    first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH_TOKEN",))}
    env.pop("RAY_ADDRESS", None)
    env.update(
        HOME=str(home),
        REGEN_CACHE_DIR=str(home / ".cache" / "regen"),
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
        PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    return env


@pytest.fixture(scope="session")
def ray_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("ray-home")
    return isolated_ray_env(home)


def head_ready(head: RayHead, log: Path) -> bool:
    """Whether ``ray start`` has said it started (its node registered with the GCS) and, on a
    head with a dashboard, the job API answers."""
    if RAY_STARTED not in log.read_text(errors="replace"):
        return False
    if head.dashboard is None:
        return True
    from ray.job_submission import JobSubmissionClient

    try:
        JobSubmissionClient(head.dashboard).list_jobs()
    except Exception:
        return False
    return True


@dataclass(slots=True)
class _Started:
    """A ``ray start`` process that has said it started."""

    head: RayHead
    proc: subprocess.Popen[bytes]
    log: IO[bytes]


def start_head(ray_env: dict[str, str], dashboard: bool) -> _Started:
    """``ray start --head`` until it says it started: a start that exits first (a port taken
    between :func:`free_port` and Ray's bind, under load) is tried again on other ports, up to
    :data:`RAY_START_TRIES` times; the last failure shows the end of its log."""
    for attempt in range(1, RAY_START_TRIES + 1):
        # a short temp dir of its own: Ray's socket paths below it must stay under 107 bytes (a
        # pytest-xdist worker's basetemp is longer), removed with the head
        tmp = Path(tempfile.mkdtemp(prefix="regen-ray-"))
        gcs_port, dash_port = free_port(), free_port()
        argv = [
            str(VENV_BIN / "ray"), "start", "--head", "--block",
            f"--port={gcs_port}", "--node-ip-address=127.0.0.1",
            "--num-cpus=2", "--num-gpus=8",
            f"--include-dashboard={str(dashboard).lower()}", "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash_port}",
            f"--ray-client-server-port={free_port()}", f"--temp-dir={tmp}",
            "--disable-usage-stats", "--include-log-monitor=false",  # module docstring
            # every port explicit: fixed defaults (agent 52365, ...) collide with other heads
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
            f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
        ]  # fmt: skip
        log = (tmp / "ray-start.log").open("wb")
        env = {
            **ray_env,
            "REPORTER_UPDATE_INTERVAL_MS": str(RAY_REPORTER_INTERVAL_MS),
            **NO_PRESTART,
        }
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        head = RayHead(f"127.0.0.1:{gcs_port}", tmp,
                       f"http://127.0.0.1:{dash_port}" if dashboard else None)  # fmt: skip
        deadline = time.monotonic() + RAY_START_TIMEOUT_S
        while not head_ready(head, tmp / "ray-start.log"):
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        else:
            return _Started(head, proc, log)
        stop_group(proc, HEAD_STOP_TIMEOUT_S)
        log.close()
        said = (tmp / "ray-start.log").read_text(errors="replace").splitlines()[-40:]
        shutil.rmtree(tmp, ignore_errors=True)
        why = "did not come up" if proc.returncode in (None, -9, -15) else "exited"
        logging.getLogger(__name__).warning(
            "ray start %s (try %d of %d): %s", why, attempt, RAY_START_TRIES, said[-3:]
        )
    pytest.fail(f"ray start {why} {RAY_START_TRIES} times; the last log ends:\n" + "\n".join(said))


@pytest.fixture(scope="session")
def ray_head(ray_env: dict[str, str]) -> Iterator[RayHead]:
    """A real local Ray head: 2 CPUs, 8 logical GPUs, on 127.0.0.1; its dashboard when the test
    it starts for wants it (module docstring)."""
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.pop("RAY_ADDRESS", None)
    started: _Started | None = None
    try:
        started = start_head(ray_env, dashboard=_WANT["dashboard"])
        _HEAD["live"] = started.head
        yield started.head
    finally:
        _HEAD["live"] = None
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if started is not None:
            stop_group(started.proc, HEAD_STOP_TIMEOUT_S)
            started.log.close()
            shutil.rmtree(started.head.temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def demo_server(
    demo_target: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TransformersServer]:
    """``transformers serve`` of the demo target (regen.devkit.servers.TransformersServer),
    shared by the modules of :data:`SHARED`'s ``demo-server`` group and stopped after them."""
    from regen.devkit.servers import TransformersServer

    log = tmp_path_factory.mktemp("demo-serve") / "server.log"
    with TransformersServer(demo_target, log_path=log, startup_timeout_s=120) as srv:
        yield srv


@pytest.fixture(scope="session")
def demo_target() -> Path:
    """The demo target (regen.devkit.demo_target), built once per checkout into
    ``.cache/demo-model``: the build ``./scripts/demo`` serves (its key decides reuse)."""
    from regen.devkit.servers import build_demo_target

    return build_demo_target(REPO / ".cache" / "demo-model", REPO / "manifests" / "demo.yaml")
