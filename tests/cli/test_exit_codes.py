"""Exit codes orchestration can trust (regen.cli.main, README "Exit codes"): 0 only when every
sample is done or permanently failed, 75 when samples are left for the next run, 2 for a
configuration error, 130 interrupted; the same through `regen run`, `regen demo`'s summary
and the `ray job submit` entrypoint (tests/pipelines; runs that leave samples:
tests/reliability/test_endpoint_faults_run.py)."""

from __future__ import annotations

import argparse

import pytest

from regen.cli.main import EXIT_CONFIG, EXIT_DONE, EXIT_INTERRUPTED, EXIT_LEFT, invoke, main
from regen.cli.run import exit_code
from regen.core.errors import ConfigError, NoEndpointLeftError, RunIncompleteError
from regen.engine import JobSummary
from regen.store.progress import SourceProgress


def summary(
    state: str = "finished", *, total: int, done: int, failed_permanent: int = 0, **kw
) -> JobSummary:
    """A session's summary over one source with these totals (the summary's own counters)."""
    src = SourceProgress(total=total, done=done, failed=failed_permanent)
    return JobSummary(run_dir="r", session="s", state=state, sources={"s": src}, **kw)


@pytest.mark.parametrize(
    ("s", "code"),
    [
        (summary(total=5, done=5), EXIT_DONE),
        (summary(total=5, done=3, failed_permanent=2), EXIT_DONE),  # counted, not retried
        (summary(total=5, done=4, failed_transient=1), EXIT_LEFT),
        (summary("interrupted", total=5, done=2), EXIT_INTERRUPTED),
        (summary("failed", total=5, done=2), EXIT_LEFT),
    ],
)
def test_a_session_exits_0_only_when_nothing_is_left(s: JobSummary, code: int) -> None:
    assert exit_code(s) == code


def test_the_codes_are_distinct() -> None:
    assert len({EXIT_DONE, EXIT_CONFIG, EXIT_LEFT, EXIT_INTERRUPTED}) == 4
    assert EXIT_LEFT == 75  # sysexits' EX_TEMPFAIL: "try again later"


def ns() -> argparse.Namespace:
    return argparse.Namespace(log_level="WARNING")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (NoEndpointLeftError("no endpoint left: http://h/v1: HTTP 403"), EXIT_LEFT),
        (RunIncompleteError("all workers died"), EXIT_LEFT),
        (ConfigError("manifest: bad"), EXIT_CONFIG),
    ],
)
def test_every_entrypoint_maps_errors_by_type(capsys, error: Exception, code: int) -> None:
    def command(_args: argparse.Namespace) -> int:
        raise error

    assert invoke(command, ns()) == code
    err = capsys.readouterr().err
    assert err.startswith("error:") and str(error) in " ".join(err.split())
    assert "Traceback" not in err


def test_a_misspelt_key_is_a_configuration_error(tmp_path, capsys) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("name: x\ntarget: {model: m, tokenizer: t}\nsources:\n"
                    "  - {name: s, adaptor: sharegpt, path: s.jsonl}\n")  # fmt: skip
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--no-view"]) == EXIT_CONFIG
