"""The draft-vocabulary mapping SpecForge's EAGLE-3 draft loads (``model.vocab_mapping_path``).

An EAGLE-3 draft predicts over a reduced vocabulary of ``draft_vocab_size`` target ids: the
ones the training answers use most. SpecForge keeps the choice in two tensors, saved together
with ``torch.save({"d2t": ..., "t2d": ...})`` and loaded by its draft's ``load_vocab_mapping``
(``t2d.copy_``, ``d2t.copy_`` into buffers of those shapes):

- ``t2d``: bool, ``[vocab_size]``; True for the target ids the draft predicts;
- ``d2t``: int64, ``[draft_vocab_size]``; draft id ``i`` is target id ``i + d2t[i]`` (an
  offset, so the chosen target ids, ascending, are ``arange(draft_vocab_size) + d2t``).

The choice here is SpecForge's rule, written for regen's data: the loss-masked tokens of the
exported rows are counted; the ``draft_vocab_size`` most frequent ids are chosen (ties broken
by the smaller id, so the file depends only on the data); when the answers use fewer distinct
ids, the smallest unused ids fill the rest. A disaggregated run needs the file in advance
(SpecForge's planner refuses one without it: producer and consumer could not derive one
shared mapping), so ``regen train`` writes it from the very rows the run trains on.

Files (names from :mod:`regen.store.layout`)::

    RUN_DIR/train/vocab_mapping.pt     {"d2t", "t2d"} (torch.save), model.vocab_mapping_path
    RUN_DIR/train/vocab_mapping.json   VocabMappingRecord: how it was built (rows and loss
                                       tokens counted, distinct ids seen, draft vocab size,
                                       share of the loss tokens the draft vocabulary covers)
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from regen.core.errors import ConfigError, TrapError
from regen.store import RunDir
from regen.store import layout as L
from regen.train import traps

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class VocabCounts:
    """Loss-token frequencies of a prompts file."""

    counts: Counter[int]
    rows: int
    loss_tokens: int


def count_loss_tokens(paths: Iterable[str | Path]) -> VocabCounts:
    """Frequency of every loss-masked token id in pre-tokenized JSONL rows."""
    counts: Counter[int] = Counter()
    rows = loss = 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                row = json.loads(line)
                ids, mask = row["input_ids"], row["loss_mask"]
                trained = [i for i, m in zip(ids, mask, strict=True) if m]
                counts.update(trained)
                rows += 1
                loss += len(trained)
    return VocabCounts(counts=counts, rows=rows, loss_tokens=loss)


def choose_draft_ids(counts: Counter[int], draft_vocab_size: int, vocab_size: int) -> list[int]:
    """The target ids of the draft vocabulary, ascending (see the module docstring)."""
    if draft_vocab_size > vocab_size:
        raise TrapError(
            traps.TRAP_VOCAB,
            f"draft_vocab_size {draft_vocab_size} exceeds the vocabulary {vocab_size}.",
            "set draft.draft_vocab_size to at most the target vocab.",
        )
    bad = [t for t in counts if not 0 <= t < vocab_size]
    if bad:
        raise TrapError(
            traps.TRAP_VOCAB,
            f"the training data holds token id {max(bad)} outside the vocabulary of "
            f"{vocab_size}: it was tokenized with a different tokenizer.",
            "re-export the run with the target's own tokenizer.",
        )
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    chosen = {t for t, _ in ranked[:draft_vocab_size]}
    filler = (t for t in range(vocab_size) if t not in chosen)
    while len(chosen) < draft_vocab_size:
        chosen.add(next(filler))
    return sorted(chosen)


def mapping_tensors(draft_ids: list[int], vocab_size: int) -> dict[str, object]:
    """SpecForge's ``{"d2t", "t2d"}`` for the chosen ids (torch tensors)."""
    import torch

    ids = torch.tensor(draft_ids, dtype=torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return {"d2t": ids - torch.arange(len(draft_ids), dtype=torch.long), "t2d": t2d}


def write_vocab_mapping(
    rd: RunDir, prompts: Path, *, draft_vocab_size: int, vocab_size: int
) -> L.VocabMappingRecord:
    """Count ``prompts``' loss tokens, write the mapping and its record; returns the record."""
    try:
        import torch
    except ImportError as e:
        raise ConfigError(
            f"writing SpecForge's vocab mapping needs torch ({e}); install regen's training "
            "extra (pip install 'regen[serving]', which pins torch)"
        ) from None
    found = count_loss_tokens([prompts])
    draft_ids = choose_draft_ids(found.counts, draft_vocab_size, vocab_size)
    covered = sum(found.counts[t] for t in draft_ids)
    buf = io.BytesIO()
    torch.save(mapping_tensors(draft_ids, vocab_size), buf)
    data = buf.getvalue()
    rd.write_bytes_atomic(L.VOCAB_MAPPING, data)
    record = L.VocabMappingRecord(
        path=rd.path(L.VOCAB_MAPPING),
        sha256=hashlib.sha256(data).hexdigest(),
        prompts_path=str(prompts),
        rows=found.rows,
        loss_tokens=found.loss_tokens,
        distinct_ids=len(found.counts),
        vocab_size=vocab_size,
        draft_vocab_size=draft_vocab_size,
        coverage=round(covered / found.loss_tokens, 6) if found.loss_tokens else 0.0,
    )
    L.VOCAB_MAPPING_FILE.write(rd, record)
    log.info("vocab mapping: %d draft ids for %d distinct loss-token ids, covering %.1f%% of "
             "%d loss tokens", draft_vocab_size, record.distinct_ids, 100 * record.coverage,
             record.loss_tokens)  # fmt: skip
    return record


def check_vocab_mapping(rd: RunDir, *, rows: int, loss_tokens: int) -> L.VocabMappingRecord:
    """On the cluster: the mapping exists, matches its record, has SpecForge's shapes, and was
    built from data with ``rows`` rows and ``loss_tokens`` loss tokens (the prompts scanned)."""
    record = L.VOCAB_MAPPING_FILE.read(rd)
    data = rd.read_bytes(L.VOCAB_MAPPING)
    fix = "run `regen train` again to rewrite it from the export."
    if record is None or data is None:
        raise TrapError(traps.TRAP_VOCAB_MAPPING, f"{L.VOCAB_MAPPING} is missing.", fix)
    if hashlib.sha256(data).hexdigest() != record.sha256:
        raise TrapError(
            traps.TRAP_VOCAB_MAPPING, f"{L.VOCAB_MAPPING} changed after it was written.", fix
        )
    if (record.rows, record.loss_tokens) != (rows, loss_tokens):
        raise TrapError(
            traps.TRAP_VOCAB_MAPPING,
            f"{L.VOCAB_MAPPING} was built from {record.rows} rows / {record.loss_tokens} loss "
            f"tokens, but the prompts hold {rows} / {loss_tokens}: the data changed since.",
            fix,
        )
    import torch

    loaded = torch.load(io.BytesIO(data))
    t2d, d2t = loaded["t2d"], loaded["d2t"]
    shapes = (tuple(t2d.shape), tuple(d2t.shape), int(t2d.sum()))
    want = ((record.vocab_size,), (record.draft_vocab_size,), record.draft_vocab_size)
    if shapes != want:
        raise TrapError(
            traps.TRAP_VOCAB_MAPPING,
            f"{L.VOCAB_MAPPING} has t2d {shapes[0]}, d2t {shapes[1]}, {shapes[2]} ids chosen; "
            f"the draft needs {want[0]}, {want[1]}, {want[2]}.",
            fix,
        )
    return record
