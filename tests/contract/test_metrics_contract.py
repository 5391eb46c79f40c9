"""The engines' /metrics pages, held against the engines' own code.

- SGLang 0.5.23: the names, types and label names regen reads and the simulator writes are the
  ones the wheel's ``observability/metrics_collector.py`` declares (read with ``ast``:
  tests/contract/_metric_source.py), its scheduler labels from ``init_new``'s label dict and
  its tokenizer labels from ``tokenizer_metric_labels``;
- vLLM 0.32: the same against ``v1/metrics/loggers.py`` and ``v1/spec_decode/metrics.py`` of
  the vLLM environment (scripts/vllm-env; skipped, saying so, where it is not installed), and
  a page in vLLM's format parsed into the load regen schedules by. tests/engines holds the
  simulator's vLLM page against a real vLLM server's.
"""

from __future__ import annotations

import ast
import os
import time
from pathlib import Path

import _metric_source as src
import _sglang
import pytest

from regen.client.profiles import SGLANG, VLLM
from regen.client.server_load import MetricNames, parse_page, read_load
from regen.devkit.simulate.testing import EAGLE3_OPTIONS, simulator_in_thread

REPO = Path(__file__).resolve().parents[2]

#: the type each MetricNames field is read as
FIELD_TYPES = {
    "running": "gauge",
    "queued": "gauge",
    "kv_usage": "gauge",
    "gen_throughput": "gauge",
    "spec_accept_length": "gauge",
    "generation_tokens": "counter",
    "prompt_tokens": "counter",
    "aborted": "counter",
    "refused": "counter",
    "spec_drafts": "counter",
    "spec_accepted": "counter",
}


def family(sample_name: str, kind: str) -> str:
    """The family a sample name belongs to (a counter's sample carries ``_total``)."""
    return sample_name.removesuffix("_total") if kind == "counter" else sample_name


def check_names(names: MetricNames, declared: dict[str, src.Declared]) -> None:
    """Every series a profile reads is declared by the engine's code, with the type read."""
    for field, kind in FIELD_TYPES.items():
        name = getattr(names, field)
        if name is None:
            continue
        fam = family(name, kind)
        assert fam in declared, f"{field}: {name} is not declared by the engine's code"
        assert declared[fam].type == kind, (field, name, declared[fam])


def page_families(text: str, prefix: str) -> dict[str, tuple[str, frozenset[str]]]:
    """The page's own families with series (``prometheus_client``'s ``_created`` companions
    left out; a labelled histogram nothing was observed in has no series to read labels of)."""
    page = parse_page(text)
    return {
        f.name: (f.type, f.labels)
        for f in page.families.values()
        if f.name.startswith(prefix) and not f.name.endswith("_created") and f.samples
    }


def check_page(
    text: str, prefix: str, declared: dict[str, src.Declared], optional: set[str]
) -> dict[str, tuple[str, frozenset[str]]]:
    """Each family of a page is one the engine declares, of its type, with its labels (and
    only the ``optional`` ones the engine adds on some servers)."""
    fams = page_families(text, prefix)
    assert fams
    for name, (kind, labels) in fams.items():
        assert name in declared, f"{name} is not declared by the engine's code"
        d = declared[name]
        assert kind == d.type, (name, kind, d)
        assert d.labels is not None and d.labels <= labels <= d.labels | optional, (name, labels)
    return fams


# ---- SGLang ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sglang_collector() -> Path:
    _sglang.check_version()
    return _sglang.wheel_root() / "srt" / "observability" / "metrics_collector.py"


@pytest.fixture(scope="module")
def sglang_declared(sglang_collector: Path) -> dict[str, src.Declared]:
    base = {
        "SchedulerMetricsCollector": src.dict_keys(sglang_collector, "init_new"),
        "TokenizerMetricsCollector": src.dict_keys(sglang_collector, "tokenizer_metric_labels"),
    }
    assert base["SchedulerMetricsCollector"][0] == "model_name"
    return src.declared(sglang_collector, "sglang:", base)


def test_sglang_label_dicts_are_what_the_simulator_sets(sglang_collector: Path) -> None:
    from regen.devkit.simulate.metrics_page import SGLANG_SCHEDULER_LABELS, SGLANG_TOKENIZER_LABELS

    assert src.dict_keys(sglang_collector, "init_new") == SGLANG_SCHEDULER_LABELS
    assert src.dict_keys(sglang_collector, "tokenizer_metric_labels") == SGLANG_TOKENIZER_LABELS
    # dp_rank (and priority, with priority scheduling) are added only on some servers
    assert "dp_rank" in src.subscript_keys(sglang_collector, "init_new")


def test_what_regen_reads_of_sglang_is_declared_by_the_wheel(sglang_declared) -> None:
    check_names(SGLANG.metrics, sglang_declared)
    # the gauges regen reads are the scheduler's, the counters the tokenizer manager's
    assert sglang_declared["sglang:num_queue_reqs"].owner == "SchedulerMetricsCollector"
    assert sglang_declared["sglang:generation_tokens"].owner == "TokenizerMetricsCollector"


