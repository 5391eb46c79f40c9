"""The source adapters: each name of :data:`regen.manifest.AdapterName` with its row parser.

An adapter turns one raw row into a :class:`~regen.core.sample.Sample` or a
:class:`~regen.core.sample.Rejection`. :func:`iter_source` runs a source's adapter over its raw rows
and gives every sample its stable id, a function of the row alone (never of its position).
A sample whose text is not valid Unicode (:meth:`regen.core.sample.Sample.invalid_text`: a lone
surrogate, e.g. from a JSON string column such as xLAM's ``tools`` that the adapter decodes) is
rejected as ``invalid_unicode``, like a raw row holding one (regen.sources.reader). Ids:

- ``{source}:{upstream id}`` for adapters in :data:`UNIQUE_ID_ADAPTERS`, whose upstream id is
  a unique key of the dataset;
- ``{source}:{upstream id}#{content hash[:8]}`` for every other row that has an upstream id
  (an id that may repeat upstream: every row carries its content, so which row is read first
  never decides which one gets the bare id — a bare id once handed out in a stream cannot be
  recalled, so no rule that suffixes only the later rows can be order-independent);
- ``{source}:h{hash of the conversation}`` when the row has no upstream id.

If a declared-unique id still repeats with different content (the declaration is wrong for
this data), the later rows get ``#{content hash[:8]}`` and a warning names the source and id:
that case alone depends on order. Identical content is left to dedup. Owns no files.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from functools import partial

from regen.core.errors import RowError
from regen.core.sample import (
    Message,
    Rejection,
    Sample,
    make_sample_id,
    normalized_message,
    stable_hash,
)
from regen.manifest import NATIVE_ADAPTERS, AdapterName, Source
from regen.sources import shapes
from regen.sources.reader import RawRow, iter_raw
from regen.sources.sourceset import SourceSet

log = logging.getLogger(__name__)

#: adapter name → row parser (regenerate-mode shapes): every adapter but the native ones
PARSERS: dict[AdapterName, shapes.Parser] = {
    "sharegpt": shapes.parse_from_value,
    "openthoughts": partial(shapes.parse_from_value, system_key="system"),
    "perfectblend": shapes.parse_from_value,
    "ultrachat": shapes.parse_messages,
    "swe_gym": shapes.parse_messages,
    "opencodereasoning": shapes.parse_input_output,
    "xlam": shapes.parse_xlam,
    "glaive": shapes.parse_glaive,
    "magicoder": shapes.parse_instruction_response,
}
#: adapters whose upstream id is a unique key of the dataset (xLAM: the row number; Kimi-native:
#: our own files); every other upstream id gets a content-hash suffix on every row
UNIQUE_ID_ADAPTERS: frozenset[AdapterName] = frozenset({"xlam", "kimi_native"})

NativeCheck = Callable[[Sample], "str | None"]


def adapt_row(source: Source, raw: RawRow) -> Sample | Rejection:
    """One raw row through ``source``'s adapter (the id is not yet disambiguated)."""
    try:
        if source.adapter in NATIVE_ADAPTERS:
            tok = shapes.parse_native(raw.data)
            sample = Sample(
                id="",
                source=source.name,
                messages=[],
                mode="native",
                turns=source.turns,
                input_ids=tok.input_ids,
                loss_mask=tok.loss_mask,
                row=raw.row,
                loc=raw.loc,
            )
            upstream = tok.upstream_id
            sample.id = (
                f"{source.name}:{str(upstream).strip()}"
                if upstream is not None
                else f"{source.name}:h{sample.content_hash}"
            )
            return _checked_text(sample, raw)
        parsed = PARSERS[source.adapter](raw.data)
        shapes.check_conversation(parsed.messages)
    except RowError as e:
        return Rejection(source.name, raw.row, e.reason, e.detail, e.field)
    upstream = parsed.upstream_id
    if upstream is not None and (not parsed.id_unique or source.adapter not in UNIQUE_ID_ADAPTERS):
        upstream = f"{str(upstream).strip()}#{_messages_hash(parsed.messages)[:8]}"
    sample = Sample(
        id=make_sample_id(source.name, upstream, parsed.messages),
        source=source.name,
        messages=parsed.messages,
        tools=parsed.tools,
        mode=source.mode,
        turns=source.turns,
        row=raw.row,
        meta=parsed.meta,
        loc=raw.loc,
    )
    return _checked_text(sample, raw)


def _checked_text(sample: Sample, raw: RawRow) -> Sample | Rejection:
    """``sample``, or its ``invalid_unicode`` rejection when some text of it cannot be encoded."""
    hit = sample.invalid_text()
    if hit is None:
        return sample
    where, code = hit
    return Rejection(sample.source, raw.row, "invalid_unicode", f"lone surrogate {code}", where)


def _messages_hash(messages: list[Message]) -> str:
    return stable_hash([normalized_message(m) for m in messages])


def iter_source(
    sources: SourceSet,
    source: Source,
    native_check: NativeCheck | None = None,
) -> Iterator[Sample | Rejection]:
    """Every row of ``source`` (one of ``sources``) as a sample with a stable id, or a
    rejection with a reason.

    ``native_check`` (from regen.sources.native) is asked about each structurally valid native row
    and returns a rejection reason or None. Raises SourceError when the source cannot be read.
    """
    seen: dict[str, str] = {}  # id → content hash of its first row
    for raw in iter_raw(sources, source):
        if isinstance(raw, Rejection):
            yield raw
            continue
        item = adapt_row(source, raw)
        if isinstance(item, Sample):
            if item.mode == "native" and native_check is not None:
                reason = native_check(item)
                if reason:
                    yield Rejection(source.name, raw.row, reason, "native check", "input_ids")
                    continue
            item.id = _disambiguate(seen, item)
        yield item


def _disambiguate(seen: dict[str, str], sample: Sample) -> str:
    h = sample.content_hash
    first = seen.setdefault(sample.id, h)
    if first == h:
        return sample.id
    new_id = f"{sample.id}#{h[:8]}"
    seen.setdefault(new_id, h)
    log.warning(
        "%s row %d: id %s is declared unique but repeats with other content; this row "
        "gets %s (order-dependent)",
        sample.source,
        sample.row,
        sample.id,
        new_id,
    )
    return new_id
