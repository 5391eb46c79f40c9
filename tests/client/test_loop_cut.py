"""The loop cut (regen.quality.loop): a looping answer's stream is closed as it loops.

The detector alone on texts; then the client against the simulator (in this process, answers
made over time, SGLang mode): a request the simulator answers with a loop comes back as a
``loop`` turn holding what was streamed up to the cut, a prefix of the simulator's answer,
with regen's own counts; the server stops generating it (its scheduler's tokens stay far below
``max_tokens``); normal answers are never cut. Then what such a turn becomes: its row (no end
token, the ``repetition`` flag, ``cut_saved``), its sample's counters, and a conversation that
ends at it.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest

from regen.client import ChatClient, RetryPolicy
from regen.core.result import LOOP, TurnResult
from regen.core.sample import Message, Sample
from regen.core.text import words
from regen.devkit.simulate.answer import AnswerConfig, answer, degenerate_kind
from regen.devkit.simulate.testing import simulator_in_thread
from regen.engine.inputs import render_settings
from regen.engine.rows import build_rows
from regen.engine.turns import regenerate
from regen.manifest import Endpoint, Sampling, load_manifest
from regen.quality import QualityConfig
from regen.quality.config import LoopCut
from regen.quality.loop import LoopWatch
from regen.store.counts import count_rows
from regen.targets.kimi import KIMI
from regen.template.render import Renderer

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
MODEL = "moonshotai/Kimi-K2.5"
MAX_TOKENS = 2048
RATE = 0.5  # half the answers degenerate: the test picks prompts of the kind it needs
PROSE = (
    "Prefix caching keeps the key and value tensors of a prompt's opening tokens so that a "
    "second request that starts the same way skips their prefill. A router that sends the "
    "turns of one conversation to the same server lets the later turns find their history in "
    "that cache, which matters most when histories run to tens of thousands of tokens. "
)


class Pieces:
    """Text pieces as a stream's accumulator holds them."""

    def __init__(self, reasoning: list[str], content: list[str]) -> None:
        self.reasoning, self.content = reasoning, content


def words_as_pieces(text: str) -> list[str]:
    return [w + " " for w in text.split()]


def test_a_loop_is_found_in_the_window_and_prose_is_not() -> None:
    cut = LoopCut()
    watch = LoopWatch(cut)
    loop = words_as_pieces(PROSE + "Wait, let me check the cache again. " * 40)
    assert watch.due(cut.every) and not watch.due(cut.every - 1)
    assert watch.loops(Pieces(loop, []), len(loop))
    run, n = watch.found
    assert n == 7 and run >= cut.min_words  # "wait let me check the cache again"
    assert watch.next_at == len(loop) + cut.every
    capped = LoopWatch(cut, limit=len(loop))  # the answer reached max_tokens: nothing to spare
    assert not capped.due(len(loop)) and capped.due(len(loop) - 1)
    prose = words_as_pieces(PROSE * 3)  # repeats, but as three copies of a long passage
    assert not LoopWatch(cut).loops(Pieces([], prose), len(prose))
    short = words_as_pieces(PROSE + "Wait, let me check. " * 20)  # 80 words: under min_words
    assert not LoopWatch(cut).loops(Pieces(short, []), len(short))


@pytest.mark.parametrize("seed", range(6))
def test_the_window_read_piece_by_piece_is_the_words_of_the_whole_text(seed: int) -> None:
    """However the stream cuts its pieces (mid-word, CJK, a newline between reasoning and
    content), the window holds the last words of the text as the check splits it."""
    rng = random.Random(seed)
    vocab = ["Wait,", "let", "me", "check.", "the", "cache", "key_value", "数据", "缓存", "x2"]
    reasoning_text = " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 300))) + " "
    content_text = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 300))) + " "
    cut = LoopCut(window_words=120, min_words=100)
    watch = LoopWatch(cut)
    seen = Pieces([], [])
    streamed = 0
    for text, into in ((reasoning_text, seen.reasoning), (content_text, seen.content)):
        i = 0
        while i < len(text):
            step = rng.randint(1, 7)
            into.append(text[i : i + step])
            i += step
            streamed += 1
            if rng.random() < 0.2:
                watch.loops(seen, streamed)
    watch.loops(seen, streamed)
    joined = f"{reasoning_text}\n{content_text}" if reasoning_text.strip() else content_text
    want = [hash(w) for w in words(joined)][-cut.window_words :]
    assert list(watch._ids) == want


def test_loop_cut_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="window"):
        LoopCut(min_words=500, window_words=400)
    with pytest.raises(ValueError):
        LoopCut(every="64")  # type: ignore[arg-type]  # strict: a run.json says ints


def find_prompt(kind: str | None, sampling: Sampling, start: int = 0) -> list[dict[str, Any]]:
    """Messages the simulator answers with a ``kind`` answer (None: a normal one)."""
    kwargs = KIMI.template_kwargs(sampling.thinking)
    for i in range(start, start + 500):
        msgs = [{"role": "user", "content": f"Question {i}: how does a draft model learn?"}]
        body = {"messages": msgs, "max_tokens": sampling.max_tokens,
                "chat_template_kwargs": kwargs, "seed": sampling.seed}  # fmt: skip
        if degenerate_kind(body, RATE) == kind:
            return msgs
    raise AssertionError(f"no {kind} prompt found")


def expected(msgs: list[dict[str, Any]], sampling: Sampling) -> Any:
    body = {"messages": msgs, "max_tokens": sampling.max_tokens,
            "chat_template_kwargs": KIMI.template_kwargs(sampling.thinking),
            "seed": sampling.seed}  # fmt: skip
    return answer(body, AnswerConfig(degenerate_rate=RATE))


