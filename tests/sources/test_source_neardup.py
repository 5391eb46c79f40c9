"""Near-duplicate prompts: normalization, what is compared, the banding, the index, the stream."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from _sources_helpers import manifest_for, write_jsonl

from regen.core.sample import Message, Sample, ToolCall
from regen.core.text import words
from regen.manifest import Dedup
from regen.sources import ReadStats, neardup, read_samples, source_set
from regen.sources.neardup import (
    NearDuplicates,
    expected_recall,
    lsh_params,
    near_text,
    shingles,
)

VOCAB = [f"w{i}" for i in range(20_000)]


def sample(sid: str, *msgs: tuple[str, str], source: str = "s", **kw) -> Sample:
    return Sample(
        id=f"{source}:{sid}", source=source, messages=[Message(r, c) for r, c in msgs], **kw
    )  # type: ignore[arg-type]


def user(text: str, sid: str, source: str = "s") -> Sample:
    return sample(sid, ("user", text), ("assistant", "ok"), source=source)


def test_words_fold_case_width_punctuation_and_split_cjk() -> None:
    assert words("Hello,  WORLD!\n It's fine.") == ["hello", "world", "it", "s", "fine"]
    assert words("ＦＵＬＬ width") == ["full", "width"]  # NFKC
    assert words("用Python写代码") == ["用", "python", "写", "代", "码"]
    assert words("おはよう 안녕") == ["お", "は", "よ", "う", "안", "녕"]
    assert words("snake_case x2") == ["snake_case", "x2"]
    assert words("... !!! ---") == []


def test_shingles_of_short_and_long_texts() -> None:
    assert shingles("", 5) == [] and shingles("?!", 5) == []
    assert shingles("one two three", 5) == ["one two three"]
    assert shingles("a b c d e f", 5) == ["a b c d e", "b c d e f"]
    assert shingles("A b C", 1) == ["a", "b", "c"]


def test_near_text_leaves_out_system_prompts_and_answers_keeps_tools() -> None:
    s = sample(
        "1",
        ("system", "You are terse."),
        ("user", "first question"),
        ("assistant", "an answer that is regenerated"),
        ("user", "second question"),
        tools=[{"type": "function", "function": {"name": "zeta"}}, {"function": {"name": "alpha"}}],
    )
    assert near_text(s) == "first question\nsecond question\ntools alpha zeta"
    other_system = sample("2", ("system", "Be verbose."), ("user", "first question"),
                          ("assistant", "x"), ("user", "second question"))  # fmt: skip
    assert near_text(other_system) == "first question\nsecond question"


def test_near_text_of_last_turn_samples_keeps_the_fixed_history() -> None:
    history = Message("assistant", "I will look.", tool_calls=(ToolCall("c1", "ls", '{"p": "/"}'),))
    s = Sample(
        id="s:1",
        source="s",
        messages=[
            Message("user", "fix the bug"),
            history,
            Message("tool", "a.py b.py", tool_call_id="c1"),
            Message("assistant", "regenerated"),
        ],
        turns="last",
    )
    assert near_text(s) == 'fix the bug\nI will look.\nls {"p": "/"}\na.py b.py'
    s.turns = "all"
    assert near_text(s) == "fix the bug\na.py b.py"


@pytest.mark.parametrize(
    ("threshold", "num_perm"), [(0.85, 128), (0.5, 128), (0.95, 64), (0.7, 256)]
)
def test_lsh_params_reach_the_recall_at_the_threshold(threshold: float, num_perm: int) -> None:
    bands, rows = lsh_params(threshold, num_perm)
    assert bands * rows <= num_perm
    assert expected_recall(threshold, bands, rows) >= neardup.BAND_RECALL
    if rows < num_perm:  # one more row per band would fall below the recall
        assert expected_recall(threshold, num_perm // (rows + 1), rows + 1) < neardup.BAND_RECALL
    assert lsh_params(0.85, 128) == (14, 9)


def _text(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(VOCAB) for _ in range(n)]


def _with_jaccard(base: list[str], target: float, rng: random.Random, k: int = 5) -> list[str]:
    """``base`` with its tail replaced so that the shingle sets have Jaccard ``target``."""
    n = len(base) - k + 1  # shingles of base
    # replacing the last m words changes the last m shingles: J = (n - m) / (n + m)
    m = round(n * (1 - target) / (1 + target))
    return base[: len(base) - m] + _text(rng, m)


def test_index_finds_pairs_above_the_threshold_and_not_below() -> None:
    rng = random.Random(7)
    idx = NearDuplicates(Dedup())
    bases = [_text(rng, 80) for _ in range(300)]
    for i, b in enumerate(bases):
        assert idx.match_or_add(user(" ".join(b), f"b{i}"), None) is None
    found = {0.97: 0, 0.92: 0, 0.6: 0}
    for j, target in enumerate(found):
        for i, b in enumerate(bases):
            m = idx.match_or_add(user(" ".join(_with_jaccard(b, target, rng)), f"q{j}-{i}"))
            if m is not None:
                assert m.id == f"s:b{i}" and m.source == "s"
                assert abs(m.similarity - target) < 0.12
                found[target] += 1
    assert found[0.97] == 300 and found[0.92] >= 294  # recall (banding and estimate noise)
    assert found[0.6] == 0  # far below the threshold: never dropped
    assert idx.count == 300 + 300  # the 0.6 ones were indexed, the dropped ones not


def test_index_across_many_sorted_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(neardup, "PENDING_SAMPLES", 16)  # many flushes and merges
    rng = random.Random(3)
    idx = NearDuplicates(Dedup())
    bases = [_text(rng, 30) for _ in range(1000)]
    for i, b in enumerate(bases):
        assert idx.match_or_add(user(" ".join(b), f"b{i}", source=f"src{i % 3}")) is None
    assert len(idx._index._runs) < 12  # merged: O(log n) runs
    for i in rng.sample(range(1000), 200):
        m = idx.match_or_add(user(" ".join(bases[i]).upper() + " !", f"x{i}"))
        assert m is not None and (m.id, m.source) == (f"src{i % 3}:b{i}", f"src{i % 3}")
        assert m.similarity == 1.0


def test_first_wins_and_dropped_samples_are_not_indexed() -> None:
    rng = random.Random(11)
    n = 200  # shingles of a 204-word text
    a = _text(rng, n + 4)
    b = a[: n + 4 - 10] + _text(rng, 10)  # J(a, b) = 190/210 = 0.90
    c = b[: n + 4 - 24] + _text(rng, 14)  # J(b, c) = 186/214 = 0.87; J(a, c) = 176/224 = 0.79
    idx = NearDuplicates(Dedup(num_perm=512))
    assert idx.match_or_add(user(" ".join(a), "a", source="x")) is None
    mb = idx.match_or_add(user(" ".join(b), "b", source="y"))
    assert mb is not None and (mb.id, mb.source) == ("x:a", "x")
    assert idx.match_or_add(user(" ".join(c), "c")) is None  # b was dropped, so not indexed
    assert idx.count == 2


def test_the_most_similar_indexed_sample_is_reported() -> None:
    rng = random.Random(2)
    z = _text(rng, 204)
    x = _text(rng, 14) + z[14:]  # J(z, x) = 186/214 = 0.87
    y = z[:-6] + _text(rng, 6)  # J(z, y) = 194/206 = 0.94; J(x, y) = 180/220 = 0.82
    idx = NearDuplicates(Dedup(num_perm=512))
    assert idx.match_or_add(user(" ".join(x), "x")) is None
    assert idx.match_or_add(user(" ".join(y), "y")) is None  # not near x: both indexed
    m = idx.match_or_add(user(" ".join(z), "z"))
    assert m is not None and m.id == "s:y" and m.similarity > 0.9


def test_samples_without_words_are_left_to_exact_dedup() -> None:
    idx = NearDuplicates(Dedup())
    assert idx.match_or_add(user("?!", "p1")) is None
    assert idx.match_or_add(user("?!", "p2")) is None
    assert idx.count == 0


def test_nbytes_per_sample_is_the_stated_figure() -> None:
    rng = random.Random(5)
    idx = NearDuplicates(Dedup())
    n = 5000
    for i in range(n):
        idx.match_or_add(user(" ".join(_text(rng, 40)), f"{i:06d}"))
    idx._index._flush()
    per = (idx.nbytes() - neardup.SIG_CHUNK * 128 + n * 128) / n  # signature chunk preallocated
    assert 14 * 12 + 128 <= per <= 340  # index + signature + id + source


def _conv(q: str, a: str = "ok", system: str | None = None) -> dict:
    msgs = [{"from": "system", "value": system}] if system else []
    return {"conversations": [*msgs, {"from": "human", "value": q}, {"from": "gpt", "value": a}]}


Q1 = "Explain how a bloom filter answers membership queries and why it has no false negatives."
Q2 = "Write a short poem about the sea at night with the moon rising over the water."


def test_stream_drops_near_duplicates_across_sources_before_the_limit(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [_conv(Q1), _conv(Q2)])
    write_jsonl(
        tmp_path / "b.jsonl",
        [
            _conv(Q1.upper(), "another answer"),  # near (casing), other answer: not exact
            _conv(Q1, "ok"),  # exact duplicate of a's first row
            _conv(Q2 + " Thanks!", "x", system="Be brief."),  # near: system + trailing thanks
            _conv("A different question about compilers and their optimization passes."),
            _conv("And yet another question about sourdough bread and its hydration."),
        ],
    )
    m = manifest_for(
        tmp_path,
        [
            {"name": "a", "adapter": "sharegpt", "path": "a.jsonl"},
            {"name": "b", "adapter": "sharegpt", "path": "b.jsonl", "limit": 1},
        ],
    )
    stats = ReadStats()
    got = list(read_samples(source_set(m), stats))
    assert [(s.source, s.row) for s in got] == [("a", 1), ("a", 2), ("b", 4)]
    b = stats.sources["b"]
    assert (b.read, b.duplicates, b.near_duplicates, b.kept, b.limit_reached) == (4, 1, 2, 1, True)
    assert stats.near.counts == {("b", "a"): 2}
    ex = stats.near.examples[("b", "a")]
    assert [e["duplicate_of"] for e in ex] == [got[0].id, got[1].id]
    assert ex[1]["prompt"] == Q2 + " Thanks!"

    both = [{"name": n, "adapter": "sharegpt", "path": f"{n}.jsonl"} for n in "ab"]
    off = manifest_for(tmp_path, both).model_copy(update={"dedup": Dedup(near=False)})
    stats_off = ReadStats()
    ids_off = [s.id for s in read_samples(source_set(off), stats_off)]
    assert stats_off.sources["b"].near_duplicates == 0 and len(ids_off) == 2 + 4
    assert ids_off[:2] == [s.id for s in got[:2]]  # ids do not depend on dedup


def test_exact_copy_of_a_near_dropped_sample_counts_as_exact(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [_conv(Q1), _conv(Q1.upper(), "y"), _conv(Q1.upper(), "y")])
    m = manifest_for(tmp_path, [{"name": "a", "adapter": "sharegpt", "path": "a.jsonl"}])
    stats = ReadStats()
    assert len(list(read_samples(source_set(m), stats))) == 1
    assert (stats.sources["a"].near_duplicates, stats.sources["a"].duplicates) == (1, 1)
    assert stats.near.counts == {("a", "a"): 1}


def test_native_samples_are_not_compared(tmp_path: Path) -> None:
    rows = [{"id": f"n{i}", "input_ids": [1, 2, 3, i], "loss_mask": [0, 0, 1, 1]} for i in range(3)]
    write_jsonl(tmp_path / "n.jsonl", rows)
    m = manifest_for(
        tmp_path,
        [{"name": "n", "adapter": "kimi_native", "path": "n.jsonl", "mode": "native"}],
    )
    stats = ReadStats()
    assert len(list(read_samples(source_set(m), stats))) == 3 and stats.near.total == 0
