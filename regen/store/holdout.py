"""The held-out prompts: the file ``regen export --holdout N`` writes and ``regen bench`` reads.

``holdout.jsonl`` (written by ``regen export --holdout N`` next to the training shards, in
``RUN_DIR/export/``; ``regen bench --prompts FILE`` reads any file of the same format) holds
one JSON object per line, one request each::

    {"source": "xlam",                      manifest source name
     "sample_id": "xlam:123",               the sample's stable id (regen.core.sample.Sample.id)
     "turn": 0,                             which assistant turn the request asks for
     "messages": [{"role": ..., ...}],      OpenAI chat messages sent as they are (ends with
                                            the user or tool message the answer follows)
     "tools": [{...}] | null}               OpenAI tool declarations, or null

Unknown keys are refused (a misspelt field would otherwise do nothing). Blank lines are
skipped; a bad line fails with the file, the line number and the field. Owns no files beyond
reading the one it is given (:func:`write_prompts` writes one for the export and the tests).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from regen.core.errors import ConfigError
from regen.core.sample import ROLES
from regen.manifest import config_error
from regen.store.layout import EXPORT_DIR, HOLDOUT

#: the held-out prompts' file name inside an export directory (the layout's)
HOLDOUT_FILE = HOLDOUT


class BenchPrompt(BaseModel):
    """One held-out request (one line of ``holdout.jsonl``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: manifest source name
    source: str = Field(min_length=1)
    #: the sample's stable id
    sample_id: str = Field(min_length=1)
    #: which assistant turn of the sample the request asks for (0 = the first)
    turn: int = Field(0, ge=0)
    #: OpenAI chat messages, sent as they are
    messages: list[dict[str, object]] = Field(min_length=1)
    #: OpenAI tool declarations
    tools: list[dict[str, object]] | None = None

    @field_validator("messages")
    @classmethod
    def _messages(cls, v: list[dict[str, object]]) -> list[dict[str, object]]:
        for i, m in enumerate(v):
            if m.get("role") not in ROLES:
                raise ValueError(
                    f"message {i}: role {m.get('role')!r} is not one of {sorted(ROLES)}"
                )
        if v[-1].get("role") == "assistant":
            raise ValueError("the last message is an assistant turn: nothing left to answer")
        return v

    @property
    def has_tools(self) -> bool:
        return bool(self.tools)


def read_prompts(path: str | Path) -> list[BenchPrompt]:
    """Every prompt of a ``holdout.jsonl``-format file, in file order."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read prompts file {p}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"prompts file {p} is not UTF-8") from None
    out: list[BenchPrompt] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}:{n}: not JSON ({e.msg})") from None
        try:
            out.append(BenchPrompt.model_validate(data))
        except ValidationError as e:
            raise config_error(e, f"{p}:{n}") from None
    if not out:
        raise ConfigError(f"prompts file {p} has no prompts")
    return out


def prompt_line(prompt: BenchPrompt) -> str:
    """One line of a ``holdout.jsonl``-format file (no newline)."""
    return json.dumps(prompt.model_dump(mode="json"), ensure_ascii=False)


def write_prompts(path: str | Path, prompts: Iterable[BenchPrompt]) -> int:
    """Write prompts in the ``holdout.jsonl`` format (temp name, then rename); returns the count."""
    p = Path(path)
    tmp = p.with_name(f".tmp-{p.name}")
    n = 0
    with tmp.open("w", encoding="utf-8") as f:
        for prompt in prompts:
            f.write(prompt_line(prompt) + "\n")
            n += 1
    tmp.replace(p)
    return n


def holdout_path(run_dir: str | Path) -> Path:
    """``RUN_DIR/export/holdout.jsonl``, or ``RUN_DIR/holdout.jsonl`` when given the export."""
    root = Path(run_dir)
    for candidate in (root / EXPORT_DIR / HOLDOUT_FILE, root / HOLDOUT_FILE):
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"{root}: no {EXPORT_DIR}/{HOLDOUT_FILE}; export the run with held-out prompts "
        f"(regen export {root} --out {root / EXPORT_DIR} --holdout N) or pass --prompts FILE"
    )
