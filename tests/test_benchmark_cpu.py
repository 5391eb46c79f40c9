"""benchmarks/cpu.py's openai baseline at a tiny size: an asyncio pool of the official
``openai.AsyncOpenAI`` client (``openai_pool_cpu``, also imported by other benchmarks) sends
regen's very requests to a ``regen simulate`` and its process CPU is read from ``/proc``; and
the benchmark's own command runs it beside regen's own-client pool. Counts and request keys
are asserted, never a time or a CPU figure's size (the suite shares its cores)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import cpu
from benchmarks._workload import MODEL, TOKENIZER, write_workload
from regen.devkit.simulate.testing import running_simulator
from regen.manifest import load_manifest
from regen.sources import read_samples, source_set

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_openai_pool_sends_regens_requests_and_measures_its_cpu(tmp_path: Path) -> None:
    m = load_manifest(write_workload(tmp_path, 6))
    m = m.model_copy(update={"sampling": m.sampling.model_copy(update={"token_ids": "stream"})})
    samples = list(read_samples(source_set(m)))
    turns = sum(1 for s in samples for msg in s.messages if msg.role == "assistant")
    log = tmp_path / "requests.jsonl"
    one = [{"role": "user", "content": "one request, no conversation"}]
    sim = {"instant": True, "mean_tokens": 16, "tokenizer": str(TOKENIZER), "request_log": log}
    with running_simulator(model_name=MODEL, **sim) as s:
        body = cpu.body_fields(m, s.url)
        r = cpu.openai_pool_cpu(s.url, m.target.model, [*samples, one], 3, body=body)
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    assert r["conversations"] == len(samples) + 1
    assert r["requests"] == len(sent) == turns + 1
    assert all(x["status"] == 200 and x["stream"] for x in sent)
    # the body's sampling and id switches reached the server: every answer carried its ids
    assert body["max_completion_tokens"] == m.sampling.max_tokens
    assert body["return_output_ids_in_sglext"] is True
    assert r["server_ids"] == r["requests"]
    assert r["completion_tokens"] == sum(x["completion_tokens"] for x in sent)
    assert r["concurrency"] == 3
    assert 0 <= r["startup_cpu_s"] <= r["whole_cpu_s"]
    assert 0 <= r["window_cpu_s"] <= r["whole_cpu_s"]
    assert r["whole_cpu_s"] > 0  # the interpreter and `import openai` at least
    assert r["per_1000_whole"] == pytest.approx(1000 * r["whole_cpu_s"] / r["requests"])
    assert r["per_1000_window"] == pytest.approx(1000 * r["window_cpu_s"] / r["requests"])


def test_openai_pool_raises_when_the_server_is_gone(tmp_path: Path) -> None:
    with running_simulator(model_name=MODEL, instant=True) as s:
        url = s.url
    with pytest.raises(RuntimeError, match="openai pool failed"):
        cpu.openai_pool_cpu(url, MODEL, [[{"role": "user", "content": "hi"}]], 1)


def test_the_benchmark_runs_the_openai_pool_beside_regens_own_client_pool() -> None:
    argv = [sys.executable, str(REPO / "benchmarks" / "cpu.py"), "--conversations", "4",
            "--modes", "local", "--only", "pool", "openai"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any(line.startswith("openai local ") for line in lines), out.stdout
    assert any(line.startswith("requests (local): every contender sent the same") for line in lines)
    assert any(line.startswith("  openai ") for line in lines), out.stdout
    assert any(line.startswith("ratio (local): pool / openai = ") for line in lines), out.stdout
