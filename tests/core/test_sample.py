"""Record types: stable ids, the dedup hash, turn counting, OpenAI message round trips."""

from __future__ import annotations

from regen.core.sample import Message, Rejection, Sample, ToolCall, make_sample_id, stable_hash


def conv(*texts: str) -> list[Message]:
    roles = ("user", "assistant")
    return [Message(roles[i % 2], t) for i, t in enumerate(texts)]  # type: ignore[arg-type]


def test_make_sample_id_prefers_upstream_id() -> None:
    assert make_sample_id("sg", "  abc_1 ", conv("hi")) == "sg:abc_1"
    assert make_sample_id("sg", 42, conv("hi")) == "sg:42"


def test_make_sample_id_hash_is_stable_and_normalized() -> None:
    a = make_sample_id("pb", None, conv("Hello  world", "ok"))
    b = make_sample_id("pb", "", conv(" Hello world\n", "ok"))
    c = make_sample_id("pb", None, conv("Hello world", "no"))
    assert a == b != c
    assert a.startswith("pb:h") and len(a) == len("pb:h") + 16
    # pinned: the id must never change across versions for the same conversation
    assert a == "pb:h" + stable_hash(
        [
            {"r": "user", "c": "Hello world", "k": None, "t": []},
            {"r": "assistant", "c": "ok", "k": None, "t": []},
        ]
    )


def test_content_hash_ignores_source_and_id_but_not_tools() -> None:
    s1 = Sample(id="a:1", source="a", messages=conv("q", "a"))
    s2 = Sample(id="b:9", source="b", messages=conv("q", "a"))
    s3 = Sample(id="b:9", source="b", messages=conv("q", "a"), tools=[{"type": "function"}])
    assert s1.content_hash == s2.content_hash != s3.content_hash


def test_native_content_hash_uses_tokens() -> None:
    a = Sample(id="n:1", source="n", messages=[], mode="native", input_ids=[1, 2], loss_mask=[0, 1])
    b = Sample(id="n:2", source="n", messages=[], mode="native", input_ids=[1, 2], loss_mask=[1, 1])
    assert a.content_hash != b.content_hash
    assert a.turns_to_regenerate() == 0


def test_turns_to_regenerate() -> None:
    multi = Sample(id="x", source="s", messages=conv("a", "b", "c", "d"))
    assert (multi.assistant_turns(), multi.turns_to_regenerate()) == (2, 2)
    multi.turns = "last"
    assert multi.turns_to_regenerate() == 1
    prompt_only = Sample(id="y", source="s", messages=conv("a"))
    assert prompt_only.turns_to_regenerate() == 1


def test_prompt_chars_counts_non_assistant_text() -> None:
    s = Sample(id="x", source="s", messages=[Message("system", "ab"), *conv("cde", "zzzz")])
    assert s.prompt_chars() == 5


def test_message_openai_round_trip_with_tool_calls() -> None:
    m = Message(
        "assistant",
        "",
        reasoning="think",
        tool_calls=(ToolCall("functions.f:0", "f", '{"a": 1}'),),
    )
    d = m.to_openai()
    assert d["tool_calls"][0] == {
        "id": "functions.f:0",
        "type": "function",
        "function": {"name": "f", "arguments": '{"a": 1}'},
    }
    assert Message.from_openai(d) == m
    t = Message("tool", "42", tool_call_id="functions.f:0", name="f")
    assert Message.from_openai(t.to_openai()) == t


def test_rejection_text_names_source_row_and_field() -> None:
    r = Rejection("sharegpt", 12, "unknown_role", "role 'narrator'", "conversations[1].from")
    assert str(r) == (
        "source 'sharegpt' row 12 field 'conversations[1].from': unknown_role (role 'narrator')"
    )


def test_pickle_round_trip_keeps_every_field_and_the_hash() -> None:
    import pickle

    from regen.core.sample import Message, Sample, ToolCall

    calls = (ToolCall("c1", "f", '{"a": 1}'),)
    s = Sample("x:1", "x", [Message("system", "sys"), Message("user", "q", name="u"),
                            Message("assistant", "a", reasoning="r", tool_calls=calls),
                            Message("tool", "out", tool_call_id="c1")],
               tools=[{"type": "function", "function": {"name": "f"}}], turns="last", row=7,
               meta={"k": [1, 2]})  # fmt: skip
    h = s.content_hash
    back = pickle.loads(pickle.dumps(s, protocol=5))
    assert back == s and back.row == 7 and back.meta == {"k": [1, 2]} and back.turns == "last"
    assert back.content_hash == h
