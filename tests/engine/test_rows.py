"""Training rows: masked spans are exactly the produced turn; server ids; native; the schema."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from regen.core.errors import RowError, TemplateError
from regen.core.result import TurnResult
from regen.core.sample import Message, Sample, ToolCall
from regen.engine.rows import (
    build_rows,
    build_turn_row,
    count_check,
    native_row,
)
from regen.store.schema import COLUMNS, SCHEMA, rows_to_table
from regen.template.render import Renderer


def token_check_counts(rows: list[dict]) -> Counter[str]:
    """How many rows have each token_check value."""
    return Counter(r["token_check"] for r in rows if r.get("token_check") is not None)


TOKENIZER = Path(__file__).resolve().parents[2] / "manifests" / "demo" / "tokenizer"
CALL = ToolCall(id="functions.get_weather:0", name="get_weather", arguments='{"city": "Oslo"}')


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    return Renderer.from_dir(TOKENIZER, template_kwargs={"thinking": True})


def _result(reasoning: str | None, content: str, **kw) -> TurnResult:
    base = dict(tool_calls=(), finish_reason="stop", model="tiny", endpoint="http://127.0.0.1:1")
    base.update(kw)
    return TurnResult(content=content, reasoning=reasoning, **base)  # type: ignore[arg-type]


def _split(row: dict) -> tuple[list[int], list[int]]:
    mask = row["loss_mask"]
    first = mask.index(1)
    assert set(mask[:first]) == {0} and set(mask[first:]) == {1}, "mask is one contiguous span"
    return row["input_ids"][:first], row["input_ids"][first:]


def test_multi_turn_reasoning_every_row_masks_exactly_its_turn(renderer: Renderer) -> None:
    users = ["Pick a number.", "Double it.", "Now write it in words, please."]
    produced = [
        ("Any small number will do; choose seven.", "Seven."),
        ("Seven times two is fourteen.", "Fourteen."),
        ("Spell 14 out.", "fourteen — in words."),
    ]
    sample = Sample(id="demo:1", source="demo", messages=[])
    history: list[Message] = []
    rows = []
    for turn, (user, (reasoning, content)) in enumerate(zip(users, produced, strict=True)):
        history.append(Message("user", user))
        request = list(history)
        row = build_turn_row(sample, turn, request, _result(reasoning, content), renderer)
        rows.append(row)
        history.append(Message("assistant", content, reasoning=reasoning))

        prompt_ids, response_ids = _split(row)
        assert renderer.decode(response_ids) == f"{reasoning}</think>{content}<|im_end|>"
        assert renderer.decode(prompt_ids) == renderer.render_prompt(request)
        assert row["text"] == renderer.render_prompt(request) + renderer.decode(response_ids)
        assert row["loss_tokens"] == len(response_ids)
        assert row["num_tokens"] == len(row["input_ids"]) == len(row["loss_mask"])
        assert row["token_source"] == "local" and row["token_check"] == "count_unknown"
        assert json.loads(row["messages"]) == [m.to_openai() for m in request]
    # history turns are shown as at serving time: reasoning dropped by the template (the trap)
    assert "<think></think>Seven.<|im_end|>" in rows[2]["text"]
    assert "Any small number" not in rows[2]["text"].split("<think>Spell")[0]
    assert [r["turn"] for r in rows] == [0, 1, 2]


def test_tool_call_turn(renderer: Renderer) -> None:
    sample = Sample(id="t:1", source="t", messages=[], tools=[{"type": "function"}])
    res = _result("Need the tool.", "", tool_calls=(CALL,), finish_reason="tool_calls")
    row = build_turn_row(sample, 0, [Message("user", "Weather in Oslo?")], res, renderer)
    _, response_ids = _split(row)
    assert renderer.decode(response_ids) == (
        "Need the tool.</think><|tool_calls_section_begin|><|tool_call_begin|>"
        'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Oslo"}'
        "<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
    )
    assert json.loads(row["tool_calls"]) == [CALL.to_openai()]
    assert json.loads(row["tools"]) == [{"type": "function"}]
    assert row["text"].startswith("<|im_system|>tool_declare<|im_middle|>")
    # a rebuilt tool-call section cannot be proven equal to what the model produced (SGLang's
    # parser re-serializes ids and drops whitespace): flagged even when the count agrees
    res.completion_tokens = len(response_ids)
    again = build_turn_row(sample, 0, [Message("user", "Weather in Oslo?")], res, renderer)
    assert (again["token_source"], again["token_check"]) == ("local", "tool_calls_rebuilt")
    res.completion_tokens = len(response_ids) + 3
    worse = build_turn_row(sample, 0, [Message("user", "Weather in Oslo?")], res, renderer)
    assert worse["token_check"] == "count_mismatch"


def test_truncated_turn_has_no_end_token(renderer: Renderer) -> None:
    sample = Sample(id="t:2", source="t", messages=[])
    res = _result("I was thinking about", "", finish_reason="length")
    row = build_turn_row(sample, 0, [Message("user", "Think long.")], res, renderer)
    _, response_ids = _split(row)
    assert renderer.decode(response_ids) == "I was thinking about"
    assert row["truncated"] is True and row["finish_reason"] == "length"


def _server_result(renderer: Renderer, request: list[Message], **kw) -> TurnResult:
    local = renderer.render_turn(request, None, reasoning="R.", content="Answer.")
    return _result(
        "R.",
        "Answer.",
        prompt_token_ids=list(local.prompt_ids),
        output_token_ids=list(local.response_ids[:-1]),  # server stopped without <|im_end|>
        prompt_tokens=len(local.prompt_ids),
        completion_tokens=len(local.response_ids) - 1,
        **kw,
    )


def test_server_ids_are_the_row_and_match_is_recorded(renderer: Renderer) -> None:
    request = [Message("user", "Hi")]
    res = _server_result(renderer, request)
    row = build_turn_row(Sample(id="s:1", source="s", messages=[]), 0, request, res, renderer)
    assert row["token_source"] == "server"
    assert row["token_check"] == "match"
    assert row["im_end_added"] is True
    assert row["input_ids"] == res.prompt_token_ids + res.output_token_ids + [renderer.end_id]
    assert row["completion_tokens"] == res.completion_tokens  # server usage kept as reported

    # output ids that already end with <|im_end|> get nothing appended
    res.output_token_ids = [*res.output_token_ids, renderer.end_id]
    row = build_turn_row(Sample(id="s:1", source="s", messages=[]), 0, request, res, renderer)
    assert row["im_end_added"] is False and row["token_check"] == "match"
    assert row["input_ids"][-1] == renderer.end_id and row["input_ids"][-2] != renderer.end_id


def test_server_ids_win_over_a_disagreeing_render(renderer: Renderer) -> None:
    request = [Message("user", "Hi")]
    sample = Sample(id="s:2", source="s", messages=[])
    res = _server_result(renderer, request)
    res.prompt_token_ids = [*res.prompt_token_ids[:-1], 7]  # the server saw something else
    row = build_turn_row(sample, 0, request, res, renderer)
    assert row["token_check"] == "prompt_mismatch"
    assert row["input_ids"][: len(res.prompt_token_ids)] == res.prompt_token_ids
    assert row["text"] == renderer.decode(row["input_ids"])

    res2 = _server_result(renderer, request)
    res2.output_token_ids = [5, *res2.output_token_ids]
    row2 = build_turn_row(sample, 0, request, res2, renderer)
    assert row2["token_check"] == "response_mismatch"
    assert token_check_counts([row, row2, row2]) == {"prompt_mismatch": 1, "response_mismatch": 2}


def test_truncated_server_ids_get_nothing_appended(renderer: Renderer) -> None:
    request = [Message("user", "Hi")]
    res = _server_result(renderer, request, finish_reason="length")
    row = build_turn_row(Sample(id="s:3", source="s", messages=[]), 0, request, res, renderer)
    assert row["im_end_added"] is False
    assert row["input_ids"] == res.prompt_token_ids + res.output_token_ids


def test_render_error_with_server_ids_keeps_the_row_and_says_so() -> None:
    off = Renderer.from_dir(TOKENIZER, template_kwargs={"thinking": False})
    request = [Message("user", "Hi")]
    res = _result("unexpected reasoning", "Hey.", prompt_token_ids=[1, 2], output_token_ids=[3])
    row = build_turn_row(Sample(id="s:4", source="s", messages=[]), 0, request, res, off)
    assert row["token_check"] == "render_error"
    assert row["input_ids"] == [1, 2, 3, off.end_id]
    assert row["loss_mask"] == [0, 0, 1, 1]
    # without server ids the inconsistency cannot be turned into a row
    res.prompt_token_ids = res.output_token_ids = None
    with pytest.raises(TemplateError):
        build_turn_row(Sample(id="s:4", source="s", messages=[]), 0, request, res, off)


def test_native_row_passes_through_unchanged() -> None:
    ids, mask = [1013, 1020, 5, 6, 1011], [0, 0, 1, 1, 1]
    s = Sample(id="n:1", source="n", messages=[], mode="native", input_ids=ids, loss_mask=mask)
    row = native_row(s)
    assert row["input_ids"] == ids and row["loss_mask"] == mask
    assert row["input_ids"] is not ids  # a copy, never shared with the sample
    assert (row["token_source"], row["prompt_tokens"], row["completion_tokens"]) == ("native", 2, 3)
    with pytest.raises(RowError):
        native_row(Sample(id="n:2", source="n", messages=[], input_ids=[1], loss_mask=[]))


def test_rows_to_table_round_trip_and_strictness(renderer: Renderer) -> None:
    row = build_turn_row(
        Sample(id="r:1", source="r", messages=[]),
        0,
        [Message("user", "Grüße 🙂")],
        _result("R", "C", ttft_s=0.25),
        renderer,
    )
    nat = native_row(Sample(id="n:1", source="n", messages=[], input_ids=[1, 2], loss_mask=[0, 1]))
    assert set(row) == set(COLUMNS) == set(nat)
    rows = [json.loads(json.dumps(r)) for r in (row, nat)]  # rows are JSON-native (journal)
    table = rows_to_table(rows)
    assert table.schema.equals(SCHEMA)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    back = pq.read_table(io.BytesIO(buf.getvalue()))
    assert back.schema.field("input_ids").type == pa.list_(pa.int32())
    assert back.schema.field("loss_mask").type == pa.list_(pa.int8())
    assert back.to_pylist() == rows

    with pytest.raises(RowError, match="unknown"):
        rows_to_table([{**row, "extra": 1}])
    with pytest.raises(RowError, match="missing"):
        rows_to_table([{k: v for k, v in row.items() if k != "turn"}])
    with pytest.raises(RowError):
        rows_to_table([{**row, "input_ids": ["x"]}])


def test_parserless_server_output_row_has_one_think_close(renderer: Renderer) -> None:
    """No reasoning parser: content is the whole output; the row must not gain a </think>."""
    request = [Message("user", "Hi")]
    probe = renderer.render_turn(request, None, reasoning="Think.", content="Done.")
    res = _result(None, "Think.</think>Done.", completion_tokens=len(probe.response_ids))
    row = build_turn_row(Sample(id="p:1", source="p", messages=[]), 0, request, res, renderer)
    _, response_ids = _split(row)
    assert renderer.decode(response_ids) == "Think.</think>Done.<|im_end|>"
    assert (row["reasoning"], row["content"]) == ("Think.", "Done.")
    assert row["token_check"] == "count_match"


def test_local_rows_compare_length_with_server_count(renderer: Renderer) -> None:
    request = [Message("user", "Hi")]
    sample = Sample(id="c:1", source="c", messages=[])
    n = len(renderer.render_turn(request, None, reasoning="R.", content="A.").response_ids)
    checks = [
        build_turn_row(sample, 0, request, _result("R.", "A.", completion_tokens=c), renderer)[
            "token_check"
        ]
        for c in (n, n - 1, n - 2, n + 1)
    ]
    assert checks == ["count_match", "count_match", "count_mismatch", "count_mismatch"]
    # no <|im_end|> at the end (truncated): no allowance
    res = _result("R", "", finish_reason="length", completion_tokens=0)
    row = build_turn_row(sample, 0, request, res, renderer)
    assert row["token_check"] == "count_mismatch"
    assert token_check_counts([{"token_check": c} for c in checks]) == {
        "count_match": 2,
        "count_mismatch": 2,
    }


def test_count_check_allowance() -> None:
    assert count_check(5, None, ends_with_end=True) is None
    assert count_check(5, 5, ends_with_end=False) == "count_match"
    assert count_check(6, 5, ends_with_end=True) == "count_match"
    assert count_check(6, 5, ends_with_end=False) == "count_mismatch"


def test_flags_outrank_the_count(renderer: Renderer) -> None:
    request = [Message("user", "Hi")]
    sample = Sample(id="f:1", source="f", messages=[])
    inserted = build_turn_row(
        sample, 0, request, _result(None, "A.", completion_tokens=3), renderer
    )
    assert inserted["token_check"] == "think_inserted"
    assert renderer.decode(_split(inserted)[1]) == "</think>A.<|im_end|>"
    has_think = build_turn_row(sample, 0, request, _result("R", "A<think>B"), renderer)
    assert has_think["token_check"] == "content_has_think"


# ---- quality columns and attempts (issue 15) ------------------------------------------------


def test_every_row_carries_the_quality_columns_and_its_attempt(renderer: Renderer) -> None:
    from regen.core.sample import ATTEMPT_META
    from regen.quality import COLUMNS as QUALITY

    loop = "Wait, let me check the value again. " * 30
    request = [Message("user", "What is the value of the cache after three steps?")]
    res = _result(loop, "", finish_reason="length")
    sample = Sample(id="q:1", source="q", messages=[], meta={ATTEMPT_META: 2})
    row = build_turn_row(sample, 0, request, res, renderer)
    assert row["attempt"] == 2
    assert row["quality_flags"] == ["repetition", "reasoning_unclosed"]
    assert row["q_repeat_ngram"] == 7 and row["q_repeat_words"] >= 200
    assert set(QUALITY.names) <= set(row)
    clean = build_turn_row(Sample(id="q:2", source="q", messages=[]), 0, request,
                           _result("Three steps.", "It holds 3."), renderer)  # fmt: skip
    assert clean["attempt"] == 0 and clean["quality_flags"] == []
    nat = native_row(Sample(id="n:1", source="n", messages=[], input_ids=[1, 2], loss_mask=[0, 1]))
    assert nat["quality_flags"] == [] and nat["q_compression"] is None and nat["attempt"] == 0


def test_think_closed_comes_from_the_server_ids(renderer: Renderer) -> None:
    """Reasoning and no content that stopped by itself: the ids say whether </think> was
    written (empty content after it) or not (reasoning never closed)."""
    request = [Message("user", "Think about it and answer.")]
    local = renderer.render_turn(request, None, reasoning="Hmm.", content="")
    close = renderer.think_close_id
    assert close is not None and close in local.response_ids
    closed = _result("Hmm.", "", prompt_token_ids=list(local.prompt_ids),
                     output_token_ids=list(local.response_ids))  # fmt: skip
    sample = Sample(id="k:1", source="k", messages=[])
    assert build_turn_row(sample, 0, request, closed, renderer)["quality_flags"] == [
        "empty_content"
    ]
    never = _result("Hmm.", "", prompt_token_ids=list(local.prompt_ids),
                    output_token_ids=[i for i in local.response_ids if i != close])  # fmt: skip
    assert build_turn_row(sample, 0, request, never, renderer)["quality_flags"] == [
        "reasoning_unclosed"
    ]


def test_think_closed_comes_from_the_local_render_without_server_ids(
    renderer: Renderer,
) -> None:
    """A parser-less server's output with no </think>: the render had to insert it."""
    request = [Message("user", "Think about it and answer.")]
    row = build_turn_row(Sample(id="k:2", source="k", messages=[]), 0, request,
                         _result(None, "only thoughts, never closed"), renderer)  # fmt: skip
    assert row["token_check"] == "think_inserted"
    assert row["quality_flags"] == ["reasoning_unclosed"]


