"""The model families regen knows, and which one a target is.

One module per family (:mod:`regen.targets.kimi`, ...) holds everything that family decides
(:class:`regen.targets.family.Family`); nothing outside this package names a family's tokens.
docs/targets.md has the table and how to add a family.

Reads, never writes: a target's tokenizer directory (``tokenizer_config.json``,
``chat_template.jinja``, ``tokenizer.json``, ``special_tokens_map.json``, ``config.json``) to
recognise its family (:func:`recognise_dir`): the family modules in :data:`FAMILIES`' order (the
newest first: each tells itself from the older family it shares tokens with, by its template or
``model_type``), then a folder that describes its own format (a ``response_template``,
:mod:`regen.targets.response_template`). A manifest's ``target.family`` names the family where
the folder says nothing, and is refused when it contradicts what the folder shows
(:func:`target_family`); a target of no known family still runs where the server returns its ids.
"""

from __future__ import annotations

import json
import logging
import os
from functools import lru_cache
from pathlib import Path

from regen.core.errors import ConfigError
from regen.targets.deepseek import DEEPSEEK_V3
from regen.targets.deepseek_v4 import DEEPSEEK_V4
from regen.targets.deepseek_v32 import DEEPSEEK_V32
from regen.targets.deepseek_v41 import DEEPSEEK_V41
from regen.targets.family import Family, Parsers, TokenizerFacts
from regen.targets.gemma4 import GEMMA4
from regen.targets.glm import GLM45
from regen.targets.glm47 import GLM47
from regen.targets.gpt_oss import GPT_OSS
from regen.targets.kimi import KIMI
from regen.targets.kimi_k3 import KIMI_K3
from regen.targets.llama import LLAMA3
from regen.targets.minimax_m2 import MINIMAX_M2
from regen.targets.minimax_m3 import MINIMAX_M3
from regen.targets.mistral import MISTRAL
from regen.targets.qwen3 import QWEN3
from regen.targets.qwen3_coder import QWEN3_CODER
from regen.targets.response_template import NAME as RESPONSE_TEMPLATE
from regen.targets.response_template import from_facts

log = logging.getLogger(__name__)

#: every known family by name, in the order recognition tries them: the most specific first,
#: and of two that share their tokens the newer first (K3 before K2, GLM-4.7 before GLM-4.5,
#: DeepSeek-V4.1, V4, V3.2 before V3.1, MiniMax-M3 before M2: each newer one tells itself apart
#: by its template, its tokens or its model type)
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        KIMI_K3, KIMI, QWEN3_CODER, QWEN3, GLM47, GLM45, DEEPSEEK_V41, DEEPSEEK_V4,
        DEEPSEEK_V32, DEEPSEEK_V3, MINIMAX_M3, MINIMAX_M2, GEMMA4, MISTRAL, LLAMA3, GPT_OSS,
    )
}  # fmt: skip
#: ``target.family`` for a target of no known family (server ids only)
UNKNOWN = "unknown"
#: the family of every run made before families existed: a manifest of this family leaves it
#: out of its fingerprint, so those runs resume
FIRST_FAMILY = KIMI.name

__all__ = [
    "FAMILIES", "FIRST_FAMILY", "RESPONSE_TEMPLATE", "UNKNOWN", "Family", "Parsers",
    "TokenizerFacts", "family_named", "recognise", "recognise_dir", "target_family", "valid_name",
]  # fmt: skip


def family_named(name: str | None) -> Family | None:
    """The family module called ``name``; None for :data:`UNKNOWN` or None; ConfigError
    otherwise (:data:`RESPONSE_TEMPLATE` is read from a folder: :func:`target_family`)."""
    try:
        valid_name(name)
    except ValueError as e:
        raise ConfigError(f"target.family: {e}", field="target.family") from None
    if name == RESPONSE_TEMPLATE:
        raise ConfigError(
            "target.family: response_template is read from the target's "
            "tokenizer folder, not at hand here",
            field="target.family",
        )
    return None if name is None or name == UNKNOWN else FAMILIES[name]


