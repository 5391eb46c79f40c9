"""The speculative speed model (regen.devkit.simulate.speculative): closed forms, the reference
case, per-request steps and SGLang's spec_tokens_details, acceptance per prompt, the EAGLE trap."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from regen.core.errors import ConfigError
from regen.devkit.simulate.speculative import (
    BROKEN_ACCEPT_LENGTH,
    AcceptanceMap,
    SpecCounters,
    SpecRequest,
    SpecServer,
    SpeedModel,
    draft_kind,
    effective_accept_length,
    max_accept_length,
    prompt_text,
    request_accept_length,
)


def test_defaults_reproduce_the_reference_case() -> None:
    """82.3 tok/s speculative vs 90 baseline at acceptance ~2.1; the draft pays at low load."""
    m = SpeedModel()
    assert m.speedup(2.1, 64) * 90 == pytest.approx(82.3, abs=0.5)
    assert m.speedup(2.1, 1) == pytest.approx(1.66, abs=0.02)
    assert m.speedup(2.1, 64) < 1 < m.speedup(2.1, 16)


def test_speedup_falls_with_the_batch_and_rises_with_acceptance() -> None:
    m = SpeedModel()
    batches = [1, 2, 4, 8, 16, 32, 64, 128]
    for a in (1.0, 1.4, 2.1, 2.6, 3.1):
        s = [m.speedup(a, b) for b in batches]
        assert s == sorted(s, reverse=True) and len(set(s)) == len(s)
    for b in batches:
        s = [m.speedup(a, b) for a in (1.0, 1.4, 2.1, 2.6, 3.1)]
        assert s == sorted(s)


@pytest.mark.parametrize("accept", [1.4, 2.1, 2.6, 3.1, 4.0])
@pytest.mark.parametrize(("overhead", "cost"), [(1.25, 0.0163), (1.1, 0.05), (1.5, 0.002)])
def test_crossover_is_where_the_speedup_is_one(accept: float, overhead: float, cost: float) -> None:
    m = SpeedModel(draft_overhead=overhead, verify_cost=cost)
    b = m.crossover(accept)
    assert b == pytest.approx((accept - overhead) / cost)
    if b > 0:
        assert m.speedup(accept, b) == pytest.approx(1.0)  # type: ignore[arg-type]
        assert m.speedup(accept, math.floor(b)) >= 1.0 >= m.speedup(accept, math.ceil(b))


def test_crossover_edges() -> None:
    assert SpeedModel().crossover(1.0) < 0  # type: ignore[operator]  # never pays
    assert SpeedModel().crossover(BROKEN_ACCEPT_LENGTH) < 1  # type: ignore[operator]
    flat = SpeedModel(draft_overhead=1.2, verify_cost=0.0)
    assert flat.crossover(2.0) is None  # pays at every batch
    assert flat.crossover(1.1) == 0.0  # pays at none


def test_tok_s_closed_form_and_batch_cap() -> None:
    m = SpeedModel()
    step = 0.0032
    assert m.tok_s(None, 4, step_s=step, max_running=64) == pytest.approx(4 / step)
    assert m.tok_s(None, 128, step_s=step, max_running=64) == pytest.approx(64 / step)
    assert m.tok_s(None, 4, step_s=step, max_running=64, tokens_per_step=2) == pytest.approx(
        8 / step
    )
    spec = m.tok_s(2.1, 16, step_s=step, max_running=64)
    assert spec == pytest.approx(16 * 2.1 / (step * m.step_ratio(16)))
    assert spec / m.tok_s(None, 16, step_s=step, max_running=64) == pytest.approx(
        m.speedup(2.1, 16)
    )
    assert m.step_s(step, 0) == pytest.approx(step * 1.25)


def test_fit_recovers_the_model_from_two_speedups() -> None:
    m = SpeedModel(draft_overhead=1.4, verify_cost=0.03)
    fitted = SpeedModel.fit(2.3, (1, m.speedup(2.3, 1)), (48, m.speedup(2.3, 48)))
    assert fitted.draft_overhead == pytest.approx(1.4)
    assert fitted.verify_cost == pytest.approx(0.03)
    # the reference case: 1.66x at 1 and 0.914x (82.3 / 90) at 64 for acceptance 2.1
    ref = SpeedModel.fit(2.1, (1, 1.66), (64, 82.3 / 90))
    assert ref.draft_overhead == pytest.approx(1.25, abs=0.01)
    assert ref.verify_cost == pytest.approx(0.0163, abs=0.0005)
    with pytest.raises(ConfigError, match="outside the model"):
        SpeedModel.fit(2.0, (1, 1.0), (16, 1.5))  # rising with the batch
    with pytest.raises(ConfigError, match="outside the model"):
        SpeedModel.fit(2.0, (1, 2.5), (16, 1.0))  # faster than the acceptance allows
    with pytest.raises(ConfigError):
        SpeedModel.fit(2.0, (4, 1.2), (4, 1.1))


def test_speed_model_is_strict() -> None:
    with pytest.raises(ValueError):
        SpeedModel(draft_overhead=0.9)  # speculation never costs less than a plain step
    with pytest.raises(ValueError):
        SpeedModel(verify_cost=-0.1)
    with pytest.raises(ValueError):
        SpeedModel.model_validate({"draft_overhead": 1.2, "verfy_cost": 0.01})


@pytest.mark.parametrize("accept", [1.0, 1.4, 2.1, 2.6, 3.1, 3.999, 4.0])
def test_spec_request_averages_its_acceptance(accept: float) -> None:
    r = SpecRequest(accept, cap=4)
    total = 0
    for _ in range(1000):
        n = r.step(10**9)
        assert 1 <= n <= 4
        total += n
    assert total / r.verify_ct == pytest.approx(accept, abs=2e-3)
    assert r.step_tokens == total
    assert r.correct_drafts == total - r.verify_ct
    assert sum(r.histogram) == r.verify_ct
    assert sum(i * c for i, c in enumerate(r.histogram)) == r.correct_drafts


def test_spec_request_pattern_and_remaining() -> None:
    r = SpecRequest(2.6, cap=4)
    assert [r.step(100) for _ in range(5)] == [2, 3, 2, 3, 3]
    r = SpecRequest(3.0, cap=4)
    assert r.step(2) == 2  # never more than the request has left
    assert r.step(0) == 0 and r.verify_ct == 1


def test_spec_request_caps_at_num_steps_plus_one() -> None:
    r = SpecRequest(6.0, cap=max_accept_length(3))
    assert r.accept == 4.0
    assert {r.step(100) for _ in range(10)} == {4}
    assert max_accept_length(None) == 4 and max_accept_length(5) == 6
    with pytest.raises(ConfigError):
        SpecRequest(0.5)
    with pytest.raises(ConfigError):
        SpecRequest(float("nan"))


def test_details_follow_sglang_definitions() -> None:
    """SGLang 0.5.23 tokenizer_manager: accept_length = completion / verify_ct (prefill token
    included), proposed = verify_ct × (num_draft_tokens − 1), rate = correct / proposed."""
    r = SpecRequest(2.5, cap=4)
    produced = 1  # the prefill's token
    while produced < 101:
        produced += r.step(101 - produced)
    d = r.details(produced, num_draft_tokens=4)
    assert set(d) == {
        "spec_accept_rate",
        "spec_accept_length",
        "spec_cap_length",
        "spec_block_accept_length",
        "spec_num_correct_drafts",
        "spec_num_proposed_drafts",
        "spec_verify_ct",
        "spec_correct_drafts_histogram",
        "spec_cap_lens_histogram",
    }
    assert d["spec_verify_ct"] == r.verify_ct == 40
    assert d["spec_accept_length"] == pytest.approx(101 / 40)
    assert d["spec_num_proposed_drafts"] == 40 * 3
    assert d["spec_num_correct_drafts"] == 100 - 40
    assert d["spec_accept_rate"] == pytest.approx(60 / 120)
    assert d["spec_correct_drafts_histogram"] == r.histogram
    json.dumps(d)  # plain JSON for the wire
    # SGLang sends no details for a request without a verify step (a 1-token answer)
    assert SpecRequest(2.0).details(1, None) is None


def test_counters_are_a_running_total() -> None:
    c = SpecCounters()
    assert c.avg_accept_length is None
    c.add(3)
    c.add(5, requests=2)  # one step of a batch of two
    assert c.avg_accept_length == pytest.approx(8 / 3)


def test_prompt_text_reads_strings_and_text_parts() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "part"}, {"type": "image"}]},
            {"role": "assistant", "content": None},
            "junk",
        ]
    }
    assert prompt_text(body) == "sys\npart"
    assert prompt_text({}) == ""


def test_acceptance_per_request_marker_then_map_then_default(tmp_path: Path) -> None:
    path = tmp_path / "accept.yaml"
    path.write_text("keywords:\n  xlam: 1.4\n  sharegpt: 2.6\n  code: 3.1\ndefault: 2.0\n")
    amap = AcceptanceMap.load(path)

    def body(text: str) -> dict:
        return {"messages": [{"role": "user", "content": text}]}

    assert request_accept_length(body("source xlam: call it"), default=2.1, mapping=amap) == 1.4
    assert request_accept_length(body("sharegpt and code"), default=2.1, mapping=amap) == 2.6
    assert request_accept_length(body("nothing"), default=2.1, mapping=amap) == 2.0
    assert request_accept_length(body("nothing"), default=2.1) == 2.1
    marked = body("xlam but spec_accept=3.3 wins")
    assert request_accept_length(marked, default=2.1, mapping=amap) == 3.3
    assert AcceptanceMap.load(path).keywords == {"xlam": 1.4, "sharegpt": 2.6, "code": 3.1}
    no_default = AcceptanceMap(keywords={"a": 1.5})
    assert request_accept_length(body("b"), default=2.2, mapping=no_default) == 2.2
    json_path = tmp_path / "accept.json"
    json_path.write_text(json.dumps({"keywords": {"q": 1.7}}))
    assert AcceptanceMap.load(json_path).lookup("a q") == 1.7


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("keywords:\n  xlam: 0.5\n", "keywords.xlam"),
        ("keywords:\n  xlam: fast\n", "keywords.xlam"),
        ("default: 0\n", "default"),
        ("keyword:\n  xlam: 1.4\n", "keyword"),
        ("- 1\n", "(top level)"),
    ],
)
def test_bad_acceptance_maps_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        AcceptanceMap.load(path)
    assert str(path) in str(e.value) and field in str(e.value)


def test_unreadable_map_and_bad_marker(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        AcceptanceMap.load(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("keywords: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        AcceptanceMap.load(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError):
        request_accept_length(
            {"messages": [{"role": "user", "content": "spec_accept=0.5"}]}, default=2
        )


def test_eagle_with_an_eagle3_draft_accepts_nothing(tmp_path: Path) -> None:
    assert effective_accept_length("EAGLE3", "eagle3", 2.6) == 2.6
    assert effective_accept_length("EAGLE", "eagle3", 2.6) == BROKEN_ACCEPT_LENGTH == 1.0
    assert effective_accept_length("eagle", "eagle3", 2.6) == 1.0
    assert effective_accept_length("NEXTN", "eagle3", 2.6) == 1.0
    assert effective_accept_length("EAGLE", "eagle", 2.6) == 2.6  # an EAGLE-1/2 draft is fine
    assert effective_accept_length(None, "eagle3", 2.6) == 1.0  # no speculation
    # the broken server still pays for drafting and verifying: slower than plain everywhere
    m = SpeedModel()
    assert all(m.speedup(BROKEN_ACCEPT_LENGTH, b) < 1 for b in (1, 4, 16, 64))


def test_draft_kind_from_the_draft_config(tmp_path: Path) -> None:
    assert draft_kind(None) == "eagle3"
    assert draft_kind(tmp_path / "absent") == "eagle3"
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    assert draft_kind(tmp_path) == "eagle3"
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["Eagle3DeepseekV2ForCausalLM"]})
    )
    assert draft_kind(str(tmp_path)) == "eagle3"
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle"]}))
    assert draft_kind(tmp_path) == "eagle"
    (tmp_path / "config.json").write_text("{not json")
    assert draft_kind(tmp_path) == "eagle3"


def test_mixed_batch_acts_as_the_token_weighted_harmonic_mean() -> None:
    """Requests of 2.6 / 1.4 / 3.1 stepped together: total tokens ÷ total request-steps is the
    acceptance the closed form needs, and it is Σ tokens ÷ Σ (tokens / a)."""
    accepts = [2.6, 1.4, 3.1]
    length = 600
    reqs = [SpecRequest(a, cap=4) for a in accepts]
    produced = [0, 0, 0]
    counters = SpecCounters()
    while any(p < length for p in produced):
        for i, r in enumerate(reqs):
            if produced[i] < length:
                n = r.step(length - produced[i])
                produced[i] += n
                counters.add(n)
    harmonic = sum(produced) / sum(length / a for a in accepts)
    assert counters.avg_accept_length == pytest.approx(harmonic, rel=0.01)


def _closed_loop(
    server: SpecServer | None, concurrency: int, *, requests: int, length: int, bodies: list[dict]
) -> tuple[float, int]:
    """A pure step loop (what the simulator's scheduler will do): ``concurrency`` requests in
    flight, each ``length`` tokens, plain steps of 1 s. Returns (seconds, tokens)."""
    waiting = list(range(requests))
    running: list[list] = []  # [remaining, SpecRequest | None]
    t = 0.0
    tokens = 0
    while waiting or running:
        while waiting and len(running) < concurrency:
            i = waiting.pop(0)
            req = server.request(bodies[i % len(bodies)]) if server else None
            running.append([length, req])
        batch = len(running)
        t += server.step_s(1.0, batch) if server else 1.0
        kept = 0
        for item in running:
            n = item[1].step(item[0]) if item[1] is not None else 1
            item[0] -= n
            kept += n
        if server:
            server.record_step(kept, batch)
        tokens += kept
        running = [item for item in running if item[0] > 0]
    return t, tokens


@pytest.mark.parametrize("concurrency", [1, 4, 16, 64])
def test_a_step_loop_reproduces_the_closed_form(concurrency: int) -> None:
    """Speculative ÷ plain tok/s of a step loop driven by SpecServer is the model's speedup at
    that batch (within the ramp and tail of 8 rounds), for a mix of per-source acceptances."""
    amap = AcceptanceMap(keywords={"xlam": 1.4, "sharegpt": 2.6, "magicoder": 3.1})
    bodies = [{"messages": [{"role": "user", "content": f"{s} q"}]} for s in amap.keywords]
    server = SpecServer(algorithm="EAGLE3", accept_length=2.1, mapping=amap)
    n = 8 * concurrency * len(bodies)
    t_plain, tok_plain = _closed_loop(None, concurrency, requests=n, length=300, bodies=bodies)
    t_spec, tok_spec = _closed_loop(server, concurrency, requests=n, length=300, bodies=bodies)
    assert tok_plain == tok_spec == n * 300
    measured = (tok_spec / t_spec) / (tok_plain / t_plain)
    mix = server.counters.avg_accept_length
    harmonic = 3 / (1 / 1.4 + 1 / 2.6 + 1 / 3.1)
    assert mix == pytest.approx(harmonic, rel=0.02)
    assert measured == pytest.approx(server.speed.speedup(mix, concurrency), rel=0.05)


def test_spec_server_applies_the_eagle_trap_and_reports_details() -> None:
    body = {"messages": [{"role": "user", "content": "spec_accept=3.1 please"}]}
    good = SpecServer(algorithm="EAGLE3", accept_length=2.1, num_steps=3, num_draft_tokens=4)
    assert good.request(body).accept == 3.1
    assert good.request({"messages": []}).accept == 2.1
    broken = SpecServer(algorithm="EAGLE", accept_length=2.1)
    req = broken.request(body)
    assert req.accept == 1.0
    produced = 1
    while produced < 50:
        produced += req.step(50 - produced)
    d = broken.details(req, produced)
    assert d is not None
    assert d["spec_accept_length"] == pytest.approx(50 / 49)
    assert d["spec_num_correct_drafts"] == 0 and d["spec_accept_rate"] == 0.0
    capped = SpecServer(algorithm="EAGLE3", accept_length=2.1, num_steps=1)
    assert capped.request(body).accept == 2.0  # at most num_steps + 1 per step
