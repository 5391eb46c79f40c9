"""Prometheus text exposition (``GET /metrics``), parsed into samples: what vLLM (``vllm:``)
and SGLang (``sglang:``, with ``--enable-metrics``) expose there.

Only the sample lines are read (``name{label="v",...} value [timestamp]``); ``# HELP`` /
``# TYPE`` comments are skipped. :func:`counter_total` sums a counter over its label sets
(vLLM labels every series with ``engine`` and ``model_name``; one server with several engine
cores has one series each). Owns no files.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(slots=True, frozen=True)
class MetricSample:
    """One sample line."""

    name: str
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)


def parse_metrics(text: str) -> list[MetricSample]:
    """Every sample line of a Prometheus text page (lines that do not parse are skipped)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in
                  _LABEL.findall(m.group(3) or "")}  # fmt: skip
        out.append(MetricSample(m.group(1), value, labels))
    return out


def counter_total(samples: Iterable[MetricSample], name: str, **labels: str) -> float | None:
    """The sum of ``name`` over its series whose labels include ``labels`` (None: no series).

    ``name`` is the counter's exposed name (``vllm:spec_decode_num_drafts_total``)."""
    total = None
    for s in samples:
        matches = s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        if matches and math.isfinite(s.value):
            total = (total or 0.0) + s.value
    return total


def label_values(samples: Iterable[MetricSample], name: str, label: str) -> set[str]:
    """The values ``label`` takes on the series of ``name``."""
    return {s.labels[label] for s in samples if s.name == name and label in s.labels}


def has_prefix(samples: Iterable[MetricSample], prefix: str) -> bool:
    """Whether any sample's name starts with ``prefix`` (``vllm:``: a vLLM server)."""
    return any(s.name.startswith(prefix) for s in samples)
