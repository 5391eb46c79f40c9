"""The benchmarks' one /proc sampler (benchmarks/_proctree.py): real processes get the group
its rule gives them, their CPU adds up over a window, and run_measured sees a command's
memory. Lower bounds only on CPU and memory (the suite shares its cores)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from benchmarks._proctree import TreeSampler, run_measured

#: a process whose command line is the first argument: `exec -a TITLE sleep S`
TITLED = "exec -a {title} sleep {s}"

CHILD = """
import subprocess, sys, time
t = time.process_time()
while time.process_time() - t < 0.3:
    pass
kids = [subprocess.Popen(["bash", "-c", f"exec -a {title} sleep 0.6"])
        for title in sys.argv[1:]]
for k in kids:
    k.wait()
"""


def test_every_process_gets_its_group_and_the_cpu_adds_up(tmp_path: Path) -> None:
    (tmp_path / "child.py").write_text(CHILD)
    s = TreeSampler(interval=0.05, group="harness").start()
    t0 = time.monotonic()
    try:
        # a registered tool whose children are an actor, a Ray daemon and a helper of its own
        kids = ["ray::regen-s1-w0-0", "/v/site-packages/ray/raylet", "helper"]
        tool = subprocess.Popen([sys.executable, str(tmp_path / "child.py"), *kids])
        s.register(tool.pid, "tool:x")
        # unregistered children of this process: a Ray daemon and a plain one
        others = [subprocess.Popen(["bash", "-c", TITLED.format(title=t, s=0.6)])
                  for t in ("/v/site-packages/ray/gcs_server", "plain")]  # fmt: skip
        for p in (tool, *others):
            assert p.wait(timeout=60) == 0
        t1 = time.monotonic()
    finally:
        s.stop()
    by_cmd = {p.cmd.split(" ", 1)[0]: p.group for p in s.procs.values()}
    assert by_cmd["ray::regen-s1-w0-0"] == "actors"
    assert by_cmd["/v/site-packages/ray/raylet"] == "ray"
    assert by_cmd["helper"] == "tool:x"
    assert by_cmd["/v/site-packages/ray/gcs_server"] == "ray"
    assert by_cmd["plain"] == "harness"
    assert [p.group for p in s.procs.values() if p.pid == tool.pid] == ["tool:x"]
    used = s.between(t0, t1)
    assert used["tool:x"] >= 0.2  # its 0.3 s spin, give or take the last sample
    assert set(s.between(t0, t1, "tool")) == {"tool:x"}
    assert s.count("actors") == 1
    assert s.busy_between(t0, t1) >= used["tool:x"] - 0.05  # the machine ran it
    cores = s.machine(t0, t1)
    assert cores["others"] >= 0 and cores["all"] > 0 and cores["cores"] >= 1


def test_a_groups_readings_are_zero_filled_and_the_root_is_its_own() -> None:
    proc = subprocess.Popen(["bash", "-c", "sleep 0.3"])
    s = TreeSampler(proc.pid, 0.05, group="root", below="ray", groups=("root", "actors", "ray"))
    s.start()
    proc.wait(timeout=30)
    s.stop()
    assert set(s.total()) == {"root", "actors", "ray"}
    assert [p.group for p in s.procs.values()] == ["root"]


def test_run_measured_sees_the_commands_memory_and_registers_it() -> None:
    s = TreeSampler(interval=0.05, group="harness")
    code = "x = bytearray(80_000_000); import time; time.sleep(0.5); print('done')"
    m = run_measured([sys.executable, "-c", code], sampler=s, group="tool:m")
    assert (m.rc, m.stdout.strip()) == (0, "done")
    assert m.peak_tree_rss >= 80_000_000 and m.maxrss >= 80_000_000
    assert m.wall_s >= 0.5
    assert s.roots[next(iter(s.roots.keys() - {s.root}))] == ("tool:m", "tool:m")
