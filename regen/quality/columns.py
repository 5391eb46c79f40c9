"""The row columns a :class:`regen.quality.Quality` fills, as a pyarrow schema (docs/format.md).
Owns no files."""

from __future__ import annotations

import pyarrow as pa

#: the row columns a Quality fills (regen.store.schema.SCHEMA ends with them)
COLUMNS = pa.schema(
    [
        pa.field("quality_flags", pa.list_(pa.string()), nullable=False),
        pa.field("q_repeat_words", pa.int32(), nullable=False),
        pa.field("q_repeat_ngram", pa.int32(), nullable=False),
        pa.field("q_compression", pa.float64()),
        pa.field("q_prompt_script", pa.string()),
        pa.field("q_answer_script", pa.string()),
        pa.field("q_script_share", pa.float64()),
        pa.field("q_refusal", pa.string()),
        pa.field("q_bad_tool_calls", pa.int32(), nullable=False),
    ]
)
