"""The demo's pre-tokenized Kimi rows: ``manifests/demo/kimi_native.jsonl``.

One JSON object per line, compact separators: ``{"id": str, "input_ids": [int],
"loss_mask": [int]}``. Valid rows are rendered with the tiny tokenizer's chat template (prompt,
mask 0) followed by an assistant answer (mask 1). A few rows are invalid on purpose, one per
reason code of ``regen.sources.native.validate_native`` (and one exact duplicate line), so the
kimi_native adapter and the validator have something to reject. Rebuild with
``python -m regen.devkit.tokenizers.demo_native`` (reproducible byte for byte).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from regen.devkit.tokenizers.tiny import COMMITTED_DIR, VOCAB_SIZE

DEMO_NATIVE_PATH = Path("manifests/demo/kimi_native.jsonl")

_VALID: tuple[tuple[str, list[dict[str, Any]], str, bool], ...] = (
    # (id, prompt messages, assistant answer as produced after the generation prompt, thinking)
    (
        "native-0001",
        [{"role": "user", "content": "What is two plus two?"}],
        "Add the numbers.</think>Two plus two is four.<|im_end|>",
        True,
    ),
    (
        "native-0002",
        [
            {"role": "system", "content": "You answer in one short sentence."},
            {"role": "user", "content": "Name a river."},
            {"role": "assistant", "content": "The Nile.", "reasoning_content": "Any river."},
            {"role": "user", "content": "And a mountain?"},
        ],
        "A mountain then.</think>Mount Everest.<|im_end|>",
        True,
    ),
    (
        "native-0003",
        [{"role": "user", "content": "What is the weather in Paris?"}],
        "I should call the tool.</think><|tool_calls_section_begin|><|tool_call_begin|>"
        'functions.get_weather:0<|tool_call_argument_begin|>{"location": "Paris"}'
        "<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
        True,
    ),
    (
        "native-0004",
        [{"role": "user", "content": "Say hello."}],
        "Hello!<|im_end|>",
        False,
    ),
)


def demo_native_rows(tokenizer_dir: str | os.PathLike[str] = COMMITTED_DIR) -> list[dict]:
    """The demo rows, valid ones first, then one invalid row per reason, then a duplicate."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    rows: list[dict[str, Any]] = []
    for rid, messages, answer, thinking in _VALID:
        prompt = tok.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, thinking=thinking
        )
        p_ids = tok.encode(prompt, add_special_tokens=False)
        a_ids = tok.encode(answer, add_special_tokens=False)
        rows.append(
            {
                "id": rid,
                "input_ids": p_ids + a_ids,
                "loss_mask": [0] * len(p_ids) + [1] * len(a_ids),
            }
        )
    base = rows[0]
    ids, mask = base["input_ids"], base["loss_mask"]
    plain = tok.encode("Just some text without any chat turn tokens.", add_special_tokens=False)
    rows += [
        {"id": "native-0005", "input_ids": ids, "loss_mask": mask[:-1]},  # unequal lengths
        {"id": "native-0006", "input_ids": ids, "loss_mask": [*mask[:-1], 2]},  # mask value 2
        {"id": "native-0007", "input_ids": [*ids[:-1], VOCAB_SIZE + 5], "loss_mask": mask},
        {"id": "native-0008", "input_ids": plain, "loss_mask": [0] * 3 + [1] * (len(plain) - 3)},
        {"id": "native-0009", "input_ids": ids, "loss_mask": [0] * len(ids)},  # nothing to learn
        dict(base),  # exact duplicate of native-0001
    ]
    return rows


def write_demo_native(
    path: str | os.PathLike[str] = DEMO_NATIVE_PATH,
    tokenizer_dir: str | os.PathLike[str] = COMMITTED_DIR,
) -> None:
    lines = [json.dumps(r, separators=(",", ":")) for r in demo_native_rows(tokenizer_dir)]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":  # python -m regen.devkit.tokenizers.demo_native [OUT] [TOKENIZER_DIR]
    import sys

    write_demo_native(*(sys.argv[1:3] or [str(DEMO_NATIVE_PATH)]))
