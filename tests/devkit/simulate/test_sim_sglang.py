"""The simulator speaks SGLang 0.5.23 by default: 503 overload (in-stream after 200 when
streamed), retraction and abort half-way, slots in internal_states, the key everywhere but
/health*, spec_tokens_details when asked. Each shape is the one SGLang's own code sends
(docs/simulate.md; tests/contract feeds the real ones to regen's parser)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from _sim_common import MODEL

from regen.core.errors import ConfigError
from regen.devkit.simulate.config import SimConfig
from regen.devkit.simulate.testing import simulator_in_thread

pytestmark = pytest.mark.timeout(60)


def post(url: str, body: dict[str, Any], key: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers=headers)  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def get(url: str, key: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def events(raw: bytes) -> list[Any]:
    lines = [ln[6:] for ln in raw.decode().splitlines() if ln.startswith("data: ")]
    return [ln if ln == "[DONE]" else json.loads(ln) for ln in lines]


def finishes(evs: list[Any]) -> list[str]:
    """The finish reasons of a stream's chunks."""
    return [e["choices"][0]["finish_reason"] for e in evs
            if e != "[DONE]" and e["choices"] and e["choices"][0]["finish_reason"]]  # fmt: skip


def body(tag: str, stream: bool, **extra: Any) -> dict[str, Any]:
    b: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": tag}],
                         "max_tokens": 64, **extra}  # fmt: skip
    if stream:
        b |= {"stream": True, "stream_options": {"include_usage": True}}
    return b


def test_overload_is_503_whole_and_an_error_event_after_200_when_streamed():
    with simulator_in_thread(instant=True, mean_tokens=20, fault_sequence="503,ok") as sim:
        status, raw = post(sim.url, body("whole", False))
        assert status == 503
        err = json.loads(raw)
        assert err == {"object": "error", "message": "The request queue is full.",
                       "type": "503", "param": None, "code": 503}  # fmt: skip
        status, raw = post(sim.url, body("streamed", True))
        assert status == 200
        evs = events(raw)
        assert evs[0]["error"]["code"] == 503 and evs[0]["error"]["type"] == "SERVICE_UNAVAILABLE"
        assert evs[1]["choices"] == [] and evs[1]["usage"]["completion_tokens"] == 0
        assert evs[-1] == "[DONE]" and len(evs) == 3
        assert post(sim.url, body("streamed", True))[0] == 200  # the retry is served


def test_retraction_and_abort_half_way_through_a_stream():
    with simulator_in_thread(instant=True, mean_tokens=20, length_sigma=0,
                             fault_sequence="retract,abort,ok") as sim:  # fmt: skip
        b = body("half", True)
        evs = events(post(sim.url, b)[1])
        assert any(e != "[DONE]" and e.get("choices") and e["choices"][0]["delta"].get(
            "reasoning_content") for e in evs)  # fmt: skip
        err = [e for e in evs if e != "[DONE]" and "error" in e]
        assert len(err) == 1 and err[0]["error"]["code"] == 503 and evs[-1] == "[DONE]"
        assert finishes(events(post(sim.url, b)[1])) == ["abort"]
        assert finishes(events(post(sim.url, b)[1])) == ["stop"]


def test_slots_are_in_internal_states_and_top_level_only_when_given():
    with simulator_in_thread(instant=True, memory_slots=48, dp_size=2) as sim:
        info = sim.get("/server_info")
        assert info["max_running_requests"] is None and info["dp_size"] == 2
        per = [s["effective_max_running_requests_per_dp"] for s in info["internal_states"]]
        assert per == [24, 24]
        assert info["enable_deterministic_inference"] is False
    with simulator_in_thread(instant=True, max_running_requests=8,
                             enable_deterministic_inference=True) as sim:  # fmt: skip
        info = sim.get("/server_info")
        assert info["max_running_requests"] == 8
        assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 8
        assert info["enable_deterministic_inference"] is True
    with pytest.raises(ConfigError):
        SimConfig.from_flat({"memory_slots": 5, "dp_size": 2})
    with pytest.raises(ConfigError, match="no_such"):
        SimConfig.from_flat({"no_such": 1})


def test_the_api_key_guards_everything_but_health():
    key = "sim-secret"
    with simulator_in_thread(instant=True, api_key=key) as sim:
        for path in ("/health", "/health_generate", "/stats"):
            assert get(sim.base + path)[0] == 200, path
        for path in ("/server_info", "/v1/models", "/model_info"):
            status, raw = get(sim.base + path)
            assert (status, json.loads(raw)) == (401, {"error": "Unauthorized"}), path
            assert get(sim.base + path, key)[0] == 200
        assert post(sim.url, body("k", False))[0] == 401
        assert post(sim.url, body("k", False), key)[0] == 200
        assert key not in json.dumps(sim.get("/stats"))


def test_spec_tokens_details_when_asked_on_a_speculative_server():
    with simulator_in_thread(instant=True, mean_tokens=40, length_sigma=0,
                             speculative_algorithm="EAGLE3", speculative_num_steps=3,
                             speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                             spec_accept_length=2.0) as sim:  # fmt: skip
        whole = json.loads(post(sim.url, body("s", False, return_spec_tokens_details=True))[1])
        d = whole["sglext"]["spec_tokens_details"]
        n = whole["usage"]["completion_tokens"]
        # the prefill's token, then verify steps of 2 (the last one keeps what is left)
        assert d["spec_verify_ct"] == -(-(n - 1) // 2) and d["spec_accept_length"] == n / d[
            "spec_verify_ct"]  # fmt: skip
        assert d["spec_num_correct_drafts"] == n - 1 - d["spec_verify_ct"]
        assert d["spec_num_proposed_drafts"] == 3 * d["spec_verify_ct"]
        evs = events(post(sim.url, body("s", True, return_spec_tokens_details=True))[1])
        ext = [e["sglext"] for e in evs if e != "[DONE]" and "sglext" in e]
        assert len(ext) == 1 and ext[0]["spec_tokens_details"] == d
        plain = json.loads(post(sim.url, body("s", False))[1])
        assert "sglext" not in plain
