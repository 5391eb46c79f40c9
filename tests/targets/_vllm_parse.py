"""Run vLLM's own reasoning and tool-call parsers over model outputs, offline: executed by the
vLLM environment's Python (``.venv-vllm``), never imported by the tests.

Reads one JSON object on stdin: ``special`` (the tokens of a tiny WordLevel tokenizer the
parsers look up), ``tools`` (OpenAI tool specs) and ``cases`` (each ``text``, ``reasoning``
and ``tool`` parser names or null, ``kwargs``: the parsers' ``chat_template_kwargs``). Writes
one JSON list on stdout: per case ``reasoning``, ``content`` and ``calls`` (name, arguments),
or ``error``. The order is the server's: the reasoning parser first, the tool parser on what
it left as content.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager


def tokenizer(special: list[str]) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer whose vocabulary holds the family's special tokens."""
    vocab = {"[UNK]": 0, **{t: i + 1 for i, t in enumerate(special)}}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="[UNK]", additional_special_tokens=special
    )


def parse(tok: Any, tools: list, case: dict) -> dict:
    """One case through the reasoning parser, then the tool parser."""
    req = ChatCompletionRequest(
        model="x", messages=[{"role": "user", "content": "hi"}], tools=tools or None
    )
    kwargs = case.get("kwargs") or {}
    reasoning, content = None, case["text"]
    if case.get("reasoning"):
        cls = ReasoningParserManager.get_reasoning_parser(case["reasoning"])
        reasoning, content = cls(tok, chat_template_kwargs=kwargs).extract_reasoning(
            case["text"], req
        )
    calls: list[list[str]] = []
    if case.get("tool") and content:
        cls = ToolParserManager.get_tool_parser(case["tool"])
        parser = cls(tok, req.tools)
        info = parser.extract_tool_calls(content, req)
        if info.tools_called:
            calls = [[c.function.name, c.function.arguments] for c in info.tool_calls]
        content = info.content
    return {"reasoning": reasoning, "content": content, "calls": calls}


def main() -> None:
    job = json.load(sys.stdin)
    tok = tokenizer(job["special"])
    out = []
    for case in job["cases"]:
        try:
            out.append(parse(tok, job["tools"], case))
        except Exception as exc:
            out.append({"error": f"{type(exc).__name__}: {exc}"})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
