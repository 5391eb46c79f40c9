"""New attempts of flagged samples (``regen run --retry-flagged FLAGS``). Owns no files.

A sample's answer is every row of one attempt (docs/engine.md). ``--retry-flagged`` requests
a done sample again, as a whole, when its latest answer has a row carrying one of ``FLAGS``
(regen.quality) and it has had fewer than ``max_retries`` new attempts: the new attempt is
numbered one above the latest, sends :func:`attempt_seed` as its seed, and is stored as new
rows in a later part. Nothing stored is rewritten: export keeps the highest attempt of each
sample, ``regen verify`` and the counters know both.

The selection depends only on what the parts hold, so rerunning the same command after a crash
requests exactly the new attempts that are not stored yet, and running it once more after it
finished requests nothing (every sample it retried has reached ``max_retries``, or came back
clean). A retry whose answer is flagged again is not retried by the same command; allow more
with ``--flagged-retries N``.
"""

from __future__ import annotations

from dataclasses import dataclass

from regen.core.sample import ATTEMPT_META, Sample
from regen.store.doneset import DoneSet


@dataclass(slots=True, frozen=True)
class RetryFlagged:
    """Which flagged samples a session requests again."""

    flags: tuple[str, ...]  #: regen.quality flag names (a sample with any of them)
    max_retries: int = 1  #: new attempts a sample may have in all (its attempt numbers: 1..N)


def attempt_seed(seed: int | None, attempt: int) -> int | None:
    """The seed attempt ``attempt`` sends: the manifest's ``sampling.seed`` (None: none sent)
    for the first answer, ``seed + attempt`` (``attempt`` without one) for a new attempt, so
    it draws differently where the server honours seeds (SGLang only with
    --enable-deterministic-inference; otherwise sampling at temperature > 0 differs anyway)."""
    if attempt == 0:
        return seed
    return (seed or 0) + attempt


def select(done: DoneSet, retry: RetryFlagged) -> dict[str, int]:
    """``{sample_id: its new attempt number}`` of the samples to request again (``done``
    read with its answers: :func:`regen.store.doneset.read_done`)."""
    if not done.answers:
        raise ValueError("the done-set was read without its answers (read_done(answers=True))")
    want = frozenset(retry.flags)
    return {
        sid: a.attempt + 1
        for sid, a in done.flagged.items()
        if a.attempt < retry.max_retries and a.flag_names & want
    }


def as_attempt(sample: Sample, attempt: int) -> Sample:
    """``sample`` marked as new attempt ``attempt`` (read back by :attr:`Sample.attempt`)."""
    sample.meta = {**sample.meta, ATTEMPT_META: attempt}
    return sample
