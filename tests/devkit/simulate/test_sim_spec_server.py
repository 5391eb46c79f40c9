"""`regen simulate` speculates: per-request acceptance (map, inline marker, EAGLE trap), SGLang's
spec_tokens_details per request (streamed and whole), avg_spec_accept_length as a running total,
and the speed model driving the step loop (the speedup falls with the batch)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from _sim_common import MODEL

from regen.core.errors import ConfigError
from regen.devkit.simulate.config import SimConfig
from regen.devkit.simulate.speculative import SpeedModel
from regen.devkit.simulate.testing import EAGLE3_OPTIONS, running_simulator, simulator_in_thread
from tests._loadgen import run_load

pytestmark = pytest.mark.timeout(90)

SPEC = EAGLE3_OPTIONS
MAP = "keywords:\n  xlam: 1.4\n  sharegpt: 2.6\n  magicoder: 3.1\ndefault: 2.0\n"


def post(url: str, body: dict[str, Any]) -> bytes:
    req = urllib.request.Request(
        url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


def body(text: str, *, stream: bool = False, max_tokens: int = 200, **extra: Any) -> dict:
    b: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "return_spec_tokens_details": True,
        **extra,
    }
    if stream:
        b |= {"stream": True, "stream_options": {"include_usage": True}}
    return b


def details(url: str, text: str, **kw: Any) -> tuple[dict[str, Any], int]:
    out = json.loads(post(url, body(text, **kw)))
    return out["sglext"]["spec_tokens_details"], out["usage"]["completion_tokens"]


def events(raw: bytes) -> list[Any]:
    lines = [ln[6:] for ln in raw.decode().splitlines() if ln.startswith("data: ")]
    return [ln if ln == "[DONE]" else json.loads(ln) for ln in lines]


def decode_accept(d: dict[str, Any], completion: int) -> float:
    """Tokens kept per verify step (the prefill's token left out)."""
    return (completion - 1) / d["spec_verify_ct"]


def test_acceptance_per_source_from_the_map_and_the_marker(tmp_path: Path) -> None:
    amap = tmp_path / "accept.yaml"
    amap.write_text(MAP)
    with simulator_in_thread(
        instant=True, mean_tokens=400, length_sigma=0, spec_accept_map=amap, **SPEC
    ) as sim:
        info = sim.get("/server_info")
        # SGLang reports no running acceptance before the first verify step
        assert "avg_spec_accept_length" not in info["internal_states"][0]
        assert info["simulator"]["speculative"]["accept_map"]["keywords"]["xlam"] == 1.4
        seen = {}
        for text, want in [
            ("[xlam] call the tool", 1.4),
            ("[sharegpt] chat with me", 2.6),
            ("[magicoder] write code", 3.1),
            ("nothing known", 2.0),  # the map's default
            ("[xlam] but spec_accept=3.6", 3.6),  # the inline marker wins
        ]:
            d, n = details(sim.url, text)
            assert n == 200
            assert decode_accept(d, n) == pytest.approx(want, rel=0.02), text
            assert d["spec_accept_length"] == n / d["spec_verify_ct"]  # SGLang's definition
            assert d["spec_num_proposed_drafts"] == 3 * d["spec_verify_ct"]
            assert d["spec_num_correct_drafts"] == n - 1 - d["spec_verify_ct"]
            assert sum(d["spec_correct_drafts_histogram"]) == d["spec_verify_ct"]
            assert len(d["spec_correct_drafts_histogram"]) <= 4  # at most 3 drafts accepted
            seen[text] = (d, n)
        # the server's running total is every verify step so far: Σ decode tokens ÷ Σ steps
        after = sim.get("/server_info")["internal_states"][0]["avg_spec_accept_length"]
        tokens = sum(n - 1 for _, n in seen.values())
        steps = sum(d["spec_verify_ct"] for d, _ in seen.values())
        assert after == pytest.approx(tokens / steps)
        # the same body gets the same steps (deterministic, like the answer)
        assert details(sim.url, "[sharegpt] chat with me") == seen["[sharegpt] chat with me"]


def test_streamed_details_in_the_sglext_chunk_before_usage() -> None:
    with simulator_in_thread(
        mean_tokens=120, length_sigma=0, step_ms=0.5, spec_accept_length=2.6, **SPEC
    ) as sim:
        evs = events(post(sim.url, body("stream it", stream=True)))
        assert evs[-1] == "[DONE]"
        chunks = evs[:-1]
        finish = [
            i for i, e in enumerate(chunks) if e["choices"] and e["choices"][0]["finish_reason"]
        ]
        ext = [i for i, e in enumerate(chunks) if "sglext" in e]
        usage = [i for i, e in enumerate(chunks) if e.get("usage")]
        assert len(finish) == len(ext) == len(usage) == 1
        assert finish[0] < ext[0] < usage[0] == len(chunks) - 1
        assert chunks[ext[0]]["choices"] == []
        d = chunks[ext[0]]["sglext"]["spec_tokens_details"]
        n = chunks[usage[0]]["usage"]["completion_tokens"]
        assert decode_accept(d, n) == pytest.approx(2.6, rel=0.03)
        # one chunk per speculative step: at most num_steps + 1 tokens of text each
        from regen.devkit.simulate.tokens import count_tokens

        texts = [
            e["choices"][0]["delta"].get("reasoning_content") or e["choices"][0]["delta"].get(
                "content")
            for e in chunks[1 : finish[0]]
        ]  # fmt: skip
        sizes = [count_tokens(t) for t in texts if t]
        assert max(sizes) <= 4 and sum(sizes) <= n
        # the whole answer carries the same details (the steps depend only on the body)
        whole, n2 = details(sim.url, "stream it")
        assert (whole, n2) == (d, n)
        # not asked: no sglext at all
        plain = json.loads(
            post(sim.url, {**body("stream it"), "return_spec_tokens_details": False})
        )
        assert "sglext" not in plain


def test_no_details_without_a_verify_step_or_when_switched_off() -> None:
    with simulator_in_thread(instant=True, mean_tokens=50, **SPEC) as sim:
        out = json.loads(post(sim.url, body("one token", max_tokens=1)))
        assert out["usage"]["completion_tokens"] == 1 and "sglext" not in out
    with simulator_in_thread(instant=True, spec_tokens_details=False, **SPEC) as sim:
        out = json.loads(post(sim.url, body("no details")))
        assert "sglext" not in out
        # the running average still moves (a server that reports only /server_info)
        assert sim.get("/server_info")["internal_states"][0]["avg_spec_accept_length"] > 1.5


def test_eagle_trap_with_an_eagle3_draft_and_an_eagle_draft(tmp_path: Path) -> None:
    eagle3 = tmp_path / "eagle3"
    eagle3.mkdir()
    (eagle3 / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    eagle1 = tmp_path / "eagle1"
    eagle1.mkdir()
    (eagle1 / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle"]}))
    cases = [
        ({"speculative_draft_model_path": str(eagle3)}, 1.0),
        ({"speculative_draft_model_path": str(eagle1)}, 2.6),
        ({"speculative_draft_model_path": "/not/here"}, 1.0),  # unreadable: taken as EAGLE-3
        ({"speculative_draft_model_path": str(eagle1), "spec_draft_kind": "eagle3"}, 1.0),
    ]
    for extra, want in cases:
        opts = {**SPEC, **extra, "speculative_algorithm": "EAGLE"}
        with simulator_in_thread(
            instant=True, mean_tokens=200, length_sigma=0, spec_accept_length=2.6, **opts
        ) as sim:
            d, n = details(sim.url, "[sharegpt] anything")
            assert decode_accept(d, n) == pytest.approx(want, rel=0.02), extra
            if want == 1.0:
                assert d["spec_num_correct_drafts"] == 0 and d["spec_accept_rate"] == 0.0
                assert d["spec_correct_drafts_histogram"] == [d["spec_verify_ct"]]
            info = sim.get("/server_info")
            assert info["internal_states"][0]["avg_spec_accept_length"] == pytest.approx(
                want, rel=0.02
            )
            assert info["simulator"]["speculative"]["effective_accept_length"] == want


def test_spec_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="--spec-accept-map need --speculative-algorithm"):
        SimConfig.from_flat({"spec_accept_map": "m.yaml"})
    with pytest.raises(ConfigError, match="--spec-verify-cost need --speculative-algorithm"):
        SimConfig.from_flat({"spec_verify_cost": 0.01})
    with pytest.raises(ConfigError, match="tokens-per-step"):
        SimConfig.from_flat({"tokens_per_step": 2, **SPEC})
    with pytest.raises(ConfigError, match="spec_accept_length"):
        SimConfig.from_flat({"spec_accept_length": 0.5, **SPEC})
    with pytest.raises(ConfigError, match="spec_draft_overhead"):
        SimConfig.from_flat({"spec_draft_overhead": 0.9, **SPEC})
    with pytest.raises(ConfigError, match="spec_draft_kind"):
        SimConfig.from_flat({"spec_draft_kind": "medusa", **SPEC})
    cfg = SimConfig.from_flat({"spec_draft_overhead": 1.5, "spec_verify_cost": 0.02, **SPEC})
    assert cfg.speed == SpeedModel(draft_overhead=1.5, verify_cost=0.02)
    assert cfg.speculation() is not None and SimConfig().speculation() is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [("keywords:\n  xlam: 0.5\n", "keywords.xlam"), ("keywords: [unclosed\n", "not valid YAML")],
)
def test_a_bad_acceptance_map_is_one_line_and_exit_2(tmp_path: Path, text: str, needle: str):
    amap = tmp_path / "accept.yaml"
    amap.write_text(text)
    p = subprocess.run(
        [sys.executable, "-m", "regen", "simulate", "--port", "0",
         "--speculative-algorithm", "EAGLE3", "--spec-accept-map", str(amap)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert str(amap) in p.stderr and needle in p.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "regen", "simulate", "--speculative-algorithm", "EAGLE3",
         "--spec-accept-map", str(tmp_path / "absent.yaml")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert missing.returncode == 2 and "cannot read acceptance map" in missing.stderr


def _sim_tok_s(sim, concurrency: int, requests: int) -> tuple[float, dict]:
    """Output tokens per simulated second (the server's busy time: independent of how late
    the event loop ran) for a closed loop of ``concurrency`` clients."""
    sim.reset_stats()
    res = asyncio.run(
        run_load(sim.url, requests=requests, concurrency=concurrency, first=concurrency * 1000)
    )
    assert res.failed == 0
    st = sim.stats()
    return st["tokens_generated"] / st["busy_s"], st


def test_the_step_loop_follows_the_speed_model() -> None:
    """Tokens per busy second of each server is the model's at the batch it really ran (its
    mean occupancy: a closed loop of clients cannot keep every slot busy at every step), and
    speculative ÷ plain is a / r(b): 1.66× at batch 1, falling with the batch."""
    step_s = 0.005
    common = {"mean_tokens": 120, "length_sigma": 0, "step_ms": step_s * 1000}
    model = SpeedModel()
    per_step = 120 / (1 + 119 / 2.6)  # the prefill's step makes one token, then 2.6 per step
    with (
        running_simulator(**common) as plain,
        running_simulator(**common, **SPEC, spec_accept_length=2.6) as spec,
    ):
        ratios = {}
        for c in (1, 32):
            base, st_b = _sim_tok_s(plain, c, 3 * c)
            fast, st_s = _sim_tok_s(spec, c, 3 * c)
            assert st_b["tokens_generated"] == st_s["tokens_generated"] == 3 * c * 120
            b_plain = st_b["mean_batch_occupancy"] * 64
            b_spec = st_s["mean_batch_occupancy"] * 64
            assert 0.8 * c <= b_spec <= c and 0.8 * c <= b_plain <= c
            assert base == pytest.approx(b_plain / step_s, rel=0.03)
            want = b_spec * per_step / (step_s * model.step_ratio(round(b_spec)))
            assert fast == pytest.approx(want, rel=0.04), (c, fast, want, b_spec)
            ratios[c] = fast / base
        assert ratios[1] == pytest.approx(model.speedup(2.6, 1) * per_step / 2.6, rel=0.03)
        assert ratios[32] < 0.9 * ratios[1]
        # at the batch it ran, the speculative server is the model's a / r(b)
        assert ratios[32] == pytest.approx(
            model.speedup(per_step, round(b_spec)) * b_spec / b_plain, rel=0.05
        )