def test_the_manifests_thresholds_decide(renderer: Renderer) -> None:
    from regen.quality import QualityConfig

    text = " ".join(["one two three four five six"] * 12)  # a 72-word run
    request = [Message("user", "Count for me, please, in words and slowly.")]
    res = _result("Counting.", text, finish_reason="length")
    sample = Sample(id="t:1", source="t", messages=[])
    assert build_turn_row(sample, 0, request, res, renderer)["quality_flags"] == ["repetition"]
    strict = QualityConfig(repeat_min_words=100)
    assert build_turn_row(sample, 0, request, res, renderer, strict)["quality_flags"] == []


def test_a_row_from_before_the_quality_columns_is_upgraded(renderer: Renderer) -> None:
    """A journal line of a session made before issue 15 (folded on resume) still fits."""
    from regen.store.schema import ADDED_COLUMNS, upgrade_row

    row = build_turn_row(Sample(id="o:1", source="o", messages=[]), 0,
                         [Message("user", "Please summarise the text for me.")],
                         _result("", ""), renderer)  # fmt: skip
    old = {k: v for k, v in row.items() if k not in ADDED_COLUMNS.names}
    new = upgrade_row(old)
    assert new["attempt"] == 0 and new["quality_flags"] == ["empty_content"]
    assert {k: new[k] for k in ADDED_COLUMNS.names} == {k: row[k] for k in ADDED_COLUMNS.names}
    assert rows_to_table([old]).to_pylist()[0]["quality_flags"] == ["empty_content"]
    assert upgrade_row(row) is row


