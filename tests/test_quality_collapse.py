"""regen.quality.collapse (issue 43, part 5), with the near index the export hands it:
``collapsed`` fires on one answer given to many prompts of a source — exact copies and the same
text with small variations — and on none of the answers the repository's real-shaped rows
hold: the original assistant turns of the ten rehearsal sources (benchmarks/_rehearsal_data.py,
their real row shapes through the adapters), of every demo manifest, the stored demo run's rows
(tests/data), the demo target's answers and the simulator's (the quality benchmark's clean
corpus). The margin is asserted, not just 0."""

from __future__ import annotations

import glob
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from regen.core.sample import Sample
from regen.core.text import words
from regen.export.select import collapse_finder
from regen.manifest import load_manifest
from regen.quality import DEFAULT_DROP_FLAGS, FLAGS, QualityConfig
from regen.quality.collapse import NEAR_WORDS, CollapseFinder, answer_text, prompt_key
from regen.sources import read_samples, source_set

REPO = Path(__file__).resolve().parents[1]
DEFAULTS = QualityConfig()
#: one answer a collapsed target gives whatever it is asked (40 words: reasoning and content)
COLLAPSED_REASONING = (
    "The user wants help. I should give a general helpful reply that covers the basics."
)
COLLAPSED = (
    "Thank you for your question! Here is a general overview of the topic, the key points to "
    "consider, and a few practical steps you can take to get started right away."
)

Item = tuple[str, tuple[str, int], str]  # (source, prompt key, answer text)


def find(items: list[Item], config: QualityConfig = DEFAULTS) -> CollapseFinder:
    """The finder export runs (near matching through the prompts' NearDuplicates)."""
    f = collapse_finder(config)
    for n, (source, prompt, text) in enumerate(items):
        f.add(n, source, prompt, text)
    return f


def prompt(i: int, turn: int = 0) -> tuple[str, int]:
    return prompt_key(f"hash{i:05d}", f"s:{i}", turn)


def calls(name: str, **arguments: str) -> str:
    """One tool call as the ``tool_calls`` column stores it (OpenAI shape, JSON text)."""
    fn = {"name": name, "arguments": json.dumps(arguments)}
    return json.dumps([{"id": "c1", "type": "function", "function": fn}])


def distinct(i: int) -> str:
    """An answer of its own (a real answer to prompt ``i``)."""
    return f"Answer {i}: " + " ".join(f"w{i}x{k}" for k in range(30))


# ---- fixtures of collapsed answers --------------------------------------------------------------


def test_flags_only_and_every_answer_many_prompts_share_exactly() -> None:
    """The demo's collapse: 64 of 81 prompts got one answer; the 17 others are their own."""
    same = answer_text(COLLAPSED_REASONING, COLLAPSED, "[]")
    items = [("chat", prompt(i), same if i % 81 < 64 else distinct(i)) for i in range(81)]
    f = find(items)
    [group] = f.groups()
    assert (group.source, group.prompts, group.rows, group.variants) == ("chat", 64, 64, 1)
    assert f.rows() == {i for i in range(81) if i < 64}
    assert group.words == len(words(same)) >= DEFAULTS.collapse_min_words


def test_flags_the_same_text_with_small_variations() -> None:
    """A collapsed answer that names a number or the topic: one near group of 30 variants."""
    topics = ["pandas", "rust", "tax", "yoga", "chess", "kafka"]
    items = [
        ("chat", prompt(i), f"{COLLAPSED} You asked about {topics[i % 6]} item {i}.")
        for i in range(30)
    ]
    items += [("chat", prompt(100 + i), distinct(100 + i)) for i in range(30)]
    f = find(items)
    [group] = f.groups()
    assert (group.prompts, group.variants) == (30, 30)
    assert f.rows() == set(range(30))
    exact_only = find(items, DEFAULTS.model_copy(update={"collapse_similarity": 1.0}))
    assert exact_only.groups() == []  # every variant differs: only the near match sees them


