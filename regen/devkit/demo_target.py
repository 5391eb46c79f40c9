"""The demo target: a tiny Llama model trained at build time to answer in its family's format.

The family is the manifest's target family (:meth:`regen.manifest.Manifest.family`: Kimi for
``manifests/demo.yaml``, Qwen3 and DeepSeek-V3.1 for ``manifests/demo-qwen3.yaml`` and
``manifests/demo-deepseek.yaml``); the answers are rendered through that family's assembly, so
the model thinks, closes its reasoning and calls tools as that family's models do.

``build_demo_target(out_dir, manifest_path)`` writes (once; a second call with the same inputs
returns at once, other inputs rebuild it)::

    out_dir/
      config.json, generation_config.json      LlamaForCausalLM: hidden 64, 8 layers, 2 heads
                                               of 32 dimensions (CPU kernels of real engines
                                               serve it), untied embedding and lm head
                                               (SpecForge's target head loads lm_head.weight)
      model-NNNNN-of-NNNNN.safetensors         the weights, sharded, with
      model.safetensors.index.json             their index (SpecForge's target-head loader
                                               reads the index, never a single file)
      tokenizer.json, tokenizer_config.json    the manifest's tokenizer; tokenizer_config.json
                                               adds the family's ``response_template``
                                               (RESPONSE_TEMPLATES; KIMI_RESPONSE for Kimi):
                                               ``transformers serve`` then keeps the special
                                               tokens and returns reasoning_content and tool
                                               calls, as the family's server parsers do
      regen_demo_target.json                   build key and what the training did; written
                                               last, so its presence marks a complete build

The build is deterministic (fixed seed, fixed thread count) and takes a minute or two of CPU.
It reads the manifest's sources exactly as ``regen run`` does (:func:`regen.sources.stream.
read_samples`), walks every sample's turns as the engine will (:func:`regen.engine.turns.
regenerate`), answers each with :func:`demo_answer` and renders prompt + answer with the
tokenizer's own chat template (:class:`regen.template.render.Renderer`). The model is
trained on the answer tokens only. So when the demo asks it those prompts it thinks briefly,
closes its reasoning with ``</think>``, calls the tools the source's answer called (the
family's tool-call text: Kimi's section, Qwen3's ``<tool_call>`` JSON, DeepSeek's
``<｜tool▁calls▁begin｜>``) where tools are offered, otherwise answers in one sentence, and ends
with the family's end of turn: answers that finish, like a real target's, and that a draft can
learn. A Kimi build's key is what it was before families (same inputs, same model).

Per family (:data:`FAMILY_SPECS`): Qwen3 and DeepSeek-V3.1 train on batches of distinct turns
with a short warmup (final loss about 0.005, every turn's greedy answer exact, where Kimi's
default reaches 0.08); Kimi keeps the default. A family whose real template cannot render what
servers hand it is served with the fix a real deployment uses: the manifest's
``target.chat_template`` (DeepSeek-V3.1's history call arguments,
``manifests/demo-deepseek/served-template.jinja``) becomes the served copy's template; the
manifest's tokenizer keeps the real one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from regen.core.errors import ConfigError
from regen.core.result import TurnResult
from regen.core.sample import Message, ToolCall
from regen.engine.inputs import render_settings
from regen.engine.turns import Request, Tools, regenerate
from regen.manifest import load_manifest
from regen.sources import read_samples, source_set
from regen.template.render import Renderer

log = logging.getLogger(__name__)

MARKER = "regen_demo_target.json"
#: what earlier regen versions left in the same folder (the random tiny model): replaced freely
OLD_MARKERS = ("regen_tiny_model.json",)
BUILD_VERSION = 4
#: what the demo target thinks before it answers (with and without tools offered)
REASONING = "Let me think about the request."
REASONING_TOOLS = "The user needs a tool for this."
#: its answer when no tool is called
CONTENT = "Here is a short answer."
#: how the Kimi format is parsed (reasoning, tool-call sections, end of turn) by transformers
#: serve, and by vLLM (``--tool-call-parser hf``) and SGLang (``response_template``), which take
#: the reasoning field only as ``thinking``; regen.targets.response_template reads it back
#: (tests/targets/test_response_template.py holds it to the family module)
KIMI_RESPONSE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_assistant|>assistant<|im_middle|>",
    "fields": {
        "thinking": {"open": "<think>", "close": "</think>", "content": "text"},
        "tool_calls": {
            "open_pattern": r"(?:<\|tool_calls_section_begin\|>)?<\|tool_call_begin\|>"
            r"functions\.(?P<name>[^:<]+):\d+<\|tool_call_argument_begin\|>",
            "close_pattern": r"<\|tool_call_end\|>(?:<\|tool_calls_section_end\|>)?",
            "repeats": True,
            "content": "text",  # the arguments as written: a malformed one is the data's flag
            "transform": {
                "type": "function",
                "function": {"name": "{name}", "arguments": "{content}"},
            },
        },
        "content": {"close": "<|im_end|>", "content": "text"},
    },
}

#: Qwen3 (hermes JSON calls). Not transformers' own fallback for model type qwen3, which parses
#: the whole call as JSON: a malformed one fails the stream with an ``error`` event whose
#: message holds raw newlines (no JSON line: the client's request fails). Here the name is
#: matched and the arguments are kept as written (a malformed one is the data's flag, as in the
#: Kimi and DeepSeek templates); a call whose head does not match stays in the content, as
#: vLLM's hermes parser leaves it
QWEN3_RESPONSE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "thinking": {"open": "<think>", "close": "</think>", "content": "text"},
        "tool_calls": {
            "open_pattern": r'\s*<tool_call>\s*\{"name":\s*"(?P<name>[^"\n<]+)",\s*"arguments":\s*',
            "close_pattern": r"\}\s*</tool_call>",
            "repeats": True,
            "content": "text",
            "transform": {
                "type": "function",
                "function": {"name": "{name}", "arguments": "{content}"},
            },
        },
        "content": {"close_pattern": r"\s*(?:<\|im_end\|>|<\|endoftext\|>)", "content": "text"},
    },
}
#: DeepSeek-V3.1 (``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>``); after a tool
#: output the template opens no assistant turn: the answer starts after
#: ``<｜tool▁output▁end｜>`` (with the last ``<｜Assistant｜>`` as the anchor, the history's call
#: and tool output would be parsed as the answer)
DEEPSEEK_V3_RESPONSE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": ["<｜Assistant｜>", "<｜tool▁output▁end｜>"],
    "fields": {
        "thinking": {"open": "<think>", "close": "</think>", "content": "text"},
        "tool_calls": {
            "open_pattern": r"(?:<｜tool▁calls▁begin｜>)?<｜tool▁call▁begin｜>"
            r"(?P<name>[^<]+)<｜tool▁sep｜>",
            "close_pattern": r"<｜tool▁call▁end｜>(?:<｜tool▁calls▁end｜>)?",
            "repeats": True,
            "content": "text",
            "transform": {
                "type": "function",
                "function": {"name": "{name}", "arguments": "{content}"},
            },
        },
        "content": {"close": "<｜end▁of▁sentence｜>", "content": "text"},
    },
}
#: the ``response_template`` a demo target of each family gets, by family name
RESPONSE_TEMPLATES: dict[str, dict[str, Any]] = {
    "kimi": KIMI_RESPONSE,
    "qwen3": QWEN3_RESPONSE,
    "deepseek_v3": DEEPSEEK_V3_RESPONSE,
}


@dataclass(slots=True, frozen=True)
class DemoTargetSpec:
    """The demo target's shape and its build-time training."""

    hidden: int = 64
    layers: int = 8
    heads: int = 2
    head_dim: int = 32
    intermediate: int = 192
    seed: int = 0
    steps: int = 400
    batch: int = 8
    lr: float = 5e-3
    #: rows whose answer calls tools are seen this many times per epoch: they are the hardest
    #: (the source's call is memorised per prompt); 12 makes the greedy answer repeat it on 11
    #: of the 12 tool turns where 4 did on 9, at the same step count
    tool_repeats: int = 12
    #: intra-op threads while training (fixed: the result must not depend on the machine)
    threads: int = 1
    #: safetensors shard size (small: the demo target is sharded like a real checkpoint)
    shard_size: str = "1MB"
    #: steps of linear learning-rate warmup before the cosine decay (0: none, as Kimi's build)
    warmup: int = 0
    #: every batch holds distinct turns: the tool turns' batches (length-sorted among the tool
    #: turns) come ``tool_repeats`` times an epoch, where the default repeats every tool turn
    #: and sorts by length, so a batch is mostly copies of one turn (one turn's gradient for
    #: eight turns' compute)
    distinct_batches: bool = False


