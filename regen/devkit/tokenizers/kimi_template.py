"""The Kimi-format chat template of the tiny demo/test tokenizer (K2.5 flavour).

Written from the facts in ../shared/CONTRACTS.md §1; it is the template that
``regen.devkit.tokenizers.tiny`` stores in ``tokenizer_config.json``. Production renders with the
target tokenizer's own template: nothing in regen reads this string except the tiny builder.

What it renders (no newline between turns; every message is
``<|im_X|>{name or role}<|im_middle|>{body}<|im_end|>``):

- tool declarations first: ``<|im_system|>tool_declare<|im_middle|>{tools as JSON}<|im_end|>``;
- a default system turn when the first message is not a system message;
- user -> ``<|im_user|>``, assistant -> ``<|im_assistant|>``, anything else -> ``<|im_system|>``;
- assistant body ``<think>{reasoning}</think>{content}`` + the tool-call section; every assistant
  turn up to and including the last assistant turn WITHOUT tool calls is history and gets an
  empty ``<think></think>`` (the trap); later assistant turns keep their reasoning;
- a tool result body is ``## Return of {tool_call_id}\\n{content}``;
- generation prompt ``<|im_assistant|>assistant<|im_middle|>`` then ``<think>`` (thinking, the
  default) or ``<think></think>`` (``thinking=False``).
"""

from __future__ import annotations

DEFAULT_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."

KIMI_K25_TEMPLATE = (
    """{%- macro body(c) -%}
{%- if c is string -%}{{ c }}
{%- elif c is none -%}
{%- else -%}{%- for part in c -%}
{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_plain=-1) -%}
{%- for m in messages -%}
{%- if m.role == 'assistant' and not m.tool_calls -%}
{%- set ns.last_plain = loop.index0 -%}
{%- endif -%}
{%- endfor -%}
{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>{%- endif -%}
{%- if not messages or messages[0].role != 'system' -%}<|im_system|>system<|im_middle|>"""
    + DEFAULT_SYSTEM
    + """<|im_end|>{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'user' -%}<|im_user|>
{%- elif m.role == 'assistant' -%}<|im_assistant|>
{%- else -%}<|im_system|>
{%- endif -%}
{{- m.name or m.role -}}<|im_middle|>
{%- if m.role == 'assistant' -%}
<think>{%- if loop.index0 > ns.last_plain -%}{{- m.reasoning_content or '' -}}{%- endif -%}</think>
{{- body(m.content) -}}
{%- if m.tool_calls -%}<|tool_calls_section_begin|>
{%- for tc in m.tool_calls -%}
{%- set f = tc.function -%}
<|tool_call_begin|>
{{- tc.id or ('functions.' ~ f.name ~ ':' ~ loop.index0) -}}
<|tool_call_argument_begin|>
{%- if f.arguments is string -%}{{- f.arguments -}}
{%- else -%}{{- f.arguments | tojson -}}
{%- endif -%}
<|tool_call_end|>
{%- endfor -%}
<|tool_calls_section_end|>
{%- endif -%}
{%- elif m.role == 'tool' -%}## Return of {{ m.tool_call_id }}
{{ body(m.content) }}
{%- else -%}{{- body(m.content) -}}
{%- endif -%}
<|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>
{%- if thinking is defined and not thinking -%}<think></think>{%- else -%}<think>{%- endif -%}
{%- endif -%}"""
)
