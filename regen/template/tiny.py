"""A tiny Kimi-format tokenizer for tests and the offline demo.

``build_tiny_tokenizer(out_dir)`` writes a transformers tokenizer directory::

    out_dir/
      tokenizer.json          byte-level BPE (HF ``tokenizers``), VOCAB_SIZE ids in all:
                              ids 0..BASE_VOCAB-1 learned from a built-in corpus, then the Kimi
                              special tokens of CONTRACTS §1 in Kimi id order (like Kimi, the
                              special tokens sit at the top of the vocab)
      tokenizer_config.json   tokenizer_class, bos/eos/pad tokens, ``chat_template`` (K2.5 flavour)

It loads with ``AutoTokenizer.from_pretrained(out_dir)`` without ``trust_remote_code``. Special
token text inside ordinary strings encodes as the special token, as in Kimi's tokenizer.
``eos_token`` is ``<|im_end|>`` (the end of a turn, where chat generation stops); ``[EOS]`` is
kept as a plain special token. Nothing is added around encoded text (no BOS post-processor).

The build is deterministic: rebuilding reproduces the committed copy under
``manifests/demo/tokenizer/`` byte for byte (checked by tests/template/test_tiny.py). The corpus
is generated from fixed word lists below (written for this project).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from regen.template.chat_template import KIMI_K25_TEMPLATE

#: Kimi special tokens (CONTRACTS §1) in Kimi id order, with their ids in the real tokenizer
KIMI_SPECIAL_TOKENS: tuple[tuple[str, int], ...] = (
    ("[BOS]", 163584),
    ("[EOS]", 163585),
    ("<|im_end|>", 163586),
    ("<|im_user|>", 163587),
    ("<|im_assistant|>", 163588),
    ("<|im_system|>", 163594),
    ("<|tool_calls_section_begin|>", 163595),
    ("<|tool_calls_section_end|>", 163596),
    ("<|tool_call_begin|>", 163597),
    ("<|tool_call_argument_begin|>", 163598),
    ("<|tool_call_end|>", 163599),
    ("<|im_middle|>", 163601),
    ("<think>", 163606),
    ("</think>", 163607),
    ("[PAD]", 163839),
)
SPECIAL_TOKENS: tuple[str, ...] = tuple(t for t, _ in KIMI_SPECIAL_TOKENS)
#: total vocabulary size of the tiny tokenizer (the embedding size of a model built on it)
VOCAB_SIZE = 1024
#: ids learned by BPE (256 byte symbols + merges); the special tokens follow
BASE_VOCAB = VOCAB_SIZE - len(SPECIAL_TOKENS)
#: where the committed copy lives, relative to the repository root
COMMITTED_DIR = Path("manifests/demo/tokenizer")


@dataclass(slots=True, frozen=True)
class TinyTokenizerInfo:
    """What a model built on the tiny tokenizer needs to know."""

    path: str
    vocab_size: int
    bos_id: int
    eos_id: int  #: ``<|im_end|>``: where a chat turn stops
    pad_id: int
    special_ids: dict[str, int]


_WORD_TEXT = """
the a an and or but if then else when while for with without into onto from to of in on at by
is are was were be been being have has had do does did can could will would shall should may might
must not no yes this that these those there here where what which who whom whose why how
i you he she it we they me him her us them my your his its our their mine yours
one two three four five six seven eight nine ten hundred thousand million first second last next
time day week month year hour minute second today tomorrow yesterday morning evening night
people person man woman child friend family team user assistant system tool model server client
water food house city country world river mountain road school book paper letter word sentence
answer question problem solution reason result example number value list string integer float
function method class object module package file folder path line column row table record field
data dataset sample token tokens vocabulary template message messages content reasoning thinking
train training draft target speculative decoding layer hidden state states weight weights loss
mask input output prompt response request endpoint retry error timeout shard part export import
write read open close start stop run runs running ran build built test tests check checks
make makes made take takes took give gives gave find finds found think thinks thought know knew
say says said see sees saw come comes came go goes went get gets got use uses used work works
good bad new old big small long short high low great little right left early late easy hard
quick slow simple clear exact true false none null empty full same different other another
please thanks hello goodbye sorry sure okay maybe because therefore however although since until
calculate compute return print define call calls called weather temperature celsius location
search query results price total count sum average minimum maximum sort order filter map reduce
python rust javascript json yaml parquet arrow ray kimi moonshot eagle specforge sglang
"""

_CODE = """
def main():
    return 0

for i in range(10):
    print(i * i)

class Point:
    def __init__(self, x: int, y: int) -> None:
        self.x = x
        self.y = y

if x > 0 and y < 10:
    result = {"name": "value", "count": 3, "items": [1, 2, 3]}

fn add(a: i32, b: i32) -> i32 { a + b }
const total = items.reduce((a, b) => a + b, 0);
SELECT id, name FROM users WHERE age >= 18 ORDER BY name;
{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
 "properties": {"location": {"type": "string"}}, "required": ["location"]}}}
## Return of functions.get_weather:0
"""


def tiny_corpus() -> list[str]:
    """The deterministic training corpus: word-list sentences, numbers, code, chat words."""
    lines: list[str] = []
    words_list = _WORD_TEXT.split()
    n = len(words_list)
    state = 12345
    for _ in range(1500):
        words = []
        for _ in range(12):
            state = (state * 1103515245 + 12345) % (2**31)
            words.append(words_list[state % n])
        sentence = " ".join(words)
        lines.append(sentence[0].upper() + sentence[1:] + ".")
    lines.extend(f"{i} + {i * 7 % 100} = {i + i * 7 % 100}" for i in range(200))
    lines.extend(_CODE.splitlines() * 20)
    lines.extend(["user", "assistant", "system", "tool", "tool_declare", "You are Kimi"] * 50)
    return lines


def build_tiny_tokenizer(out_dir: str | os.PathLike[str]) -> TinyTokenizerInfo:
    """Train and write the tiny tokenizer directory; same bytes on every call."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BASE_VOCAB,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(tiny_corpus(), trainer=trainer)
    if tok.get_vocab_size() != BASE_VOCAB:
        raise RuntimeError(f"tiny corpus gave {tok.get_vocab_size()} ids, wanted {BASE_VOCAB}")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(json.loads(tok.to_str()), ensure_ascii=False, indent=1, sort_keys=True)
    (out / "tokenizer.json").write_text(text + "\n", encoding="utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "[BOS]",
        "eos_token": "<|im_end|>",
        "pad_token": "[PAD]",
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "chat_template": KIMI_K25_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, ensure_ascii=False, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return tiny_info(out)


def tiny_info(path: str | os.PathLike[str]) -> TinyTokenizerInfo:
    """Ids of a tiny tokenizer directory (read from its tokenizer.json)."""
    data = json.loads((Path(path) / "tokenizer.json").read_text(encoding="utf-8"))
    special = {t["content"]: t["id"] for t in data["added_tokens"]}
    return TinyTokenizerInfo(
        path=str(path),
        vocab_size=len(data["model"]["vocab"])
        + len([t for t in data["added_tokens"] if t["content"] not in data["model"]["vocab"]]),
        bos_id=special["[BOS]"],
        eos_id=special["<|im_end|>"],
        pad_id=special["[PAD]"],
        special_ids=special,
    )


if __name__ == "__main__":  # python -m regen.template.tiny [OUT_DIR]
    import sys

    build_tiny_tokenizer(sys.argv[1] if len(sys.argv) > 1 else COMMITTED_DIR)