def valid_name(name: str | None) -> str | None:
    """``name`` when it names a family (or is None / :data:`UNKNOWN` /
    :data:`RESPONSE_TEMPLATE`); ValueError naming the known families otherwise (a pydantic
    validator of a ``family`` field)."""
    if name is None or name in (UNKNOWN, RESPONSE_TEMPLATE) or name in FAMILIES:
        return name
    known = ", ".join([*FAMILIES, RESPONSE_TEMPLATE, UNKNOWN])
    raise ValueError(f"{name!r} is not a known family ({known})")


def target_family(name: str | None, tokenizer_dir: str | Path) -> Family | None:
    """A target's family: the one its tokenizer directory is, which ``name`` must not
    contradict (ConfigError naming both); where the folder shows none, the one ``name`` gives
    (None: unknown). ``name`` :data:`UNKNOWN` asks for none: never refused."""
    if name == UNKNOWN:
        return None
    found = recognise_dir(tokenizer_dir)
    if name is None:
        if found is None:
            log.debug("%s: no known model family", tokenizer_dir)
        return found
    if found is not None and found.name != name:
        raise ConfigError(f"target.family: {name!r} contradicts the tokenizer {tokenizer_dir}, "
                          f"which is {found.title} ({found.name!r}); set {found.name!r} or "
                          "leave target.family unset", field="target.family")  # fmt: skip
    if found is None and name == RESPONSE_TEMPLATE:
        raise ConfigError(f"target.family: response_template, but {tokenizer_dir} ships no "
                          "response_template the engines serve", field="target.family")  # fmt: skip
    return found if found is not None else family_named(name)


def recognise(facts: TokenizerFacts) -> Family | None:
    """The first family module that takes the tokenizer, else the family its
    ``response_template`` describes (None: no known family). Where both exist, the module
    takes precedence (its assembly writes the model's exact text) and says so once."""
    for fam in FAMILIES.values():
        if fam.recognises(facts):
            if facts.response_template is not None:
                _precedence(fam.name)
            return fam
    return from_facts(facts)


@lru_cache(maxsize=64)
def _precedence(name: str) -> None:
    log.info("the tokenizer ships a response_template, but regen's %s module describes its "
             "format (exact whitespace, known parser names): the module is used", name)  # fmt: skip


def recognise_dir(path: str | os.PathLike[str]) -> Family | None:
    """The family of the tokenizer directory ``path`` (None: no known family, or no folder)."""
    return recognise(read_facts(str(path)))


@lru_cache(maxsize=16)
def read_facts(path: str) -> TokenizerFacts:
    """What recognition reads of a tokenizer directory (cached per path for one process)."""
    folder = Path(path)
    config = _json(folder / "tokenizer_config.json")
    tokens: set[str] = set()
    decoder = config.get("added_tokens_decoder")
    for spec in decoder.values() if isinstance(decoder, dict) else ():
        if isinstance(spec, dict) and isinstance(spec.get("content"), str):
            tokens.add(spec["content"])
    added = _json(folder / "tokenizer.json").get("added_tokens")
    for spec in added if isinstance(added, list) else ():
        if isinstance(spec, dict) and isinstance(spec.get("content"), str):
            tokens.add(spec["content"])
    for value in _json(folder / "special_tokens_map.json").values():
        tokens.update(_token_texts(value))
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        tokens.update(_token_texts(config.get(key)))
    template = _template(config.get("chat_template"))
    jinja = folder / "chat_template.jinja"
    if not template and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    model_type = _json(folder / "config.json").get("model_type")
    response = config.get("response_template")
    return TokenizerFacts(
        chat_template=template,
        tokens=frozenset(tokens),
        model_type=model_type if isinstance(model_type, str) else None,
        response_template=response if isinstance(response, dict) else None,
    )


def _json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _token_texts(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return [value["content"]]
    if isinstance(value, list):
        return [t for v in value for t in _token_texts(v)]
    return []


def _template(value: object) -> str:
    """The default chat template of a ``chat_template`` entry (a string or named list)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        found = named.get("default") or next(iter(named.values()), None)
        return found if isinstance(found, str) else ""
    return ""