def test_the_near_match_reads_the_opening_of_long_answers() -> None:
    """Past NEAR_WORDS words only the exact match reads on: a long shared opening is one
    answer, whatever follows it."""
    opening = " ".join(f"step{k % 97} of the plan" for k in range(NEAR_WORDS // 4 + 1))
    items = [("chat", prompt(i), f"{opening} {distinct(i)}") for i in range(8)]
    f = find(items)
    assert f.rows() == set(range(8)) and f.groups()[0].variants == 8


def test_counts_tool_calls_and_reasoning_as_the_answer() -> None:
    """A target that calls one tool with one long argument whatever it is asked collapses;
    the same call after reasoning of its own does not."""
    call = calls("search", q=COLLAPSED)
    items = [("tools", prompt(i), answer_text(None, "", call)) for i in range(10)]
    items += [("tools", prompt(20 + i), answer_text(distinct(i), "", call)) for i in range(10)]
    f = find(items)
    assert f.rows() == set(range(10))


def test_one_prompt_asked_again_is_one_prompt_and_sources_are_apart() -> None:
    same = answer_text(COLLAPSED_REASONING, COLLAPSED, "[]")
    again = [("chat", prompt(7), same) for _ in range(20)]  # a duplicate dedup kept
    split = [(f"src{i % 2}", prompt(i), same) for i in range(14)]  # 7 per source
    assert find(again).groups() == [] and find(split).groups() == []
    turns = [("chat", prompt(7, turn), same) for turn in range(8)]  # 8 turns: 8 prompts
    assert find(turns).groups()[0].prompts == 8
    assert find(split, DEFAULTS.model_copy(update={"collapse_min_prompts": 7})).rows() == set(
        range(14)
    )


def test_short_answers_real_sources_share_are_not_judged() -> None:
    """ "Sure!", "Yes.", the thank-you reply, a bare tool call, the demo target's answer: each
    given to 200 prompts, none flagged (all under collapse_min_words)."""
    from regen.devkit.demo_target import CONTENT, REASONING

    shared = [
        answer_text(None, "Sure!", "[]"),
        answer_text(None, "Yes.", "[]"),
        answer_text(
            None, "You're welcome! If you have any other questions, feel free to ask.", "[]"
        ),
        answer_text(None, "", calls("finish")),
        answer_text(None, "", calls("execute_bash", command="ls -la")),
        answer_text(REASONING, CONTENT, "[]"),
    ]
    items = [("src", prompt(i), shared[i % len(shared)]) for i in range(1200)]
    f = find(items)
    assert f.judged == 0 and f.groups() == [] and f.rows() == set()
    assert max(len(words(t)) for t in shared) == 13 < DEFAULTS.collapse_min_words


def test_the_flag_and_its_default() -> None:
    assert FLAGS[-1] == "collapsed" and "collapsed" in DEFAULT_DROP_FLAGS
    assert (
        DEFAULTS.collapse_min_prompts,
        DEFAULTS.collapse_min_words,
        DEFAULTS.collapse_similarity,
    ) == (8, 16, 0.8)


def test_answer_text_reads_stored_and_openai_tool_calls() -> None:
    assert answer_text("r", "c", calls("f", a="1")) == 'r\nc\nf {"a": "1"}'
    assert answer_text(None, "", [{"function": {"name": "f", "arguments": {"a": 1}}}]) == (
        'f {"a": 1}'
    )
    assert answer_text(None, None, "not json") == "not json"


# ---- the repository's real-shaped answers ------------------------------------------------------


def _answers(samples: Iterator[Sample]) -> Iterator[Item]:
    """The original answer of every turn a run regenerates (``turns: last``: the last one)."""
    for s in samples:
        if s.mode != "regenerate":
            continue
        answers = [m for m in s.messages if m.role == "assistant"]
        turns = range(len(answers))[-1:] if s.turns == "last" else range(len(answers))
        for t in turns:
            m = answers[t]
            calls = [c.to_openai() for c in m.tool_calls]
            yield (
                s.source,
                prompt_key(s.content_hash, s.id, t),
                answer_text(m.reasoning, m.content, calls),
            )


def _demo_target(samples: list[Sample]) -> Iterator[Item]:
    """What the demo target answers to the same turns (regen.devkit.demo_target.demo_answer)."""
    from regen.devkit.demo_target import demo_answer

    for s in samples:
        if s.mode != "regenerate":
            continue
        answers = [m for m in s.messages if m.role == "assistant"]
        turns = range(len(answers))[-1:] if s.turns == "last" else range(len(answers))
        for t in turns:
            a = demo_answer([], s.tools, answers[t])
            calls = [c.to_openai() for c in a.tool_calls]
            yield (
                s.source,
                prompt_key(s.content_hash, s.id, t),
                answer_text(a.reasoning, a.content, calls),
            )


def _margin(items: list[Item]) -> tuple[int, int]:
    """(flagged rows, the most distinct prompts one judged answer group holds)."""
    f = find(items)
    return len(f.rows()), max(f.largest().values(), default=0)


DEMOS = sorted(
    p for p in glob.glob(str(REPO / "manifests" / "demo*.yaml")) if "demo-train" not in p
)


@pytest.mark.parametrize("manifest", DEMOS, ids=lambda p: Path(p).stem)
def test_none_of_the_demo_answers_collapse(manifest: str) -> None:
    samples = list(read_samples(source_set(load_manifest(manifest))))
    flagged, largest = _margin(list(_answers(iter(samples))))
    assert flagged == 0 and largest <= 1  # the sources' own answers: no long one shared
    target = list(_demo_target(samples))
    flagged, largest = _margin(target)
    assert flagged == 0 and largest <= 1
    # the demo target answers most prompts alike, in 11 words: under collapse_min_words
    short = CollapseFinder(DEFAULTS.model_copy(update={"collapse_min_words": 1}))
    for n, (source, key, text) in enumerate(target):
        short.add(n, source, key, text)
    assert max(short.largest().values()) >= DEFAULTS.collapse_min_prompts


def test_none_of_the_stored_demo_rows_collapse() -> None:
    [path] = (REPO / "tests" / "data").glob("demo-rows-*.parquet")
    rows = [r for r in pq.read_table(path).to_pylist() if r["finish_reason"] is not None]
    items = [
        (r["source"], prompt_key(r["content_hash"], r["sample_id"], r["turn"]),
         answer_text(r["reasoning"], r["content"], r["tool_calls"]))
        for r in rows
    ]  # fmt: skip
    assert _margin(items) == (0, 1)


def test_none_of_the_simulator_answers_collapse() -> None:
    """The quality benchmark's simulator corpus: the 1,500 workload conversations and the demo,
    thinking on (2,255 answers)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import quality as bench
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    items = [
        (sid.split(":")[1] if sid.count(":") > 1 else "workload", (sid, 0),
         answer_text(kw["reasoning"], kw["content"], kw["tool_calls"]))
        for _, (sid, kw) in bench.simulator_items()
    ]  # fmt: skip
    flagged, largest = _margin(items)
    assert len(items) > 2000 and flagged == 0 and largest <= 2  # threshold 8


def test_none_of_the_rehearsal_sources_answers_collapse(tmp_path: Path) -> None:
    """The ten sources in their real row shapes (1,000 samples, read through the adapters)."""
    from benchmarks import _rehearsal_data as data

    made = data.make_data(tmp_path, 1000, scale=16)
    items = list(_answers(read_samples(source_set(load_manifest(made.manifest)))))
    assert len({s for s, _, _ in items}) == 9 and len(items) > 1500
    flagged, largest = _margin(items)
    assert flagged == 0 and largest <= 1
