"""Run vLLM's own reasoning and tool-call parsers over model outputs, offline: executed by the
vLLM environment's Python (``.venv-vllm``), never imported by the tests.

Reads one JSON object on stdin: ``special`` (the tokens of a tiny WordLevel tokenizer the
parsers look up; ``added``, optional: its added tokens that are not special), ``tools``
(OpenAI tool specs) and ``cases`` (each ``text``, ``reasoning`` and ``tool`` parser names or
null, ``kwargs``: the parsers' ``chat_template_kwargs``). Writes
one JSON list on stdout: per case ``reasoning``, ``content`` and ``calls`` (name, arguments),
or ``error``. The order is the server's: the reasoning parser first, the tool parser on what
it left as content.
``handle(job)`` gives that list: the tests run it in the vLLM environment's long-lived
worker (``tests/_vllm_call.py``); run as a script, it reads stdin and writes stdout.

A case with ``harmony: true`` (GPT-OSS) goes instead where vLLM sends a gpt_oss model's output:
``vllm.parser.harmony.HarmonyParser`` (the ``openai`` tool parser and ``openai_gptoss``
reasoning parser are stubs it holds), fed the ids openai_harmony's own o200k_harmony encoding
gives the text; its result also holds those ``ids``.

A case with ``composed: true`` goes through the parser vLLM's chat serving composes from the two
names (``vllm.parser.parser_manager.ParserManager.get_parser``), built and called as
``chat_completion/serving.py`` does: ``cls(tokenizer, tools, chat_template_kwargs=…)``,
``adjust_request``, then ``parse(text, request, enable_auto_tools=True, ...)`` (for the engine
parsers, e.g. ``gemma4`` and ``mistral``: the reasoning adapter, then the tool adapter on its
content, with the serving layer's handling of content around calls).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager


def tokenizer(special: list[str], added: list[str] | None = None) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer whose vocabulary holds the family's special tokens (and its
    ``added`` tokens that are not special, e.g. MiniMax-M3's ``]<]minimax[>[``)."""
    vocab = {"[UNK]": 0, **{t: i + 1 for i, t in enumerate(special)}}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="[UNK]", additional_special_tokens=special
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added or ()])
    return tok


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


def parse_composed(tok: Any, tools: list, case: dict) -> dict:
    """One case through the parser the chat serving composes from the two parser names."""
    from vllm.parser.parser_manager import ParserManager

    kwargs = case.get("kwargs") or {}
    req = ChatCompletionRequest(
        model="x", messages=[{"role": "user", "content": "hi"}], tools=tools or None,
        chat_template_kwargs=kwargs or None,
    )  # fmt: skip
    cls = ParserManager.get_parser(
        tool_parser_name=case.get("tool"), reasoning_parser_name=case.get("reasoning"),
        enable_auto_tools=True, tokenizer=tok,
    )  # fmt: skip
    parser = cls(tok, req.tools, chat_template_kwargs=kwargs, model_config=None)
    req = parser.adjust_request(req)
    ids = tok.encode(case["text"], add_special_tokens=False)
    reasoning, content, calls = parser.parse(
        case["text"], req, enable_auto_tools=True, model_output_token_ids=ids
    )
    return {
        "reasoning": reasoning,
        "content": content,
        "calls": [[c.name, c.arguments] for c in calls or ()],
        "skip_special_tokens": req.skip_special_tokens,
    }


class HarmonyTokens:
    """What HarmonyParser asks of a tokenizer: ``decode`` (its recovery of a message cut short)
    over openai_harmony's encoding, and ``get_vocab``."""

    def __init__(self, encoding: Any) -> None:
        self.encoding = encoding

    def decode(self, ids: list[int], **_: Any) -> str:
        return self.encoding.decode_utf8(ids)

    def get_vocab(self) -> dict[str, int]:
        return {}


def parse_harmony(tools: list, case: dict) -> dict:
    """One GPT-OSS case through the parser vLLM's chat serving builds for a gpt_oss model."""
    from vllm.entrypoints.openai.parser.harmony_utils import get_encoding
    from vllm.parser.parser_manager import ParserManager

    encoding = get_encoding()
    req = ChatCompletionRequest(
        model="x", messages=[{"role": "user", "content": "hi"}], tools=tools or None
    )
    cls = ParserManager.get_parser(
        tool_parser_name=case.get("tool"), reasoning_parser_name=case.get("reasoning"),
        enable_auto_tools=True, is_harmony=True,
    )  # fmt: skip
    parser = cls(HarmonyTokens(encoding), req.tools, chat_template_kwargs=case.get("kwargs") or {})
    ids = encoding.encode(case["text"], allowed_special="all")
    try:
        reasoning, content, calls = parser.parse(
            case["text"], req, enable_auto_tools=True, model_output_token_ids=ids
        )
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "ids": ids}
    return {
        "reasoning": reasoning,
        "content": content,
        "calls": [[c.name, c.arguments] for c in calls or ()],
        "ids": ids,
    }


def handle(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The results of a job (the JSON object described above)."""
    tok = tokenizer(job["special"], job.get("added"))
    out = []
    for case in job["cases"]:
        try:
            if case.get("harmony"):
                out.append(parse_harmony(job["tools"], case))
            elif case.get("composed"):
                out.append(parse_composed(tok, job["tools"], case))
            else:
                out.append(parse(tok, job["tools"], case))
        except Exception as exc:
            out.append({"error": f"{type(exc).__name__}: {exc}"})
    return out


def main() -> None:
    json.dump(handle(json.load(sys.stdin)), sys.stdout)


if __name__ == "__main__":
    main()
