"""Endpoint-wide faults through `regen run`: a gateway in front of `regen simulate` that starts
refusing (403 halfway through, 401, an HTML page with HTTP 200) takes the endpoint out; the run
stops with the "left for the next run" exit code, records no sample as failed and says what to
fix; once the gateway is fine again, the same command finishes with every sample exactly once.
And the user's --concurrency is what the server sees at most.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from _gateway import HTML_PAGE, Gateway, Refusal
from _reliability import chaos

from regen.cli.main import EXIT_DONE, EXIT_LEFT, main
from regen.client.endpoints import server_root
from regen.devkit.simulate.testing import running_simulator
from regen.store import RunDir
from regen.store.doneset import read_done
from regen.store.failures import read_failures

pytestmark = pytest.mark.ray

SAMPLES = 40
CAP = 4  #: --concurrency of the refusal runs (and the bound on what is sent once refused)
#: 64 batch slots reported, ~0.1 s per answer: requests overlap, the run lasts a few seconds
SIM = {"model_name": chaos.MODEL, "max_running_requests": 64, "step_ms": 4.0,
       "mean_tokens": 24.0, "length_sigma": 0.3}  # fmt: skip


@pytest.fixture(scope="module")
def sim():
    with running_simulator(**SIM) as s:
        yield s


def run(work: Path, url: str, ray_head, ray_env, *extra: str) -> subprocess.CompletedProcess:
    """`regen run` of SAMPLES samples against ``url`` (``extra``: more flags)."""
    manifest = work / "manifest.yaml"
    if not manifest.exists():
        src = chaos.write_sharegpt(work / "source.jsonl", SAMPLES, seed=5)
        chaos.write_manifest(manifest, src, engine={"workers": 2})
    cmd = chaos.regen_cmd(manifest, work / "run", url, ray_head.address, *extra)
    cmd[cmd.index("WARNING")] = "INFO"  # the start-up line names the limit
    return subprocess.run(cmd, env=ray_env, capture_output=True, text=True, timeout=300)


def one_line(text: str) -> str:
    return " ".join(text.split())


def assert_nothing_failed(out: Path) -> None:
    """No failure of any kind on record: the refusals were the endpoint's, not the samples'."""
    rd = RunDir.open(str(out), create=False)
    assert read_failures(rd) == {}


@pytest.fixture(scope="module")
def halfway(tmp_path_factory, sim, ray_head, ray_env) -> dict[str, Any]:
    """The chaos run: 403 from the gateway after half the chat requests, then a healed rerun."""
    work = tmp_path_factory.mktemp("gw403")
    with Gateway(server_root(sim.url)).running() as gw:
        gw.refuse_after = SAMPLES // 2  # requests: samples have 1-3 turns, so ~a quarter done
        first = run(work, gw.url, ray_head, ray_env, "--concurrency", str(CAP))
        sent, refused = gw.chat, gw.refused
        rd = RunDir.open(str(work / "run"), create=False)
        done_first = len(read_done(rd).ids)
        failures_first = read_failures(rd)
        gw.heal()
        second = run(work, gw.url, ray_head, ray_env, "--concurrency", str(CAP))
    verdict = chaos.verify(work / "manifest.yaml", work / "run", chaos.answer_config(SIM))
    return {"first": first, "second": second, "sent": sent, "refused": refused, "work": work,
            "done_first": done_first, "failures_first": failures_first,
            "verdict": verdict}  # fmt: skip


def test_the_first_run_stops_with_the_left_for_the_next_run_code(halfway) -> None:
    r = halfway["first"]
    assert r.returncode == EXIT_LEFT, r.stderr[-3000:]
    err = one_line(r.stderr)
    assert "no endpoint left" in err and "HTTP 403" in err
    assert "blocked by gateway policy" in err  # the body's excerpt
    assert "run the same command again to continue" in err
    assert halfway["sent"] > SAMPLES // 2  # half the requests went through before the 403s
    assert halfway["done_first"] < SAMPLES


def test_no_sample_is_recorded_as_failed_for_the_403(halfway) -> None:
    assert halfway["failures_first"] == {}


def test_the_refusing_endpoint_is_not_hammered(halfway) -> None:
    # what was in flight when the refusals began, and no more: a retry loop or a burnt queue
    # would send one per sample and try
    assert 1 <= halfway["refused"] <= 2 * CAP + 2


def test_the_rerun_finishes_with_nothing_lost_and_nothing_doubled(halfway) -> None:
    r = halfway["second"]
    assert r.returncode == EXIT_DONE, r.stderr[-3000:]
    v = halfway["verdict"]
    assert v.problems == []
    assert (v.inputs, v.stored, v.missing, v.unexpected, v.duplicates) == (SAMPLES, SAMPLES, 0,
                                                                           0, 0)  # fmt: skip
    assert v.failures == 0 and v.state == "finished"
    assert_nothing_failed(halfway["work"] / "run")


@pytest.mark.parametrize(
    ("refusal", "expect"),
    [
        (Refusal(401, b'{"error": "Unauthorized"}'), ["HTTP 401", "Unauthorized", "api_key_env"]),
        (HTML_PAGE, ["not the OpenAI chat protocol", "text/html", "Sign in - Corp Gateway"]),
    ],
    ids=["401", "html-200"],
)
def test_a_gateway_that_refuses_from_the_start_stops_the_run_non_zero(
    tmp_path, sim, ray_head, ray_env, refusal: Refusal, expect: list[str]
) -> None:
    with Gateway(server_root(sim.url)).running() as gw:
        gw.refuse_after, gw.refusal = 0, refusal
        r = run(tmp_path, gw.url, ray_head, ray_env, "--concurrency", str(CAP))
        refused = gw.refused
    assert r.returncode == EXIT_LEFT, r.stderr[-3000:]
    err = one_line(r.stderr)
    assert "no endpoint left" in err and all(e in err for e in expect), err[-2000:]
    assert "ended without finish_reason" not in err
    assert_nothing_failed(tmp_path / "run")
    assert 1 <= refused <= 2 * CAP + 2
    rd = RunDir.open(str(tmp_path / "run"), create=False)
    assert read_done(rd).ids == set()


def test_one_refusing_endpoint_of_two_leaves_with_one_line_and_the_run_finishes(
    tmp_path, sim, ray_head, ray_env
) -> None:
    with Gateway(server_root(sim.url)).running() as gw:
        gw.refuse_after = 0
        r = run(tmp_path, gw.url, ray_head, ray_env, "--endpoint", sim.url)
    assert r.returncode == EXIT_DONE, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if "out of rotation" in line]
    assert len(lines) == 1, lines
    assert gw.url in lines[0] and "HTTP 403" in lines[0] and "blocked by gateway policy" in lines[0]
    assert_nothing_failed(tmp_path / "run")
    rd = RunDir.open(str(tmp_path / "run"), create=False)
    assert len(read_done(rd).ids) == SAMPLES


def test_concurrency_is_an_upper_bound_on_what_the_server_sees(
    tmp_path, sim, ray_head, ray_env
) -> None:
    src = chaos.write_sharegpt(tmp_path / "source.jsonl", SAMPLES, seed=6)
    chaos.write_manifest(tmp_path / "manifest.yaml", src, engine={"workers": 1,
                                                                  "concurrency": None})  # fmt: skip
    with Gateway(server_root(sim.url)).running() as gw:
        r = run(tmp_path, gw.url, ray_head, ray_env, "--workers", "1", "--concurrency", str(CAP))
        peak = gw.peak
    assert r.returncode == EXIT_DONE, r.stderr[-3000:]
    assert 1 < peak <= CAP  # the server reports 64 slots: the automatic limit would be 72
    err = one_line(r.stderr)
    assert f"starting in-flight limits [{CAP}]" in err
    assert (f"capped by engine.concurrency / --concurrency = {CAP}, below the servers' batch "
            "slots + 1/8 = 72") in " ".join(err.split())  # fmt: skip


def test_samples_out_of_retries_exit_75_until_a_rerun_finishes_them(tmp_path, ray_head) -> None:
    """Every request's first try answers 500 and a request has one try: samples are left for
    the next run (75, training not submitted), the way a wrapper loops until 0. Each rerun gets
    one more turn of every conversation through (each turn's first try fails), so samples of at
    most three turns finish by the fourth run."""
    src = chaos.write_sharegpt(tmp_path / "s.jsonl", 6)
    path = chaos.write_manifest(tmp_path / "m.yaml", src, engine={"workers": 1,
                                                                 "max_attempts": 1})  # fmt: skip
    out = tmp_path / "run"
    codes: list[int] = []
    with running_simulator(model_name=chaos.MODEL, instant=True, mean_tokens=8,
                           fault_sequence="500") as sim:  # fmt: skip
        argv = ["run", str(path), "--out", str(out), "--endpoint", sim.url, "--no-view",
                "--address", ray_head.address]  # fmt: skip
        codes.append(main([*argv, "--then-train", str(tmp_path / "never-read.yaml")]))
        while codes[-1] == EXIT_LEFT and len(codes) < 5:
            codes.append(main(argv))
    assert codes[0] == EXIT_LEFT and codes[-1] == EXIT_DONE
    assert set(codes[:-1]) == {EXIT_LEFT}
    v = chaos.verify(path, out, chaos.answer_config({"model_name": chaos.MODEL,
                                                     "mean_tokens": 8}))  # fmt: skip
    assert (v.stored, v.missing, v.duplicates) == (6, 0, 0)