#: fields added after BUILD_VERSION 4: left out of the build key at their defaults, so that a
#: Kimi build keeps its key
_NEWER_FIELDS = {"warmup": 0, "distinct_batches": False}
#: per family, where it differs from DemoTargetSpec(): Qwen3's long tool prompts (the
#: ``# Tools`` boilerplate, a distractor ``{"name": <function-name>`` right before the answer's
#: call) left the default at a final loss of 0.65 in 400 steps, garbling names and ``</think>``;
#: distinct batches with a warmup reach < 0.01 (every turn's greedy answer exact) at the same
#: steps and fewer tokens per epoch. Every family added since trains so (Qwen3-Coder's default
#: build ended at 0.54)
FAMILY_SPECS: dict[str, DemoTargetSpec] = {
    name: DemoTargetSpec(tool_repeats=4, warmup=20, distinct_batches=True)
    for name in ("qwen3", "deepseek_v3", "qwen3_coder", "glm45", "glm47", "deepseek_v32",
                 "deepseek_v4", "response_template")
}  # fmt: skip


def family_spec(family: str) -> DemoTargetSpec:
    """The demo target's spec for a model family (the default where none is set)."""
    return FAMILY_SPECS.get(family, DemoTargetSpec())


@dataclass(slots=True)
class TrainingTurn:
    """One answered turn: the prompt's ids and the answer's ids (the loss goes on these)."""

    sample_id: str
    prompt_ids: list[int]
    answer_ids: list[int]
    calls_tools: bool


