"""Which family a target is: the one rule ``regen run``, ``regen train`` and ``regen
serve-command`` decide it by (:func:`decide_family`), and the refusal when two statements
about one target name different families (:func:`agree`: a run and the train.yaml that trains
on it, serve-command's ``--family`` and its config).

The rule, in this order: what the target's tokenizer folder shows (:func:`regen.targets.
recognise_dir`), which a family named (a manifest's or train.yaml's ``target.family``,
serve-command's ``--family``) must not contradict (:func:`regen.targets.target_family` refuses
it, naming both); where the folder shows none, the family named; where none is named either and
the caller knows the target's vocabulary size (train.yaml's ``target.vocab_size``: the target's
checkpoint lives on the cluster, its tokenizer is often not readable where ``regen train``
runs), the one family whose published vocabulary has that many ids, when one alone does.
``unknown`` names no family, and a statement of no family contradicts none.

Reads, never writes, the tokenizer folder.
"""

from __future__ import annotations

from pathlib import Path

from regen.core.errors import ConfigError
from regen.targets import FAMILIES, UNKNOWN, Family, target_family

#: one statement about a target's family: who makes it, and the family (None: none known)
Stated = tuple[str, Family | None]


def decide_family(
    named: str | None, tokenizer_dir: str | Path, *, vocab_size: int | None = None
) -> Family | None:
    """The family of the target whose tokenizer folder is ``tokenizer_dir`` (the module
    docstring's rule); ``named``: the family a config names (None: unset); ``vocab_size``: the
    target's vocabulary, where the folder may not be readable here. None: no family regen
    knows. ConfigError when ``named`` contradicts the folder."""
    found = target_family(named, tokenizer_dir)
    if found is not None or named is not None or vocab_size is None:
        return found
    return by_published_vocab(vocab_size)


def by_published_vocab(vocab_size: int) -> Family | None:
    """The one family whose published vocabulary has ``vocab_size`` ids (None: no family, or
    more than one)."""
    sized = [f for f in FAMILIES.values() if f.published_vocab == vocab_size]
    return sized[0] if len(sized) == 1 else None


def agree(first: Stated, second: Stated, *, field: str = "target.family") -> None:
    """The one refusal: a ConfigError naming both when two statements about one target each
    name a family and they differ (one target is one family: the checks, the loss mask and the
    serving flags hang on which)."""
    (who, mine), (other, theirs) = first, second
    if mine is not None and theirs is not None and mine.name != theirs.name:
        raise ConfigError(
            f"{field}: {who} is {mine.title} ({mine.name!r}), {other} is {theirs.title} "
            f"({theirs.name!r}): one target, two families; make them name the same one (or "
            f"set {field} {UNKNOWN!r} where no family applies)",
            field=field,
        )
