"""Llama 3.1 / 3.2 / 3.3 Instruct (Meta): JSON tool calls, no reasoning.

Owns no files. The format (the Llama 3.1 chat template; SGLang 0.5.23
``function_call/llama32_detector.py``; vLLM 0.32 ``tool_parsers/llama_tool_parser.py``):

- a message ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{body}<|eot_id|>``; the
  generation prompt ``<|start_header_id|>assistant<|end_header_id|>\\n\\n``;
- a call is the whole answer: ``{"name": NAME, "parameters": ARGS}`` (the template writes one
  call per turn; several are joined by ``; ``, the separator SGLang splits on);
- ``<|eot_id|>`` ends a turn, ``<|eom_id|>`` one that called a built-in (ipython) tool;
- no reasoning, no thinking switch; SGLang's Llama loader adds 1 to every aux id.

The engines part ways on prose around a call: SGLang finds calls only in an answer that starts
with ``{`` (or ``<|python_tag|>``), vLLM finds them anywhere and drops the prose.
"""

from __future__ import annotations

from collections.abc import Sequence

from regen.core.sample import ToolCall
from regen.targets.family import Family, Parsers

BOT = "<|begin_of_text|>"
EOT = "<|eot_id|>"
EOM = "<|eom_id|>"
HEADER_START = "<|start_header_id|>"
HEADER_END = "<|end_header_id|>"
PYTHON_TAG = "<|python_tag|>"

#: Llama 3 tokenizer ids (vocab 128256)
PUBLISHED_IDS: dict[str, int] = {
    BOT: 128000,
    "<|end_of_text|>": 128001,
    HEADER_START: 128006,
    HEADER_END: 128007,
    EOM: 128008,
    EOT: 128009,
    PYTHON_TAG: 128010,
}
VOCAB_SIZE = 128256
SPECIAL_TOKENS = (BOT, HEADER_START, HEADER_END, EOT, EOM, PYTHON_TAG)
#: what joins several calls in one answer
CALL_SEPARATOR = "; "


class LlamaFamily(Family):
    """Llama 3's JSON calls (module docstring)."""

    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        return CALL_SEPARATOR.join(
            f'{{"name": "{c.name}", "parameters": {c.arguments}}}' for c in calls
        )


LLAMA3 = LlamaFamily(
    name="llama3",
    title="Llama 3.1 / 3.2 / 3.3",
    end_of_turn=EOT,
    special_tokens=SPECIAL_TOKENS,
    turn_open_tokens=(HEADER_START,),
    call_markers=(PYTHON_TAG, '{"name"'),
    sglang=Parsers(tool="llama3", reasoning=None),
    vllm=Parsers(tool="llama3_json", reasoning=None),
    aux_shift="always",
    think=None,
    other_ends=(EOM, "<|end_of_text|>"),
    published_ids=PUBLISHED_IDS,
    published_vocab=VOCAB_SIZE,
    model_types=("llama",),
)
