"""A tiny random-weight causal LM for the demo and end-to-end tests.

``build_tiny_model(out_dir, tokenizer_dir)`` writes::

    out_dir/
      config.json, generation_config.json, model.safetensors   LlamaForCausalLM, hidden 64,
                                                              2 layers, seeded random weights
      tokenizer.json, tokenizer_config.json, ...              copied from tokenizer_dir
      regen_tiny_model.json                                   build key (inputs' hash); written
                                                              last, so its presence marks a
                                                              complete build

The vocabulary is the tokenizer's full size (``len(tokenizer)``); generation stops at the
tokenizer's eos token (``<|im_end|>`` for the tiny Kimi tokenizer). A second call with the same
inputs returns at once; different inputs rebuild the folder in place.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

from regen.errors import ConfigError

log = logging.getLogger(__name__)

MARKER = "regen_tiny_model.json"
BUILD_VERSION = 1


def _build_key(tokenizer_dir: Path, seed: int, hidden: int, layers: int) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([BUILD_VERSION, seed, hidden, layers]).encode())
    for p in sorted(tokenizer_dir.iterdir()):
        if p.is_file():
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:32]


def build_tiny_model(
    out_dir: str | Path,
    tokenizer_dir: str | Path,
    *,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
) -> Path:
    """Build (or reuse) the tiny model folder; returns its absolute path."""
    out = Path(out_dir).resolve()
    tok_dir = Path(tokenizer_dir).resolve()
    key = _build_key(tok_dir, seed, hidden, layers)
    marker = out / MARKER
    if marker.exists():
        try:
            if json.loads(marker.read_text(encoding="utf-8")).get("key") == key:
                return out
        except (OSError, ValueError):
            pass
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    if out.exists() and any(out.iterdir()):
        if not marker.exists():
            raise ConfigError(f"{out} exists and is not a tiny-model build: not overwriting it")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    eos = tok.eos_token_id
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tok.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=64,
    )
    model.save_pretrained(out)
    for p in tok_dir.iterdir():
        if p.is_file():
            shutil.copy2(p, out / p.name)
    marker.write_text(json.dumps({"key": key, "tokenizer_dir": str(tok_dir)}), encoding="utf-8")
    log.info("built tiny model at %s (vocab %d)", out, len(tok))
    return out
