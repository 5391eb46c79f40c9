"""Models the real-engine tests serve, built here from the demo tokenizer (no hub).

``build_scripted_target(out_dir)`` writes a plain ``LlamaForCausalLM`` (hidden 128, 4 layers,
4 heads of 32: vLLM's CPU attention needs a head dimension in {32, 64, 80, ...}) whose
attention and MLP outputs are zero, so each next token depends on the current token only
(a bigram model in Llama's shape). Its embedding and head are set so that:

- after ``</think>`` (the last prompt token when thinking is off) it writes, token by token,
  exactly :data:`TOOL_CALL_TEXT` and ``<|im_end|>``: one Kimi tool call, the same every time;
- after any other token it writes seeded random ordinary text, and about once in 40 tokens
  ``<|im_end|>`` or ``</think>`` (then the chain above), never another special token nor a
  token of that chain.

So a thinking-on request gets varied text (like the demo's random model) and a thinking-off
request gets a tool call the engine's ``kimi_k2`` parser turns into ``lookup({"q": 7})``.

``build_eagle3_draft(out_dir, target_dir, aux_ids)`` writes an untrained EAGLE-3 draft with
SpecForge's own ``LlamaForCausalLMEagle3`` class, saved as SpecForge's exporter
(``specforge.export.to_sglang``) saves one: every weight but the embedding, config.json with
``eagle_config.eagle_aux_hidden_state_layer_ids``. Both builds are keyed: a second call with
the same inputs returns at once.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
from pathlib import Path

from regen.devkit.tokenizers.tiny import build_tiny_tokenizer

#: the tool call the scripted target makes after </think>: name "lookup", arguments {"q": 7}
TOOL_NAME = "lookup"
TOOL_ARGS = '{"q": 7}'
TOOL_CALL_TEXT = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.lookup:0"
    f"<|tool_call_argument_begin|>{TOOL_ARGS}<|tool_call_end|><|tool_calls_section_end|>"
)
HIDDEN = 128
LAYERS = 4
HEADS = 4
MARKER = "regen_test_model.json"
BUILD_VERSION = 3


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps([BUILD_VERSION, *parts], default=str).encode()).hexdigest()


def _fresh(out: Path, key: str) -> bool:
    """True when ``out`` holds a complete build of ``key``; else empties it."""
    marker = out / MARKER
    try:
        if json.loads(marker.read_text(encoding="utf-8")).get("key") == key:
            return True
    except (OSError, ValueError):
        pass
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return False


def build_scripted_target(out_dir: str | Path, *, seed: int = 0) -> Path:
    """Build (or reuse) the scripted target (module docstring); returns its folder."""
    out = Path(out_dir).resolve()
    key = _key("target", seed, HIDDEN, LAYERS)
    if _fresh(out, key):
        return out
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    build_tiny_tokenizer(out)
    tok = AutoTokenizer.from_pretrained(out)
    vocab = len(tok)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    chain = [tok.convert_tokens_to_ids("</think>")]
    chain += [*tok.encode(TOOL_CALL_TEXT, add_special_tokens=False), im_end]
    if len(set(chain)) != len(chain) or len(chain) > 32:
        raise AssertionError(f"the scripted chain needs distinct tokens: {chain}")
    special = set(tok.all_special_ids) | {
        tok.convert_tokens_to_ids(t)
        for t in tok.get_vocab()
        if t.startswith("<|") or t in ("<think>", "</think>", "[BOS]", "[EOS]", "[PAD]")
    }
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=2,
        max_position_embeddings=4096, bos_token_id=tok.bos_token_id, eos_token_id=im_end,
        pad_token_id=tok.pad_token_id, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    gen = torch.Generator().manual_seed(seed)
    n_chain = len(chain) - 1  # dims 0..n_chain-1: one per chain step; the last dim: a bias
    rand = slice(32, HIDDEN - 1)
    width = HIDDEN - 1 - 32
    with torch.no_grad():
        for layer in model.model.layers:  # every block adds nothing to the residual stream
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight
        head = model.lm_head.weight
        emb.zero_()
        head.zero_()
        emb[:, rand] = torch.randn(vocab, width, generator=gen)
        emb[:, -1] = 3.0
        ordinary = [t for t in range(vocab) if t not in special and t not in chain]
        head[ordinary, rand] = 0.3 * torch.randn(len(ordinary), width, generator=gen)
        head[ordinary, -1] = 3.0
        head[im_end, rand] = 0.3 * torch.randn(width, generator=gen)
        head[im_end, -1] = 3.35
        # after random text, </think> now and then: some thinking-on answers close their
        # reasoning and then make the chain's tool call
        head[chain[0], -1] = 5.5  # a constant logit near the top of the random ones
        for i, (cur, nxt) in enumerate(itertools.pairwise(chain)):
            emb[cur] = 0.0
            emb[cur, i] = 1.0
            head[nxt, i] = 5.0
        assert n_chain <= 32
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=im_end, pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(out)
    (out / MARKER).write_text(json.dumps({"key": key, "chain": chain}), encoding="utf-8")
    return out


def build_eagle3_draft(
    out_dir: str | Path, target_dir: str | Path, aux_ids: list[int], *, seed: int = 0
) -> Path:
    """An untrained EAGLE-3 draft for the target in ``target_dir`` (module docstring), its
    config carrying ``aux_ids`` as written (the caller picks the numbering)."""
    out = Path(out_dir).resolve()
    target = json.loads((Path(target_dir) / "config.json").read_text(encoding="utf-8"))
    key = _key("draft", seed, aux_ids, target["hidden_size"], target["vocab_size"])
    if _fresh(out, key):
        return out
    import torch
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from transformers import LlamaConfig

    vocab = int(target["vocab_size"])
    draft_vocab = vocab // 2
    cfg = LlamaConfig(
        architectures=["LlamaForCausalLMEagle3"], hidden_size=target["hidden_size"],
        intermediate_size=2 * target["hidden_size"], num_hidden_layers=1,
        num_attention_heads=HEADS, num_key_value_heads=2, vocab_size=vocab,
        draft_vocab_size=draft_vocab, max_position_embeddings=4096, rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        eagle_config={"eagle_aux_hidden_state_layer_ids": list(aux_ids)},
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLMEagle3(cfg)
    # the draft vocabulary: the lowest ids, then the special tokens at the top (SpecForge's
    # d2t holds offsets: target id = draft id + d2t[draft id])
    top = 16
    ids = list(range(draft_vocab - top)) + list(range(vocab - top, vocab))
    with torch.no_grad():
        model.d2t.copy_(torch.tensor(ids) - torch.arange(draft_vocab))
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[ids] = True
        model.t2d.copy_(t2d)
    state = {k: v for k, v in model.state_dict().items() if "embed" not in k.lower()}
    model.save_pretrained(out, state_dict=state)
    (out / MARKER).write_text(json.dumps({"key": key}), encoding="utf-8")
    return out


def build_eagle1_draft(out_dir: str | Path, target_dir: str | Path, *, seed: int = 0) -> Path:
    """An untrained EAGLE (EAGLE-1, not EAGLE-3) draft for the target in ``target_dir``, in the
    layout vLLM's ``eagle`` method loads (``model_executor/models/llama_eagle.py``): a plain
    ``LlamaForCausalLM`` config of one decoder layer without its input norm, ``fc`` over
    [embedding, last hidden state] (2H → H), the target's embedding and head shared."""
    out = Path(out_dir).resolve()
    target = json.loads((Path(target_dir) / "config.json").read_text(encoding="utf-8"))
    hidden = int(target["hidden_size"])
    key = _key("eagle1", seed, hidden, target["vocab_size"])
    if _fresh(out, key):
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    heads = int(target["num_attention_heads"])
    cfg = LlamaConfig(
        architectures=["LlamaForCausalLM"], hidden_size=hidden,
        intermediate_size=int(target["intermediate_size"]), num_hidden_layers=1,
        num_attention_heads=heads, num_key_value_heads=int(target["num_key_value_heads"]),
        head_dim=int(target.get("head_dim") or hidden // heads),
        vocab_size=int(target["vocab_size"]), max_position_embeddings=4096,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    layer = LlamaDecoderLayer(cfg, layer_idx=0)
    state = {f"layers.0.{k}": v.contiguous() for k, v in layer.state_dict().items()
             if not k.startswith("input_layernorm")}  # fmt: skip
    state["fc.weight"] = torch.randn(hidden, 2 * hidden) * 0.02
    save_file(state, str(out / "model.safetensors"))
    cfg.save_pretrained(out)
    (out / MARKER).write_text(json.dumps({"key": key}), encoding="utf-8")
    return out