def demo_answer(request: Request, tools: Tools | None, original: Message | None) -> TurnResult:
    """The demo target's answer (a TurnResult) to one request; ``original`` is the source's own
    assistant message for that turn (or None): its tool calls are repeated when tools are
    offered."""

    del request  # the answer depends on the offer and the source's answer only
    calls: tuple[ToolCall, ...] = ()
    if tools and original is not None and original.tool_calls:
        calls = tuple(
            ToolCall(id=f"functions.{c.name}:{i}", name=c.name, arguments=c.arguments)
            for i, c in enumerate(original.tool_calls)
        )
    return TurnResult(
        content="" if calls else CONTENT,
        reasoning=REASONING_TOOLS if tools else REASONING,
        tool_calls=calls,
        finish_reason="tool_calls" if calls else "stop",
        model="demo-target",
        endpoint="build",
    )


def training_turns(manifest: Any) -> list[TrainingTurn]:
    """Every turn the demo will regenerate, answered by :func:`demo_answer` and tokenized."""

    renderer = Renderer.of(render_settings(manifest))
    turns: list[TrainingTurn] = []
    with _quiet("regen.sources"):  # the demo sources hold bad rows on purpose
        samples = [s for s in read_samples(source_set(manifest)) if s.mode == "regenerate"]
    for sample in samples:
        originals = [m for m in sample.messages if m.role == "assistant"]
        if sample.turns == "last":
            originals = originals[-1:]
        answered = iter(originals)

        async def complete(
            request: Request, tools: Tools | None, answered: Iterator[Message] = answered
        ) -> TurnResult:
            return demo_answer(request, tools, next(answered, None))

        for done in asyncio.run(regenerate(sample, complete)).turns:
            r = done.result
            t = renderer.render_turn(
                done.request_messages,
                sample.tools,
                reasoning=r.reasoning,
                content=r.content,
                tool_calls=r.tool_calls,
                finish_reason="stop",
            )
            turns.append(TrainingTurn(sample.id, t.prompt_ids, t.response_ids, bool(r.tool_calls)))
    return turns


