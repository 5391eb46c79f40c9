"""Engine profiles: what each kind of OpenAI-compatible server needs and gives, in one place.

regen talks to SGLang (production), vLLM (beside it) and any other OpenAI-compatible server.
They differ in how a request asks for the exact token ids, where those ids arrive, which field
carries the reasoning, how the server says who it is, and what it exposes about speculative
decoding. Each difference is a method or attribute of one :class:`EngineProfile` subclass (one
module each: :mod:`.sglang`, :mod:`.vllm`, :mod:`.openai`); the client, the endpoint check,
``verify-server`` and the bench ask the profile and never test an engine's name themselves.
docs/engines.md has the table, field by field, with where each fact was read.

Which profile an endpoint gets is decided at start (:func:`regen.client.endpoints.check_endpoint`):
SGLang answers ``/server_info``; vLLM answers ``/version`` and serves ``vllm:`` metrics; anything
else is :data:`OPENAI` (no exact ids: the row is rendered locally, with today's checks). Owns no
files.
"""

from __future__ import annotations

from regen.client.http import JsonGetter
from regen.client.profiles.base import EngineProfile, Identity, Ids, TokenPath
from regen.client.profiles.openai import OPENAI, OpenAIProfile
from regen.client.profiles.sglang import SGLANG, SGLangProfile
from regen.client.profiles.vllm import VLLM, VLLMProfile

#: every profile by its name (the ``engine`` recorded in run.json and in each row)
PROFILES: dict[str, EngineProfile] = {p.name: p for p in (SGLANG, VLLM, OPENAI)}


#: the order engines are recognised in (the first whose own endpoints answer wins)
DETECTION_ORDER: tuple[EngineProfile, ...] = (SGLANG, VLLM)


async def identify(http: JsonGetter, root: str, headers: dict[str, str]) -> Identity:
    """Who the server at ``root`` is: the first profile of :data:`DETECTION_ORDER` that
    recognises it, else :data:`OPENAI` (an OpenAI-compatible server of no known engine)."""
    for profile in DETECTION_ORDER:
        found = await profile.identify(http, root, headers)
        if found is not None:
            return found
    return Identity(engine=OPENAI.name)


def profile_named(name: str | None) -> EngineProfile:
    """The profile called ``name`` (None: SGLang, the production engine)."""
    if name is None:
        return SGLANG
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r} (known: {', '.join(PROFILES)})") from None


__all__ = [
    "DETECTION_ORDER",
    "OPENAI",
    "PROFILES",
    "SGLANG",
    "VLLM",
    "EngineProfile",
    "Identity",
    "Ids",
    "OpenAIProfile",
    "SGLangProfile",
    "TokenPath",
    "VLLMProfile",
    "identify",
    "profile_named",
]
