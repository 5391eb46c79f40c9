"""Tiny tokenizers of the model families (Kimi, Qwen3, DeepSeek-V3) for tests and the demos.

``build_tiny_tokenizer(out_dir, family="kimi")`` writes a transformers tokenizer directory::

    out_dir/
      tokenizer.json          byte-level BPE (HF ``tokenizers``), VOCAB_SIZE ids in all:
                              ids learned from a built-in corpus, then the family's special
                              tokens in the order of their ids in the real tokenizer (the
                              special tokens sit at the top of the vocab)
      tokenizer_config.json   tokenizer_class, bos/eos/pad tokens, ``chat_template``

Per family (:data:`TINY_FAMILIES`):

- ``kimi``: the Kimi special tokens of CONTRACTS §1, all special, and regen's Kimi template
  (K2.5 flavour, :mod:`regen.devkit.tokenizers.kimi_template`); committed at
  ``manifests/demo/tokenizer/``;
- ``qwen3``: Qwen3's chat and tool tokens (``<|im_start|>``, ``<|im_end|>``, ``<tool_call>``,
  ``<think>``, ...; special as in the real tokenizer: only ``<|endoftext|>``/``<|im_start|>``/
  ``<|im_end|>``), no bos, and the real Qwen3 template (``templates/qwen3.jinja``); committed at
  ``manifests/demo-qwen3/tokenizer/``;
- ``deepseek_v3``: DeepSeek-V3.1's tokens (``<｜User｜>``, ``<｜tool▁calls▁begin｜>``,
  ``<think>``, ...) and the real V3.1 template (``templates/deepseek_v3.jinja``); committed at
  ``manifests/demo-deepseek/tokenizer/``.

The templates under ``templates/`` are data copied from upstream (their README names the source
repository, path and commit). Each loads with ``AutoTokenizer.from_pretrained(out_dir)`` without
``trust_remote_code``. Special token text inside ordinary strings encodes as the special token.
``eos_token`` is the family's end of turn (``<|im_end|>``, ``<｜end▁of▁sentence｜>``).
Nothing is added around encoded text (no BOS post-processor).

The build is deterministic: rebuilding reproduces the committed copies byte for byte (checked
by tests/devkit/tokenizers/test_tiny.py). The corpus is generated from fixed word lists below
(written for this project). ``python -m regen.devkit.tokenizers.tiny [FAMILY [OUT_DIR]]`` rebuilds
one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

from regen.devkit.tokenizers.ember import EMBER_RESPONSE, EMBER_TEMPLATE, EMBER_TOKENS
from regen.devkit.tokenizers.kimi_template import KIMI_K25_TEMPLATE

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
#: total vocabulary size of a tiny tokenizer (the embedding size of a model built on it)
VOCAB_SIZE = 1024
#: ids learned by BPE for Kimi (256 byte symbols + merges); the special tokens follow
BASE_VOCAB = VOCAB_SIZE - len(SPECIAL_TOKENS)
#: where the committed Kimi copy lives, relative to the repository root
COMMITTED_DIR = Path("manifests/demo/tokenizer")
#: the vendored real chat templates (data; templates/README.md names their sources)
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"

#: Qwen3's chat and tool tokens in id order (151643...; the vision / FIM / object tokens are
#: left out), with the real tokenizer's ``special`` flag
QWEN3_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
#: GLM-4.5 / 4.6 / 4.7's chat and tool tokens in id order (151329...; the media, box and code
#: tokens are left out), with the real tokenizer's ``special`` flag: the framing tokens are
#: special, the reasoning, call and argument tokens are not (SGLang skips special tokens in an
#: answer to a request without tools: a special ``</think>`` would be dropped)
GLM_TOKENS: tuple[tuple[str, bool], ...] = (
    *((t, True) for t in ("<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
                          "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")),
    *((t, False) for t in ("<think>", "</think>", "<tool_call>", "</tool_call>",
                           "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>",
                           "<arg_value>", "</arg_value>")),
    ("/nothink", True),
)  # fmt: skip
#: DeepSeek-V3.1's tokens in id order (0, 1, 2, then 128798...), with the ``special`` flag
DEEPSEEK_V3_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<｜begin▁of▁sentence｜>", True),
    ("<｜end▁of▁sentence｜>", True),
    ("<｜▁pad▁｜>", True),
    ("<think>", False),
    ("</think>", False),
    ("<｜User｜>", False),
    ("<｜Assistant｜>", False),
    ("<|EOT|>", False),
    ("<｜tool▁calls▁begin｜>", False),
    ("<｜tool▁calls▁end｜>", False),
    ("<｜tool▁call▁begin｜>", False),
    ("<｜tool▁call▁end｜>", False),
    ("<｜tool▁outputs▁begin｜>", False),
    ("<｜tool▁outputs▁end｜>", False),
    ("<｜tool▁output▁begin｜>", False),
    ("<｜tool▁output▁end｜>", False),
    ("<｜tool▁sep｜>", False),
)


#: DeepSeek-V4's tokens in id order (0, 1, 2, then 128803...; research copies, not published
#: by DeepSeek), the special flag; its prompts are encoded in Python (no chat template)
DEEPSEEK_V4_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<｜begin▁of▁sentence｜>", True),
    ("<｜end▁of▁sentence｜>", True),
    ("<｜▁pad▁｜>", True),
    ("<｜User｜>", False),
    ("<｜Assistant｜>", False),
    ("<think>", False),
    ("</think>", False),
    ("｜DSML｜", False),
    ("<｜latest_reminder｜>", False),
)


@dataclass(slots=True, frozen=True)
class TinyFamily:
    """What a family's tiny tokenizer holds besides the shared BPE corpus."""

    name: str  #: the family's name (regen.targets)
    tokens: tuple[tuple[str, bool], ...]  #: (text, special) in id order, on top of the vocab
    bos: str | None
    eos: str  #: the end of a turn: where chat generation stops
    pad: str
    #: ``kimi`` / ``ember`` (regen's own), a file under :data:`TEMPLATES_DIR`, or '' for a
    #: family whose engines encode its prompts in Python (no chat template)
    template: str
    committed: Path  #: the committed copy, relative to the repository root
    #: the ``response_template`` its tokenizer_config.json ships (None: none)
    response: dict[str, Any] | None = None

    @property
    def base_vocab(self) -> int:
        """Ids learned by BPE; the family's tokens follow."""
        return VOCAB_SIZE - len(self.tokens)

    def chat_template(self) -> str:
        if not self.template:
            return ""
        if self.template == "kimi":
            return KIMI_K25_TEMPLATE
        if self.template == "ember":
            return EMBER_TEMPLATE
        return (TEMPLATES_DIR / self.template).read_text(encoding="utf-8")