def train_demo_target(model: Any, turns: list[TrainingTurn], spec: DemoTargetSpec) -> list[float]:
    """Train ``model`` on the answer tokens of ``turns``; the loss of every step."""
    import torch

    if spec.distinct_batches:
        rows = list(turns)
    else:
        rows = [t for t in turns for _ in range(spec.tool_repeats if t.calls_tools else 1)]
    seqs = [(t.prompt_ids + t.answer_ids, len(t.prompt_ids)) for t in rows]
    pad = int(model.config.pad_token_id)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(spec.seed)
    batches: list[list[int]] = []
    losses: list[float] = []
    model.train()
    for step in range(spec.steps):
        if not batches:
            batches = _epoch(rows, seqs, spec, gen)
        idx = batches.pop()
        width = max(len(seqs[i][0]) for i in idx)
        ids = torch.full((len(idx), width), pad)
        labels = torch.full((len(idx), width), -100)
        attn = torch.zeros((len(idx), width), dtype=torch.long)
        for j, i in enumerate(idx):
            seq, start = seqs[i]
            ids[j, : len(seq)] = torch.tensor(seq)
            labels[j, start : len(seq)] = torch.tensor(seq[start:])
            attn[j, : len(seq)] = 1
        lr = spec.lr * 0.5 * (1 + math.cos(math.pi * step / spec.steps))
        if spec.warmup:
            lr *= min(1.0, (step + 1) / spec.warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def _epoch(
    rows: list[TrainingTurn], seqs: list[tuple[list[int], int]], spec: DemoTargetSpec, gen: Any
) -> list[list[int]]:
    """One epoch's batches (indices into ``seqs``), in random order; popped from the end."""
    import torch

    def chunked(perm: list[int]) -> list[list[int]]:  # batches of similar length
        by_len = sorted(perm, key=lambda i: len(seqs[i][0]))
        return [by_len[i : i + spec.batch] for i in range(0, len(by_len), spec.batch)]

    if spec.distinct_batches:
        chunks: list[list[int]] = []
        for tools in (False, True):
            perm = torch.randperm(len(seqs), generator=gen).tolist()
            group = chunked([i for i in perm if rows[i].calls_tools == tools])
            chunks += group * (spec.tool_repeats if tools else 1)
    else:
        chunks = chunked(torch.randperm(len(seqs), generator=gen).tolist())
    return [chunks[i] for i in torch.randperm(len(chunks), generator=gen).tolist()]


def build_demo_target(
    out_dir: str | Path, manifest_path: str | Path, spec: DemoTargetSpec | None = None
) -> Path:
    """Build (or reuse) the demo target for ``manifest_path``'s sources and tokenizer; returns
    its absolute path."""

    out = Path(out_dir).resolve()
    manifest = load_manifest(manifest_path)
    fam = manifest.family()
    spec = spec or family_spec(fam.name if fam is not None else "unknown")
    tok_dir = manifest.resolve(manifest.target.tokenizer)
    response = response_template(manifest)
    key = build_key(manifest, Path(manifest_path), tok_dir, spec, response)
    if _built(out, key):
        return out
    ours = (MARKER, *OLD_MARKERS)
    if out.exists() and any(out.iterdir()) and not any((out / m).exists() for m in ours):
        raise ConfigError(f"{out} exists and is not a demo-target build: not overwriting it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        info = _build(tmp, manifest, tok_dir, spec, response)
        (tmp / MARKER).write_text(json.dumps({"key": key, **info}, indent=1), encoding="utf-8")
        if _built(out, key):  # another process finished the same build first
            return out
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("built the demo target at %s (%d turns, %d steps, final loss %.4f, %.0f s)", out,
             info["turns"], spec.steps, info["final_loss"], info["seconds"])  # fmt: skip
    return out


def response_template(manifest: Any) -> dict[str, Any] | None:
    """The ``response_template`` the demo target of the manifest's family gets
    (:data:`RESPONSE_TEMPLATES`; None: none is added: the family's demo target is served by
    vLLM's own parsers, or its tokenizer ships its own). ConfigError: no family, no demo
    target."""
    fam = manifest.family()
    if fam is None:
        raise ConfigError("no demo target for a target of no known model family",
                          field="target.family")  # fmt: skip
    return RESPONSE_TEMPLATES.get(fam.name)


def _build(
    out: Path, manifest: Any, tok_dir: Path, spec: DemoTargetSpec, response: dict[str, Any] | None
) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    started = time.monotonic()
    tok = AutoTokenizer.from_pretrained(tok_dir)
    turns = training_turns(manifest)
    eos = end_ids(tok, manifest.family())
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        head_dim=spec.head_dim,
        max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads)
    try:
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config).to(torch.float32)  # type: ignore[arg-type]  # transformers' to() is @wraps(nn.Module.to): typeshed's _Wrapped keeps the unbound self
        losses = train_demo_target(model, turns, spec)
    finally:
        torch.set_num_threads(threads)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tok.pad_token_id,
        do_sample=True,
        temperature=0.6,
        top_p=0.95,
        max_new_tokens=128,
    )
    out.mkdir(parents=True)
    model.save_pretrained(out, max_shard_size=spec.shard_size)
    for p in tok_dir.iterdir():
        if p.is_file():
            shutil.copy2(p, out / p.name)
    tok_config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    if response is not None:
        tok_config["response_template"] = response
    served = manifest.served_template()
    if served is not None:  # what the servers run with (--chat-template): the served copy's own
        tok_config["chat_template"] = served
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2), encoding="utf-8")
    tail = losses[-20:]
    return {
        "spec": asdict(spec),
        "tokenizer_dir": str(tok_dir),
        "family": manifest.family().name,
        "turns": len(turns),
        "tool_turns": sum(t.calls_tools for t in turns),
        "first_loss": round(losses[0], 6),
        "final_loss": round(sum(tail) / len(tail), 6),
        "seconds": round(time.monotonic() - started, 1),
    }


