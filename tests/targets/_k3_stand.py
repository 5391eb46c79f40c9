"""A stand-in for Kimi K3's tokenizer in the engines' prompt paths: imported by
``_vllm_k3_render.py`` (the vLLM environment) and by test_kimi_k3_contract.py (SGLang, in
process); it imports neither engine.

K3's checkpoint renders prompts in Python (``tokenization_kimi.py``'s
``TikTokenTokenizer.apply_chat_template`` over ``encoding_k3.py``); neither is available here
(remote code, tiktoken). This stands in with the signature and defaults of that method (``tokenize``
False and ``add_generation_prompt`` True by default, ``thinking`` on unless given,
``thinking_effort`` ``max`` unless given, ``chat_template`` ignored) and renders with llama.cpp's
Jinja port of the encoder (regen/devkit/tokenizers/templates/kimi_k3.jinja) through transformers'
``apply_chat_template``: the text the engine's call would tokenize, segment by segment.
"""

from __future__ import annotations

from typing import Any


class K3Tokenizer:
    """``apply_chat_template`` as K3's tokenizer takes it; ``rendered``: the last prompt text
    (asked to tokenize, it returns one id in place of the ids), ``calls``: the kwargs each call
    was given."""

    def __init__(self, hf: Any, template: str) -> None:
        self.hf = hf
        self.template = template
        self.rendered: str | None = None
        self.calls: list[dict[str, Any]] = []

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        thinking: bool = True,
        padding: bool = False,
        truncation: bool = False,
        max_length: int | None = None,
        return_tensors: Any = None,
        return_dict: bool = False,
        **kwargs: Any,
    ) -> Any:
        kwargs.pop("chat_template", None)
        kwargs.setdefault("thinking_effort", "max")
        self.calls.append({"tools": tools, "thinking": thinking, **kwargs})
        self.rendered = self.hf.apply_chat_template(
            conversation, tools=tools, chat_template=self.template, tokenize=False,
            add_generation_prompt=add_generation_prompt, thinking=thinking, **kwargs,
        )  # fmt: skip
        return [0] if tokenize else self.rendered