#: the families a tiny tokenizer is built for, by name
TINY_FAMILIES: dict[str, TinyFamily] = {
    f.name: f
    for f in (
        TinyFamily("kimi", tuple((t, True) for t in SPECIAL_TOKENS), "[BOS]", "<|im_end|>",
                   "[PAD]", "kimi", COMMITTED_DIR),
        TinyFamily("qwen3", QWEN3_TOKENS, None, "<|im_end|>", "<|endoftext|>", "qwen3.jinja",
                   Path("manifests/demo-qwen3/tokenizer")),
        TinyFamily("deepseek_v3", DEEPSEEK_V3_TOKENS, "<｜begin▁of▁sentence｜>",
                   "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "deepseek_v3.jinja",
                   Path("manifests/demo-deepseek/tokenizer")),
        TinyFamily("qwen3_coder", QWEN3_TOKENS, None, "<|im_end|>", "<|endoftext|>",
                   "qwen3_coder.jinja", Path("manifests/demo-qwen3-coder/tokenizer")),
        TinyFamily("glm45", GLM_TOKENS, None, "<|endoftext|>", "<|endoftext|>", "glm45.jinja",
                   Path("manifests/demo-glm45/tokenizer")),
        TinyFamily("response_template", tuple((t, True) for t in EMBER_TOKENS), None, "<|end|>",
                   "<|pad|>", "ember", Path("manifests/demo-ember/tokenizer"), EMBER_RESPONSE),
        TinyFamily("glm47", GLM_TOKENS, None, "<|endoftext|>", "<|endoftext|>", "glm47.jinja",
                   Path("manifests/demo-glm47/tokenizer")),
        TinyFamily("deepseek_v4", DEEPSEEK_V4_TOKENS, "<｜begin▁of▁sentence｜>",
                   "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "",
                   Path("manifests/demo-deepseek-v4/tokenizer")),
    )
}  # fmt: skip