def _chain(n_turns: int, tools: bool) -> tuple[Sample, list[tuple[int, list, TurnResult]]]:
    """A sample's turns as the worker hands them over: each request carries the replies so far;
    with ``tools`` every even reply calls a tool and every odd one answers plainly (the Kimi
    history rule then rewrites the turns before a plain answer: no reasoning)."""
    from regen.engine.turns import reply_message

    sample = Sample(
        id="m:1", source="m", messages=[], tools=[{"type": "function"}] if tools else None
    )
    history: list[Message] = [Message("user", "Start, please: " + "word " * 30)]
    turns = []
    for t in range(n_turns):
        calls = (ToolCall(f"functions.f:{t}", "f", '{"a": 1}'),) if tools and t % 2 == 0 else ()
        res = _result(f"Reasoning {t}.", "" if calls else f"Answer {t}.", tool_calls=calls,
                      finish_reason="tool_calls" if calls else "stop")  # fmt: skip
        turns.append((t, list(history), res))
        history.append(reply_message(res))
        if calls:
            history.append(Message("tool", f"result {t}", tool_call_id=calls[0].id))
        history.append(Message("user", f"Next {t}."))
    return sample, turns


def _no_time(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "created_at"} for r in rows]


@pytest.mark.parametrize("tools", [False, True])
def test_rows_of_a_sample_equal_rows_of_each_turn_alone(tools: bool) -> None:
    """build_rows reuses a prompt's ids for the next turn (and batches the tokenizer); the rows
    are those of building each turn on its own, where every prompt is encoded whole."""
    r = Renderer.from_dir(TOKENIZER, template_kwargs={"thinking": True})
    sample, turns = _chain(5, tools)
    together = build_rows(sample, turns, r)
    st = dict(r.prompts.stats)
    alone = [build_turn_row(sample, t, m, res, r) for t, m, res in turns]
    assert _no_time(together) == _no_time(alone)
    for row, (_, msgs, _) in zip(together, turns, strict=True):
        prompt_ids, _ = _split(row)
        assert prompt_ids == r.encode(r.render_prompt(msgs, sample.tools))
    assert (st.get("extended", 0), st.get("common_prefix", 0)) == ((2, 2) if tools else (4, 0))
    assert st["first"] == 1 and "mismatch" not in st


