"""Raw markup a reply kept in its content (a call the parser could not read, a stray close
marker) is encoded in a later prompt the way the target's tokenizer encodes it at serving time.

A server renders the chat template to text and encodes it with the target's tokenizer, which
reads special-token text inside a message as the special token. The row's prompt must hold
the same ids: for every family rendered by a Jinja template, the Renderer's ids of a prompt whose
history holds the family's own markup equal the tokenizer's ``apply_chat_template(tokenize=True)``
(the families the engines encode in Python, segment by segment, have their own contract tests:
tests/targets/test_kimi_k3_contract.py, test_deepseek_v*_contract.py); and a real
``transformers serve`` of the Kimi demo target counts as many prompt tokens as the row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _families import family_tokenizer, has_template

from regen.targets import FAMILIES
from regen.template.render import Renderer
from regen.template.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[2]


def history(markup: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {"role": "assistant", "content": f"Let me check. {markup} done"},
        {"role": "user", "content": "And tomorrow?"},
    ]


@pytest.mark.parametrize(
    "name", sorted(n for n, f in FAMILIES.items() if has_template(f) and not f.encodes_prompts)
)
def test_markup_in_a_reply_is_encoded_as_the_tokenizer_encodes_it_when_serving(
    name: str, tmp_path: Path
) -> None:
    family = FAMILIES[name]
    tok = load_tokenizer(family_tokenizer(family, tmp_path))
    renderer = Renderer(tok, family.template_kwargs(True), family)
    # GPT-OSS's own template refuses a message holding its channel tags (it raises)
    markers = [m for m in (*family.call_markers, *(family.think or ()), family.end_of_turn)
               if "<|channel|>" not in m]  # fmt: skip
    messages = history("".join(markers))
    served = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                     return_dict=True, **renderer.template_kwargs)  # fmt: skip
    text = renderer.render_prompt(messages)
    ids = renderer.encode(text)
    assert ids == list(served["input_ids"])
    # the markers the template kept are single ids, not their characters
    vocab = tok.get_vocab()
    kept = [m for m in markers if m in vocab and m in text]
    assert all(vocab[m] in ids for m in kept), kept


@pytest.mark.server
def test_transformers_serve_counts_the_rows_prompt_tokens_with_markup_in_history(
    demo_server,
) -> None:
    import httpx2

    renderer = Renderer.from_dir(REPO / "manifests" / "demo" / "tokenizer",
                                 template_kwargs={"thinking": True})  # fmt: skip
    call = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            '<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|>'
            "<|tool_calls_section_end|>")  # fmt: skip
    cases = [history(call), history("functions.</think><|tool_call_begin|>x"), history("")]
    srv = demo_server
    for messages in cases:
        body = {"model": srv.model_name, "messages": messages, "max_tokens": 1,
                "chat_template_kwargs": {"thinking": True}}  # fmt: skip
        usage = httpx2.post(f"{srv.url}/chat/completions", json=body, timeout=120).json()
        ours = renderer.encode(renderer.render_prompt(messages))
        assert usage["usage"]["prompt_tokens"] == len(ours), messages[1]["content"]
