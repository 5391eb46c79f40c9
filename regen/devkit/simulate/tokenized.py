"""Real token ids for simulated answers, from a tokenizer directory (``--tokenizer DIR``).

The prompt is rendered by the directory's own chat template (``add_generation_prompt``, the
request's ``tools`` and ``chat_template_kwargs``), from the messages and tools as the simulated
engine prepares them (:mod:`regen.template.prepare`: history tool-call arguments as objects,
...), and encoded without adding special tokens.
The output ids encode what the model would have generated after that prompt: if the rendered
prompt already ends with ``<think></think>`` only the content; if it ends with ``<think>`` the
reasoning, ``</think>`` and the content; otherwise ``<think>reasoning</think>content`` (thinking
on) or the content (off); then the Kimi tool-call section when the answer calls tools; then
``<|im_end|>`` (or the tokenizer's EOS when it has no ``<|im_end|>``). Owns no files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.core.errors import TemplateError
from regen.devkit.simulate.answer import SimAnswer
from regen.template.prepare import ContentFormat, loops_over_content, preparation
from regen.template.tokenizer import load_tokenizer


@dataclass(slots=True, frozen=True)
class TokenIds:
    prompt: list[int]
    output: list[int]
    reasoning_tokens: int


class AnswerTokenizer:
    """Renders requests and answers into the token ids of one tokenizer directory."""

    def __init__(
        self, path: Path, tokenizer_class: str | None = None, engine: str | None = None
    ) -> None:
        #: how the simulated engine hands the template a request (regen.template.prepare)
        self.prep = preparation(engine)
        try:
            self.tok = load_tokenizer(path, trust_remote_code=True, spec=tokenizer_class)
        except Exception as e:  # transformers raises many types for a bad dir
            raise TemplateError(f"cannot load tokenizer from {path}: {e}") from e
        vocab = self.tok.get_vocab()
        self.end_text = "<|im_end|>" if "<|im_end|>" in vocab else (self.tok.eos_token or "")

    def render_prompt(self, request: Mapping[str, Any]) -> str:
        kwargs = dict(request.get("chat_template_kwargs") or {})
        template = self.tok.chat_template if isinstance(self.tok.chat_template, str) else ""
        content: ContentFormat = "openai" if template and loops_over_content(template) else "string"
        try:
            text = self.tok.apply_chat_template(
                self.prep.messages(list(request.get("messages") or ()), content),  # type: ignore[arg-type]  # transformers: a message is dict[str, str] (no tool calls)
                tools=self.prep.tools(request.get("tools") or None),  # type: ignore[arg-type]  # transformers: list[dict | Callable] (invariant)
                add_generation_prompt=True,
                tokenize=False,
                **kwargs,
            )
        except Exception as e:
            raise TemplateError(f"chat template failed: {e}") from e
        if not isinstance(text, str):
            raise TemplateError(f"chat template returned {type(text).__name__}, not text")
        return text

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def output_text(self, prompt: str, ans: SimAnswer, thinking: bool) -> str:
        # an answer cut inside its reasoning (nothing after it) never wrote </think>
        cut_in_reasoning = ans.finish_reason == "length" and not ans.content and not ans.tool_tokens
        close = "" if cut_in_reasoning else "</think>"
        if prompt.endswith("<think></think>"):
            out = ans.content
        elif prompt.endswith("<think>"):
            out = f"{ans.reasoning}{close}{ans.content}"
        elif thinking:
            out = f"<think>{ans.reasoning}{close}{ans.content}"
        else:
            out = ans.content
        if ans.tool_calls:
            calls = "".join(
                f"<|tool_call_begin|>{c.id}<|tool_call_argument_begin|>{c.arguments}"
                "<|tool_call_end|>"
                for c in ans.tool_calls
            )
            out += f"<|tool_calls_section_begin|>{calls}<|tool_calls_section_end|>"
        if ans.finish_reason != "length":
            out += self.end_text
        return out

    def token_ids(
        self, prompt: str, prompt_ids: list[int], ans: SimAnswer, thinking: bool
    ) -> TokenIds:
        """The ids of ``ans`` generated after ``prompt`` (already encoded as ``prompt_ids``)."""
        return TokenIds(
            prompt=prompt_ids,
            output=self.encode(self.output_text(prompt, ans, thinking)),
            reasoning_tokens=len(self.encode(ans.reasoning)) if ans.reasoning else 0,
        )
