"""The simulator's ``sglext.spec_tokens_details`` is SGLang's own: rebuilt with SGLang 0.5.23's
``SpecTokensDetails`` / ``SglExt`` / response models and serialized as ``serving_chat.py`` does,
the streamed sglext chunk and the whole response's ``sglext`` come out byte-for-byte equal (the
same nine fields, the same types, the same place)."""

from __future__ import annotations

import json
import urllib.request
from types import ModuleType
from typing import Any

import pytest

from regen.devkit.simulate.testing import EAGLE3_OPTIONS, simulator_in_thread

MODEL = "moonshotai/Kimi-K2.5"


def post(url: str, body: dict[str, Any]) -> bytes:
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


def body(stream: bool) -> dict[str, Any]:
    b: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "spec_accept=2.6 explain drafts"}],
        "max_tokens": 150,
        "return_spec_tokens_details": True,
    }
    if stream:
        b |= {"stream": True, "stream_options": {"include_usage": True}}
    return b


@pytest.fixture(scope="module")
def answers() -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    with simulator_in_thread(mean_tokens=300, length_sigma=0, step_ms=0.2, **EAGLE3_OPTIONS) as sim:
        whole = json.loads(post(sim.url, body(False)))
        raw = post(sim.url, body(True)).decode()
    lines = [ln for ln in raw.splitlines() if ln.startswith("data: ") and ln != "data: [DONE]"]
    return whole, [json.loads(ln[6:]) for ln in lines], lines


def test_details_have_sglangs_fields_and_types(protocol: ModuleType, answers) -> None:
    whole, _, _ = answers
    d = whole["sglext"]["spec_tokens_details"]
    assert set(d) == set(protocol.SpecTokensDetails.model_fields)
    rebuilt = protocol.SpecTokensDetails(**d)
    assert json.loads(rebuilt.model_dump_json()) == d
    for name, value in d.items():  # ints stay ints, floats floats, histograms lists of ints
        assert type(value) is type(getattr(rebuilt, name)), name
    assert d["spec_verify_ct"] > 0 and d["spec_accept_length"] > 2.0


def test_the_whole_response_validates_and_reserializes_the_same(protocol, answers) -> None:
    whole, _, _ = answers
    resp = protocol.ChatCompletionResponse.model_validate(whole)
    assert isinstance(resp.sglext.spec_tokens_details, protocol.SpecTokensDetails)
    assert json.loads(resp.model_dump_json())["sglext"] == whole["sglext"]


def test_the_streamed_sglext_chunk_is_the_one_sglang_builds(protocol, answers) -> None:
    whole, chunks, lines = answers
    (i,) = [i for i, c in enumerate(chunks) if "sglext" in c]
    ext = chunks[i]
    p = protocol
    sglang = p.ChatCompletionStreamResponse(
        id=ext["id"],
        created=ext["created"],
        choices=[],
        model=ext["model"],
        sglext=p.SglExt(
            spec_tokens_details=p.SpecTokensDetails(**ext["sglext"]["spec_tokens_details"])
        ),
    )
    assert f"data: {sglang.model_dump_json()}" == lines[i]  # byte for byte
    # the same request streamed or not: the same steps, the same details
    assert ext["sglext"] == whole["sglext"]
    usage = chunks[-1]["usage"]
    assert ext["sglext"]["spec_tokens_details"]["spec_accept_length"] == pytest.approx(
        usage["completion_tokens"] / ext["sglext"]["spec_tokens_details"]["spec_verify_ct"]
    )