@pytest.mark.parametrize("dp_size", [1, 2])
def test_the_simulators_sglang_page_is_the_wheels(sglang_declared, dp_size: int) -> None:
    opts = {**EAGLE3_OPTIONS, "enable_metrics": True, "dp_size": dp_size,
            "max_running_requests": 4, "background_requests": 6,
            "background_max_tokens": 1_000_000}  # fmt: skip
    with simulator_in_thread(**opts) as sim:
        text = _settled(sim, want_running=4)
    optional = {"dp_rank"} if dp_size > 1 else set()
    fams = check_page(text, "sglang:", sglang_declared, optional)
    declared_here = parse_page(text).families
    for field, kind in FIELD_TYPES.items():  # every series regen reads is on the page
        name = getattr(SGLANG.metrics, field)
        if name is not None:
            assert family(name, kind) in declared_here, name
    if dp_size > 1:
        assert "dp_rank" in fams["sglang:num_running_reqs"][1]
    load = read_load(parse_page(text).samples, SGLANG.metrics, at=time.monotonic())
    assert (load.running, load.queued) == (4, 2)


def _settled(sim, want_running: int) -> str:
    """The page once the background client's requests are admitted (a step or two)."""
    deadline = time.monotonic() + 30
    while True:
        stats = sim.stats()
        if stats["running"] == want_running or time.monotonic() > deadline:
            return sim.metrics_text()
        time.sleep(0.05)


# ---- vLLM --------------------------------------------------------------------------------


def _vllm_source() -> Path | None:
    venv = Path(os.environ.get("REGEN_VLLM_VENV") or REPO / ".venv-vllm")
    found = sorted(venv.glob("lib/python3*/site-packages/vllm/v1/metrics/loggers.py"))
    return found[0].parents[2] if found else None


@pytest.fixture(scope="module")
def vllm_declared() -> dict[str, src.Declared]:
    root = _vllm_source()
    if root is None:
        pytest.skip("no vLLM environment (.venv-vllm): run scripts/vllm-env (scripts/test does)")
    labels = ("model_name", "engine")
    loggers = root / "v1" / "metrics" / "loggers.py"
    out = src.declared(loggers, "vllm:", {}, default=labels)
    spec = root / "v1" / "spec_decode" / "metrics.py"
    out |= src.declared(spec, "vllm:", {}, default=labels)
    # the spec counters are named in a list of (name, doc) pairs fed to self._counter_cls
    tree = ast.parse(spec.read_text(encoding="utf-8"))
    fed = any(
        isinstance(n, ast.Call) and src._callee(n) == "_counter_cls"
        and any(k.arg == "name" and isinstance(k.value, ast.Name) for k in n.keywords)
        for n in ast.walk(tree)
    )  # fmt: skip
    assert fed
    for n in ast.walk(tree):
        if isinstance(n, ast.Tuple) and n.elts and isinstance(n.elts[0], ast.Constant):
            name = n.elts[0].value
            if isinstance(name, str) and name.startswith("vllm:spec_decode"):
                out.setdefault(name, src.Declared(name, "counter", frozenset(labels), "spec"))
    return out


def test_what_regen_reads_of_vllm_is_declared_by_vllm(vllm_declared) -> None:
    check_names(VLLM.metrics, vllm_declared)
    assert vllm_declared["vllm:admission_rejections"].labels == {"model_name", "reason"}


@pytest.mark.parametrize("speculative", [False, True])
def test_the_simulators_vllm_page_is_vllms(vllm_declared, speculative: bool) -> None:
    opts = {"engine": "vllm", "max_running_requests": 2, "background_requests": 3,
            "background_max_tokens": 1_000_000}  # fmt: skip
    if speculative:
        opts |= EAGLE3_OPTIONS
    with simulator_in_thread(**opts) as sim:
        text = _settled(sim, want_running=2)
    fams = check_page(text, "vllm:", vllm_declared, set())
    assert ("vllm:spec_decode_num_drafts" in fams) is speculative
    load = read_load(parse_page(text).samples, VLLM.metrics, at=time.monotonic())
    assert (load.running, load.queued) == (2, 1)


#: a page in vLLM 0.32's format (its families, types and labels; two engine cores, as a
#: data-parallel server has), as a scraper meets it
VLLM_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="k2"} 30.0
vllm:num_requests_running{engine="1",model_name="k2"} 28.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="k2"} 3.0
vllm:num_requests_waiting{engine="1",model_name="k2"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="k2"} 0.71
vllm:kv_cache_usage_perc{engine="1",model_name="k2"} 0.64
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="k2"} 120000.0
vllm:generation_tokens_total{engine="1",model_name="k2"} 100000.0
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{engine="0",model_name="k2"} 1.79e+09
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="k2"} 9000.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="k2"} 90.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="k2"} 4.0
vllm:request_success_total{engine="1",finished_reason="abort",model_name="k2"} 1.0
# HELP vllm:admission_rejections_total Number of admission attempts rejected by a queue limit.
# TYPE vllm:admission_rejections_total counter
vllm:admission_rejections_total{model_name="k2",reason="max_num_queued_reqs"} 7.0
vllm:admission_rejections_total{model_name="k2",reason="max_num_queued_tokens"} 0.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="k2"} 400.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="k2"} 600.0
"""


def test_the_vllm_page_is_vllms(vllm_declared) -> None:
    check_page(VLLM_PAGE, "vllm:", vllm_declared, set())


def test_a_vllm_page_is_read_as_its_load() -> None:
    load = read_load(parse_page(VLLM_PAGE).samples, VLLM.metrics, at=10.0)
    assert (load.running, load.queued, load.kv_usage) == (58, 3, 0.71)
    assert (load.generation_tokens, load.aborted, load.refused) == (220000, 5, 7)
    assert load.spec_accept_length == pytest.approx(2.5)
    assert load.gen_throughput is None  # one reading: no rate yet
    later = VLLM_PAGE.replace("120000.0", "121000.0")
    load2 = read_load(parse_page(later).samples, VLLM.metrics, at=12.0, previous=load)
    assert load2.gen_throughput == pytest.approx(500.0)