def test_a_sample_mixing_server_and_local_turns(renderer: Renderer) -> None:
    sample, turns = _chain(3, tools=False)
    _, msgs, res = turns[1]
    local = renderer.render_turn(msgs, None, reasoning=res.reasoning, content=res.content)
    res.prompt_token_ids, res.output_token_ids = local.prompt_ids, local.response_ids
    rows = build_rows(sample, turns, renderer)
    assert [r["token_source"] for r in rows] == ["local", "server", "local"]
    assert rows[1]["token_check"] == "match" and rows[1]["im_end_added"] is False
    assert _no_time(rows) == _no_time([build_turn_row(sample, *x, renderer) for x in turns])


def test_the_first_turn_that_cannot_be_a_row_raises(renderer: Renderer) -> None:
    off = Renderer.from_dir(TOKENIZER, template_kwargs={"thinking": False})
    sample = Sample(id="e:1", source="e", messages=[])
    ok = (0, [Message("user", "Hi")], _result(None, "Hey."))
    bad = (1, [Message("user", "Hi")], _result("reasoning with thinking off", "Hey."))
    with pytest.raises(TemplateError, match="closed <think>"):
        build_rows(sample, [ok, bad], off)
    empty = (0, [Message("user", "Hi")], _result(None, "", finish_reason="length"))
    with pytest.raises(TemplateError, match="e:1 turn 0: empty response"):
        build_rows(sample, [empty, bad], off)


