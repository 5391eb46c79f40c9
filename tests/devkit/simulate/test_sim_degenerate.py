"""`AnswerConfig.degenerate_rate` (issue 15): a deterministic share of loops, empty answers and
script switches, drawn from the request (seed included); every other answer unchanged."""

from __future__ import annotations

import json
import re
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _sim_common import MODEL, TOOLS

from regen.devkit.simulate import AnswerConfig, answer
from regen.devkit.simulate.answer import DEGENERATE_KINDS, degenerate_kind
from regen.devkit.simulate.config import SimConfig
from regen.devkit.simulate.testing import simulator_in_thread

TOKENIZER = Path(__file__).resolve().parents[3] / "manifests" / "demo" / "tokenizer"
RATE = 0.1
N = 3000


def request(i: int, seed: int | None = 0, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": f"Explain the idea behind question number {i}."}],
        "seed": seed,
        "max_tokens": 300,
        **extra,
    }


def test_rate_zero_and_the_answers_not_drawn_are_unchanged() -> None:
    base, degen = AnswerConfig(mean_tokens=60), AnswerConfig(mean_tokens=60, degenerate_rate=RATE)
    kinds = Counter()
    for i in range(600):
        a, b = answer(request(i), base), answer(request(i), degen)
        assert a.degenerate is None
        kinds[b.degenerate] += 1
        if b.degenerate is None:
            assert b == a
        else:
            assert b.degenerate == degenerate_kind(request(i), RATE)
    assert 0 < sum(n for k, n in kinds.items() if k) < 600


def test_the_share_and_the_kinds_follow_the_rate() -> None:
    cfg = AnswerConfig(mean_tokens=60, degenerate_rate=RATE)
    kinds = Counter(answer(request(i), cfg).degenerate for i in range(N))
    degenerate = N - kinds[None]
    assert abs(degenerate / N - RATE) < 0.02, kinds
    for kind, share in DEGENERATE_KINDS:
        assert abs(kinds[kind] / degenerate - share) < 0.1, kinds


def test_another_seed_draws_again() -> None:
    drawn = {i for i in range(N) if degenerate_kind(request(i, seed=0), RATE)}
    again = {i for i in drawn if degenerate_kind(request(i, seed=1), RATE)}
    assert len(drawn) > 200
    assert len(again) < 0.25 * len(drawn)  # ~RATE of them by chance
    assert degenerate_kind(request(1, seed=None), 1.0) is not None
    assert all(degenerate_kind(request(i), 0.0) is None for i in range(100))


def of_kind(kind: str, cfg: AnswerConfig, **extra: Any) -> list[Any]:
    out = []
    for i in range(N):
        body = request(i, **extra)
        if degenerate_kind(body, cfg.degenerate_rate) == kind:
            out.append(answer(body, cfg))
        if len(out) == 20:
            break
    assert len(out) == 20
    return out


@pytest.mark.parametrize("thinking", [True, False])
def test_a_loop_repeats_one_sentence_until_max_tokens(thinking: bool) -> None:
    cfg = AnswerConfig(mean_tokens=60, degenerate_rate=0.5)
    for a in of_kind("loop", cfg, chat_template_kwargs={"thinking": thinking}):
        looped = a.reasoning if thinking else a.content
        assert a.finish_reason == "length" and a.completion_tokens == 300
        assert (a.content if thinking else a.reasoning) == ""
        sentences = [s.strip() for s in looped.split(".") if s.strip()]
        # after the opening the same sentence comes back again and again
        assert Counter(sentences).most_common(1)[0][1] >= 5, looped


def test_an_empty_answer_reasons_then_says_nothing_even_with_tools() -> None:
    cfg = AnswerConfig(mean_tokens=60, degenerate_rate=0.5, tool_call_rate=1.0)
    for a in of_kind("empty", cfg, tools=TOOLS):
        assert a.content == "" and a.tool_calls == () and a.finish_reason == "stop"
        assert a.reasoning and a.completion_tokens == a.reasoning_tokens


def test_a_language_switch_answers_in_another_script() -> None:
    cfg = AnswerConfig(mean_tokens=60, degenerate_rate=0.5)
    for a in of_kind("language", cfg):
        assert re.search("[A-Za-z]", a.content) is None
        assert len(re.findall("[\u0400-\u04ff]", a.content)) >= 30
    cyrillic = {"messages": [{"role": "user", "content": "Объясни, как работает кэш запросов."}]}
    for seed in range(200):
        body = {**cyrillic, "seed": seed}
        if degenerate_kind(body, 0.5) == "language":
            content = answer(body, cfg).content
            assert re.search("[\u0400-\u04ff]", content) is None
            assert re.search("[\u4e00-\u9fff]", content)
            break
    else:
        raise AssertionError("no language switch drawn")


def test_it_is_a_simulator_flag() -> None:
    assert SimConfig.from_flat({"degenerate_rate": 0.25}).answer.degenerate_rate == 0.25
    from regen.core.errors import ConfigError

    with pytest.raises(ConfigError, match="degenerate_rate"):
        SimConfig.from_flat({"degenerate_rate": 1.5})


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=20) as r:
        return json.loads(r.read())


@pytest.mark.timeout(60)
@pytest.mark.skipif(not TOKENIZER.is_dir(), reason="manifests/demo/tokenizer not built yet")
def test_the_server_sends_them_and_a_loop_in_the_reasoning_has_no_think_close() -> None:
    cfg = AnswerConfig(mean_tokens=60, degenerate_rate=0.5)
    with simulator_in_thread(instant=True, tokenizer=TOKENIZER, mean_tokens=60,
                             degenerate_rate=0.5) as sim:  # fmt: skip
        seen = set()
        for i in range(40):
            body = {"model": MODEL, **request(i), "return_token_ids": True}
            ans = answer(body, cfg)
            res = post(sim.url, body)
            choice = res["choices"][0]
            assert choice["message"]["content"] == ans.content
            assert choice["finish_reason"] == ans.finish_reason
            text = sim_decode(choice["response_token_ids"])
            if ans.degenerate == "loop":
                assert "</think>" not in text and not text.endswith("<|im_end|>")
            else:
                assert "</think>" in text
            seen.add(ans.degenerate)
        assert {"loop", "empty", None} <= seen


def sim_decode(ids: list[int]) -> str:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    return tok.decode(ids, skip_special_tokens=False)
