"""Sources: read the manifest's datasets and turn their rows into samples.

    sourceset.py what reading them takes, cut once from the manifest (``source_set``)
    reader.py    raw rows from a local JSONL/Parquet file or a hub dataset
    shapes.py    the seven row-shape parsers (CONTRACTS §5) and role mapping
    adapters.py  the adapters by manifest name (``regen.manifest.AdapterName``); stable ids
    neardup.py   near-duplicate prompts: MinHash signatures + a compact LSH index
    stream.py    all sources → filters → dedup → limits, with counts (``read_samples``)

Owns no files.
"""

from regen.sources.adapters import NATIVE_ADAPTERS, PARSERS, NativeCheck, adapt_row, iter_source
from regen.sources.neardup import NearDuplicates, NearMatch, NearReport
from regen.sources.reader import RawRow, iter_raw
from regen.sources.sourceset import NativeTarget, SourceSet, source_set
from regen.sources.stream import ReadStats, SourceStats, filter_reason, read_samples

__all__ = [
    "NATIVE_ADAPTERS",
    "PARSERS",
    "NativeCheck",
    "NativeTarget",
    "NearDuplicates",
    "NearMatch",
    "NearReport",
    "RawRow",
    "ReadStats",
    "SourceSet",
    "SourceStats",
    "adapt_row",
    "filter_reason",
    "iter_raw",
    "iter_source",
    "read_samples",
    "source_set",
]
