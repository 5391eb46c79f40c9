"""Ember: an invented chat format no family module of regen describes, whose tiny tokenizer ships
a ``response_template`` (regen.targets.response_template reads it).

The test target of "any checkpoint that describes its own format": its demo target is served by
vLLM with ``--tool-call-parser hf --reasoning-parser hf`` (vLLM parses its answers with the
template below), and regen knows it only through that template. Written for regen's tests; the
tiny builder (``regen.devkit.tokenizers.tiny``, family ``response_template``) stores both in
``tokenizer_config.json`` (committed at ``manifests/demo-ember/tokenizer/``).

The format (no newline between turns):

- ``<|system|>{text}<|end|>``, ``<|user|>{text}<|end|>``, ``<|tool|>{result}<|end|>``; tools,
  when declared, first: ``<|system|>Tools:`` and one JSON line per tool, ``<|end|>``;
- an answer ``<|assistant|><reason>{reasoning}</reason>{content}`` + per call
  ``<call name="{name}">{arguments as JSON}</call>`` + ``<|end|>``; reasoning is kept only on
  the turns after the last user message;
- the generation prompt ``<|assistant|><reason>`` (``enable_thinking``, the default) or
  ``<|assistant|><reason></reason>`` (off).
"""

from __future__ import annotations

from typing import Any

#: the format's special tokens, in id order (all special)
EMBER_TOKENS: tuple[str, ...] = (
    "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>", "<reason>",
    "</reason>",
)  # fmt: skip

EMBER_TEMPLATE = (
    """{%- set think = enable_thinking if enable_thinking is defined else true -%}
{%- if tools -%}<|system|>Tools:{% for t in tools %}
{{ t | tojson }}{% endfor %}<|end|>
{%- endif -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}"""
    """{%- endif -%}{%- endfor -%}
{%- for m in messages -%}
{%- if m.role == 'system' -%}<|system|>{{ m.content }}<|end|>
{%- elif m.role == 'user' -%}<|user|>{{ m.content }}<|end|>
{%- elif m.role == 'tool' -%}<|tool|>{{ m.content }}<|end|>
{%- elif m.role == 'assistant' -%}<|assistant|>
{%- if loop.index0 > ns.last_user and m.reasoning_content -%}"""
    """<reason>{{ m.reasoning_content }}</reason>{%- endif -%}
{{- m.content or '' -}}
{%- for c in m.tool_calls or [] -%}<call name="{{ c.function.name }}">
{%- if c.function.arguments is string -%}{{ c.function.arguments }}
{%- else -%}{{ c.function.arguments | tojson }}{%- endif -%}</call>
{%- endfor -%}<|end|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|assistant|>
{%- if think -%}<reason>{%- else -%}<reason></reason>{%- endif -%}
{%- endif -%}"""
)

#: how its answers are written (transformers / vLLM ``hf`` / SGLang ``response_template``)
EMBER_RESPONSE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|assistant|>",
    "fields": {
        "thinking": {"open": "<reason>", "close": "</reason>", "content": "text"},
        "tool_calls": {
            "open_pattern": r'<call name="(?P<name>[^"]+)">',
            "close": "</call>",
            "repeats": True,
            "content": "text",  # the arguments as written: a malformed one is the data's flag
            "transform": {
                "type": "function",
                "function": {"name": "{name}", "arguments": "{content}"},
            },
        },
        "content": {"close": "<|end|>", "content": "text"},
    },
}