def client(url: str, sampling: Sampling, quality: QualityConfig | None) -> ChatClient:
    return ChatClient(Endpoint(url=url), model=MODEL, sampling=sampling,
                      retry=RetryPolicy(max_attempts=1), timeout_s=60.0, quality=quality,
                      template_kwargs=KIMI.template_kwargs(sampling.thinking))  # fmt: skip


def complete(c: ChatClient, msgs: list[dict[str, Any]]) -> TurnResult:
    async def go() -> TurnResult:
        try:
            return await c.complete(msgs, sample_id="t")
        finally:
            await c.aclose()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def sim():
    # 4 tokens per 2 ms step: an answer of max_tokens takes about a second to stream
    with simulator_in_thread(step_ms=2.0, tokens_per_step=4, max_running_requests=8,
                             degenerate_rate=RATE, engine="vllm") as s:  # fmt: skip
        yield s


def test_a_looping_answer_is_cut_and_the_server_stops_making_it(sim) -> None:
    sampling = Sampling(max_tokens=MAX_TOKENS, seed=3)
    msgs = find_prompt("loop", sampling)
    want = expected(msgs, sampling)
    assert want.finish_reason == "length" and want.completion_tokens == MAX_TOKENS
    sim.reset_stats()
    r = complete(client(sim.url, sampling, QualityConfig()), msgs)
    assert r.finish_reason == LOOP and r.unfinished and not r.truncated
    assert want.reasoning.startswith(r.reasoning or "") and want.content.startswith(r.content)
    streamed = len((r.reasoning or "") + r.content)
    assert 0 < streamed < len(want.reasoning + want.content)
    assert r.completion_tokens is not None and 0 < r.completion_tokens < MAX_TOKENS // 2
    assert r.cut_saved == MAX_TOKENS - r.completion_tokens
    assert r.prompt_tokens is None and r.cached_tokens is None  # the usage chunk never came
    # the server let the request go (vLLM aborts a closed stream at once): what it made stays
    # near what was streamed, far from max_tokens
    deadline = time.monotonic() + 5
    made = sim.stats()["tokens_generated"]
    while time.monotonic() < deadline and sim.stats()["running"]:
        time.sleep(0.05)
        made = sim.stats()["tokens_generated"]
    assert sim.stats()["running"] == 0
    assert made < MAX_TOKENS // 2, made


def test_without_the_cut_the_loop_runs_to_max_tokens(sim) -> None:
    sampling = Sampling(max_tokens=MAX_TOKENS, seed=3)
    msgs = find_prompt("loop", sampling)
    off = QualityConfig(loop_cut=LoopCut(enabled=False))
    r = complete(client(sim.url, sampling, off), msgs)
    assert (r.finish_reason, r.completion_tokens, r.cut_saved) == ("length", MAX_TOKENS, None)


@pytest.mark.parametrize("kind", [None, "empty", "language"])
def test_answers_that_do_not_loop_are_not_cut(sim, kind) -> None:
    sampling = Sampling(max_tokens=MAX_TOKENS, seed=5)
    for start in (0, 600):
        msgs = find_prompt(kind, sampling, start)
        r = complete(client(sim.url, sampling, QualityConfig()), msgs)
        want = expected(msgs, sampling)
        assert r.finish_reason == want.finish_reason != LOOP
        assert (r.reasoning or "", r.content) == (want.reasoning, want.content)


def cut_turn(content: str) -> TurnResult:
    return TurnResult(content=content, reasoning="Let me think.", tool_calls=(),
                      finish_reason=LOOP, model=MODEL, endpoint="http://e", completion_tokens=90,
                      cut_saved=MAX_TOKENS - 90, engine="sglang")  # fmt: skip


def test_a_cut_turn_becomes_a_flagged_row_without_an_end_token() -> None:
    manifest = load_manifest(REPO / "manifests" / "demo.yaml")
    renderer = Renderer.of(render_settings(manifest))
    sample = Sample(
        id="s:1", source="s", messages=[Message("user", "Hi"), Message("assistant", "x")]
    )
    loop = "Wait, let me check. " * 20
    (row,) = build_rows(sample, [(0, [{"role": "user", "content": "Hi"}], cut_turn(loop))],
                        renderer)  # fmt: skip
    assert row["finish_reason"] == LOOP and row["truncated"] is False
    assert "repetition" in row["quality_flags"]
    assert row["cut_saved"] == MAX_TOKENS - 90 and row["completion_tokens"] == 90
    assert row["token_source"] == "local"
    end = renderer.end_id
    assert end is not None and row["input_ids"][-1] != end  # the model did not finish it
    c = count_rows([row])
    assert (c.loop_cut, c.cut_saved, c.truncated, c.flags) == (1, MAX_TOKENS - 90, 0,
                                                               {"repetition": 1})  # fmt: skip


def test_a_conversation_ends_at_its_cut_turn() -> None:
    msgs = [Message("user", "a"), Message("assistant", "b"), Message("user", "c"),
            Message("assistant", "d")]  # fmt: skip
    sample = Sample(id="s:2", source="s", messages=msgs)
    calls: list[int] = []

    async def answer_turn(request: list[dict[str, Any]], tools: Any) -> TurnResult:
        calls.append(len(request))
        return cut_turn("loop " * 10)

    got = asyncio.run(regenerate(sample, answer_turn))
    assert calls == [1] and len(got.turns) == 1 and got.ended is None