def end_ids(tok: Any, family: Any) -> int | list[int]:
    """The ids generation stops at: the tokenizer's eos, and where the family's answers end
    with another token (GLM: the next role token), every end token of the family as well (the
    real checkpoints' generation_config does the same)."""
    end = tok.convert_tokens_to_ids(family.end_of_turn) if family.end_of_turn else None
    if end is None or end == tok.eos_token_id:
        return int(tok.eos_token_id)
    ids = [tok.convert_tokens_to_ids(t) for t in family.end_tokens()]
    return sorted({int(tok.eos_token_id), *(int(i) for i in ids if i is not None)})


def build_key(
    manifest: Any,
    manifest_path: Path,
    tok_dir: Path,
    spec: DemoTargetSpec,
    response: dict[str, Any] | None = KIMI_RESPONSE,
) -> str:
    """Hash of everything the build reads: the spec, the family's response template (a Kimi
    build's key is the one of before families), the manifest, its served template, its
    tokenizer, its sources."""
    parts: list[Any] = [BUILD_VERSION, key_fields(spec), response]
    h = hashlib.sha256(json.dumps(parts).encode())
    files = [manifest_path.resolve(), *sorted(p for p in tok_dir.iterdir() if p.is_file())]
    if manifest.target.chat_template is not None:
        files.append(manifest.resolve(manifest.target.chat_template))
    files += [manifest.resolve(s.path) for s in manifest.sources if s.path]
    for p in files:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:32]


def key_fields(spec: DemoTargetSpec) -> dict[str, Any]:
    """The spec's fields that enter the build key: all but those added after BUILD_VERSION 4
    while they hold their defaults (a Kimi build's key is the one of before)."""
    return {k: v for k, v in asdict(spec).items()
            if k not in _NEWER_FIELDS or v != _NEWER_FIELDS[k]}  # fmt: skip


def _built(out: Path, key: str) -> bool:
    try:
        return json.loads((out / MARKER).read_text(encoding="utf-8")).get("key") == key
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
