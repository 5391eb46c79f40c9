"""Any other OpenAI-compatible server (``transformers serve``, a gateway, ...): no exact ids.

Nothing beyond the OpenAI fields is sent (``transformers serve`` refuses unknown fields with
HTTP 422), the answer is streamed, and each row is rendered and tokenized locally with the
checks of ``token_check`` (regen.engine.rows). Reasoning is read from either field a server uses.
"""

from __future__ import annotations

from regen.client.profiles.base import EngineProfile


class OpenAIProfile(EngineProfile):
    name = "openai"


OPENAI = OpenAIProfile()
