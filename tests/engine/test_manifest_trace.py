"""Where the manifest goes from ``run_job``, traced statically (tests/engine/_manifest_trace.py):
it never goes back up to a caller's module, never reaches the modules below the driver (the
actors, the pool, the workers, the router, the row builder, the clients, the renderer: they take
:mod:`regen.engine.inputs`' records), in the engine it passes through the driver, the one
cut (:mod:`regen.engine.inputs`) and the fail-fast checks only, and outside it through the run
record (:mod:`regen.store.run`: run.json's fingerprint and settings, manifest.yaml) and the cut
of the sources (:func:`regen.sources.source_set`) only: planning, the plan index and the
readers take the :class:`regen.sources.SourceSet`.

Counted by this tracer on main before issue 44 (52b666f): 14 modules, 0 back-ups, 12 revisits
(pool, actor, worker, the renderer and the chat client among them); after it: 5 modules, 0
back-ups, 3 revisits (the driver, regen.engine.inputs, regen.store.run,
regen.sources.sourceset, regen.engine.failfast)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _manifest_trace import Tracer, trace_run_job
from test_signatures import BELOW_THE_DRIVER, offenders

REPO = Path(__file__).resolve().parents[2]
#: the engine's modules the manifest may reach: the driver, its one cut, the fail-fast checks
ENGINE_SIDE = {"regen.engine.driver", "regen.engine.inputs", "regen.engine.failfast"}
#: outside the engine: the run record, and the one cut of the sources
RECORD_AND_SOURCES = {"regen.store.run", "regen.sources.sourceset"}
#: planning, the plan index and the readers: they take the SourceSet, never the manifest
TAKE_THE_SOURCES = (
    "regen.plan.session",
    "regen.plan.index",
    "regen.plan.select",
    "regen.plan.bodies",
    "regen.store.planned",
    "regen.sources.stream",
    "regen.sources.adapters",
    "regen.sources.reader",
)


@pytest.fixture(scope="module")
def trace():
    return trace_run_job(REPO)


def test_the_manifest_never_goes_back_up_to_a_callers_module(trace) -> None:
    assert trace.backups == 0, trace.backup_edges


def test_the_manifest_stops_at_the_driver_and_its_one_cut(trace) -> None:
    assert not set(trace.modules) & set(BELOW_THE_DRIVER)
    engine = {m for m in trace.modules if m.startswith(("regen.engine", "regen.client"))}
    assert engine | {m for m in trace.modules if m.startswith("regen.template")} == ENGINE_SIDE


def test_the_manifest_passes_through_at_most_six_modules(trace) -> None:
    assert len(trace.modules) <= 6, trace.modules


def test_outside_the_engine_only_the_run_record_and_the_sources_cut_see_it(trace) -> None:
    assert set(trace.modules) - ENGINE_SIDE == RECORD_AND_SOURCES


@pytest.mark.parametrize("module_name", TAKE_THE_SOURCES)
def test_planning_and_the_readers_take_no_manifest(module_name: str) -> None:
    """Read from the live signatures (tests/engine/test_signatures.py's check)."""
    assert offenders(module_name) == []


def test_the_tracer_follows_what_it_claims(tmp_path: Path) -> None:
    """A made-up package: the manifest through a constructor, an attribute, an executor, a
    ``*args`` tuple and a Ray actor, back up to the caller's module, and a revisit."""
    pkg = tmp_path / "regen"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "engine" / "driver.py").write_text(
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from regen.engine.pool import Pool\n"
        "from regen.engine import low\n"
        "def helper(m):\n    return m\n"
        "class Session:\n"
        "    def __init__(self, manifest):\n        self.m = manifest\n"
        "    def go(self):\n"
        "        with ThreadPoolExecutor(1) as ex:\n"
        "            ex.submit(low.read, self.m)\n"
        "        Pool(self.m)\n"
        "def run_job(manifest):\n"
        "    s = Session(manifest)\n"
    )
    (pkg / "engine" / "low.py").write_text(
        "from regen.engine.driver import helper\ndef read(manifest):\n    helper(manifest)\n"
    )
    (pkg / "engine" / "pool.py").write_text(
        "from regen.engine.actor import actor_class\n"
        "from regen.engine import low\n"
        "class Pool:\n"
        "    def __init__(self, manifest):\n"
        "        self._args = (1, manifest)\n        self._cls = actor_class()\n"
        "        low.read(manifest)\n"
        "    def start(self):\n"
        "        self._cls.options().remote(*self._args)\n"
    )
    (pkg / "engine" / "actor.py").write_text(
        "import ray\n"
        "class Actor:\n    def __init__(self, n, manifest):\n        pass\n"
        "def actor_class():\n    return ray.remote(num_cpus=0)(Actor)\n"
    )
    t = Tracer(tmp_path).run("regen.engine.driver", "run_job", "manifest")
    assert sorted(t.modules) == [
        "regen.engine.actor", "regen.engine.driver", "regen.engine.low", "regen.engine.pool"
    ]  # fmt: skip
    assert ("regen.engine.pool.Pool.start", "regen.engine.actor.Actor.__init__",
            "manifest") in t.edges  # fmt: skip
    assert t.backups == 1 and t.backup_edges == [
        "regen.engine.low.read -> regen.engine.driver.helper"
    ]
    assert t.revisits == 2  # back to the driver, and to low a second time