def tiny_family(name: str) -> TinyFamily:
    """The tiny-tokenizer record of family ``name`` (ValueError for one without)."""
    try:
        return TINY_FAMILIES[name]
    except KeyError:
        raise ValueError(f"no tiny tokenizer for family {name!r} "
                         f"(known: {', '.join(TINY_FAMILIES)})") from None  # fmt: skip


@dataclass(slots=True, frozen=True)
class TinyTokenizerInfo:
    """What a model built on the tiny tokenizer needs to know."""

    path: str
    vocab_size: int
    bos_id: int | None  #: None: the family has no bos token (Qwen3)
    eos_id: int  #: the end of turn (``<|im_end|>``): where a chat turn stops
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


def build_tiny_tokenizer(
    out_dir: str | os.PathLike[str], family: str = "kimi"
) -> TinyTokenizerInfo:
    """Train and write ``family``'s tiny tokenizer directory; same bytes on every call."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    fam = tiny_family(family)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=fam.base_vocab,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(tiny_corpus(), trainer=trainer)
    if tok.get_vocab_size() != fam.base_vocab:
        raise RuntimeError(f"tiny corpus gave {tok.get_vocab_size()} ids, wanted {fam.base_vocab}")
    for special, run in groupby(fam.tokens, key=lambda t: t[1]):  # in id order
        added = [AddedToken(t, special=special, normalized=False) for t, _ in run]
        if special:  # add_special_tokens marks every token special; add_tokens keeps the flag
            tok.add_special_tokens(added)
        else:
            tok.add_tokens(added)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(json.loads(tok.to_str()), ensure_ascii=False, indent=1, sort_keys=True)
    (out / "tokenizer.json").write_text(text + "\n", encoding="utf-8")
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": fam.bos,
        "eos_token": fam.eos,
        "pad_token": fam.pad,
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
    }
    if fam.template:
        config["chat_template"] = fam.chat_template()
    if fam.response is not None:
        config["response_template"] = fam.response
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, ensure_ascii=False, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return tiny_info(out)


def tiny_info(path: str | os.PathLike[str]) -> TinyTokenizerInfo:
    """Ids of a tiny tokenizer directory (read from its tokenizer.json and config)."""
    folder = Path(path)
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    special = {t["content"]: t["id"] for t in data["added_tokens"]}
    bos = config.get("bos_token")
    return TinyTokenizerInfo(
        path=str(path),
        vocab_size=len(data["model"]["vocab"])
        + len([t for t in data["added_tokens"] if t["content"] not in data["model"]["vocab"]]),
        bos_id=None if bos is None else special[bos],
        eos_id=special[config["eos_token"]],
        pad_id=special[config["pad_token"]],
        special_ids=special,
    )


if __name__ == "__main__":  # python -m regen.devkit.tokenizers.tiny [FAMILY [OUT_DIR]]
    import sys

    name = sys.argv[1] if len(sys.argv) > 1 else "kimi"
    build_tiny_tokenizer(sys.argv[2] if len(sys.argv) > 2 else tiny_family(name).committed, name)