def test_server_ids_are_compared_as_text(renderer: Renderer) -> None:
    """Ids that decode to the rendered text are a match even when the tokenizer would have
    merged them (a sampled split): the row is the server's ids, as they came."""
    request = [Message("user", "Hi")]
    res = _server_result(renderer, request)
    merged = next(i for i in res.output_token_ids if len(renderer.decode([i])) > 1)
    pieces = [renderer.encode(ch)[0] for ch in renderer.decode([merged])]
    assert len(pieces) > 1
    at = res.output_token_ids.index(merged)
    res.output_token_ids[at : at + 1] = pieces
    row = build_turn_row(Sample(id="s:5", source="s", messages=[]), 0, request, res, renderer)
    assert row["token_check"] == "match"
    assert row["input_ids"] == res.prompt_token_ids + res.output_token_ids + [renderer.end_id]
    assert row["text"] == renderer.decode(row["input_ids"])


def test_every_row_records_the_content_it_answers_and_the_settings_that_made_it(
    renderer: Renderer,
) -> None:
    from regen.manifest import parse_manifest
    from regen.store.schema import ANSWER_COLUMNS, SCHEMA, upgrade_row

    base = {"name": "t", "target": {"model": "m", "tokenizer": "tok"},
            "sources": [{"name": "s", "adapter": "sharegpt", "path": "x.jsonl"}]}  # fmt: skip
    m6 = parse_manifest({**base, "sampling": {"temperature": 0.6}})
    m7 = parse_manifest({**base, "sampling": {"temperature": 0.7}})
    assert m6.settings_id() != m7.settings_id() and len(m6.settings_id()) == 8
    assert m6.settings_id() == parse_manifest({**base, "sampling": {"temperature": 0.6},
                                               "engine": {"workers": 9}}).settings_id()  # fmt: skip
    sample = Sample(id="o:1", source="o", messages=[Message("user", "hello there")])
    row = build_turn_row(sample, 0, sample.messages, _result("", "hi"), renderer,
                         settings=m6.settings_id())  # fmt: skip
    assert (row["content_hash"], row["settings"]) == (sample.content_hash, m6.settings_id())
    native = native_row(Sample(id="n:1", source="n", messages=[], mode="native",
                               input_ids=[1, 2, 3], loss_mask=[0, 1, 1]))  # fmt: skip
    assert native["settings"] is None and native["content_hash"]
    table = rows_to_table([row, native])
    assert table.schema.equals(SCHEMA)
    old = {k: v for k, v in row.items() if k not in ANSWER_COLUMNS.names}
    assert {k: upgrade_row(old)[k] for k in ANSWER_COLUMNS.names} == {
        "content_hash": None,  # unknown, not stale
        "settings": None,
    }
