from regen.devkit.simulate.tokens import count_tokens, prompt_tokens, split_pieces


def test_word_pieces():
    assert split_pieces(" simulated.") == [" simu", "late", "d", "."]
    assert split_pieces("Hello, world 42!") == ["Hell", "o", ",", " worl", "d", " 4", "2", "!"]
    assert count_tokens("Hello, world 42!") == 8


def test_counts_match_pieces_and_ignore_trailing_space():
    text = "Hello, world 42!\n\n  ünïcode  "
    assert count_tokens(text) == len(split_pieces(text))
    assert "".join(split_pieces(text)) == text.rstrip()
    assert count_tokens("") == 0 and count_tokens("   ") == 0


def test_prompt_tokens_adds_framing_and_tools():
    msgs = [{"role": "user", "content": "abcd efgh"}]
    assert prompt_tokens(msgs, None) == 3 + 3 + 2
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert prompt_tokens(msgs, tools) > prompt_tokens(msgs, None) + 3
    parts = [{"role": "user", "content": [{"type": "text", "text": "abcd efgh"}]}]
    assert prompt_tokens(parts, None) == prompt_tokens(msgs, None)
