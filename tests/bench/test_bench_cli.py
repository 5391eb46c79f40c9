"""`regen bench` end to end through the real CLI: --run RUN_DIR (holdout.jsonl + the run's
manifest), the outputs, the API key never written or printed, and the one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from _bench_common import SIM, SPEC, prompts_file, regen_cli

from regen.bench.report import read_report
from regen.devkit.simulate.testing import RunningSimulator, running_simulator

KEY = "sk-cli-bench-secret-987"
MIX = {"sharegpt": 3, "xlam": 3, "magicoder": 3, "extra": 5}


def make_run(tmp: Path) -> Path:
    run = tmp / "run"
    (run / "export").mkdir(parents=True)
    prompts_file(run / "export" / "holdout.jsonl", MIX)
    manifest = {
        "name": "bench-test",
        "target": {"model": "moonshotai/Kimi-K2.5", "tokenizer": "tok"},
        "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 4096, "seed": 3},
        "sources": [
            {"name": "sharegpt", "adapter": "sharegpt", "path": "a.jsonl"},
            {"name": "xlam", "adapter": "xlam", "path": "b.jsonl"},
            {"name": "magicoder", "adapter": "magicoder", "path": "c.jsonl"},
            {"name": "extra", "adapter": "glaive", "path": "d.jsonl"},
        ],
    }
    (run / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    return run


def test_bench_cli_with_a_run_dir_and_an_api_key(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    with (
        running_simulator(**SIM, api_key=KEY) as base,
        running_simulator(**SIM, **SPEC, speculative_algorithm="EAGLE3", api_key=KEY) as spec,
    ):
        out = regen_cli(
            "bench",
            "--baseline",
            base.url,
            "--speculative",
            spec.base,
            "--run",
            str(run),
            "--per-source",
            "2",
            "--concurrency",
            "4,1",
            "--max-tokens",
            "16",
            "--api-key-env",
            "BENCH_CLI_KEY",
            env={"BENCH_CLI_KEY": KEY},
        )
        sent = base.stats()["completion_tokens"]
    assert out.returncode == 0, out.stderr
    bench_dir = run / "bench"
    rep = read_report(bench_dir / "bench.json")
    assert rep.settings.concurrency == [1, 4] and rep.settings.prompts == 8
    assert rep.settings.run_dir == str(run) and rep.settings.api_key_env == "BENCH_CLI_KEY"
    # the run's sampling, with --max-tokens
    assert rep.settings.sampling["temperature"] == 0.0 and rep.settings.sampling["seed"] == 3
    assert rep.settings.sampling["max_tokens"] == 16
    assert [s.source for s in rep.sources] == ["sharegpt", "xlam", "magicoder", "extra"]
    assert rep.source("extra").kind == "tool-calling"  # adapter glaive, from the run's manifest
    assert all(s.prompts == 2 for s in rep.sources)
    lines = [json.loads(x) for x in (bench_dir / "requests.jsonl").read_text().splitlines()]
    levels = sum(lv.baseline.requests + lv.speculative.requests for lv in rep.levels)
    assert len([x for x in lines if x["role"] != "pass"]) == levels == 2 * (8 + 8)
    assert all(x["ok"] and x["completion_tokens"] == 16 for x in lines)
    base_tokens = sum(x["completion_tokens"] for x in lines if x["role"] == "baseline")
    assert sent == base_tokens + 16  # + the warm-up request
    page = (bench_dir / "bench.html").read_text()
    assert 'id="plot-throughput"' in page and 'id="plot-acceptance"' in page
    # the terminal output: tables and verdicts
    assert "regen bench · moonshotai/Kimi-K2.5" in out.stdout
    assert "acceptance per source" in out.stdout and "EAGLE3 draft:" in out.stdout
    assert "bench.json" in out.stdout and "bench.html" in out.stdout
    # the key never lands anywhere
    for text in (out.stdout, out.stderr, *(p.read_text() for p in bench_dir.iterdir())):
        assert KEY not in text


@pytest.mark.parametrize(
    ("extra", "expect"),
    [
        (["--run", "{tmp}/empty-run"], "export/holdout.jsonl"),
        (["--prompts", "{prompts}", "--concurrency", "1"], "unreachable"),
        (["--prompts", "{prompts}", "--api-key-env", "BENCH_UNSET_KEY"], "BENCH_UNSET_KEY"),
        (["--prompts", "{prompts}", "--concurrency", "1,zero"], "--concurrency"),
        (["--prompts", "{prompts}", "--run", "{tmp}"], "not allowed with"),
        (["--prompts", "{tmp}/missing.jsonl"], "cannot read prompts file"),
        (["--prompts", "{prompts}", "--per-source", "0"], "--per-source must be >= 1"),
        (["--prompts", "{prompts}", "--temperature", "-1"], "--temperature: temperature"),
    ],
)
def test_bench_cli_errors_are_one_line(
    tmp_path: Path, sim_base: RunningSimulator, extra: list[str], expect: str
) -> None:
    (tmp_path / "empty-run").mkdir()
    prompts = prompts_file(tmp_path / "p.jsonl", {"a": 2})
    args = [a.format(tmp=tmp_path, prompts=prompts) for a in extra]
    out = regen_cli(
        "bench", "--baseline", sim_base.url, "--speculative", "http://127.0.0.1:9", *args
    )
    assert out.returncode == 2
    assert expect in out.stderr and "Traceback" not in out.stderr
