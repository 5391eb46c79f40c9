"""``ChatClient``: one OpenAI-compatible endpoint, one request → one :class:`TurnResult`.

Streaming by default (``stream_options.include_usage``); non-streaming when the manifest asks
for server token ids (``sampling.server_token_ids``: sends SGLang's ``return_prompt_token_ids``
and ``return_token_ids`` and reads the ids back). Sampling and ``chat_template_kwargs`` go in
``extra_body``. The HTTP client comes from an injectable factory ``(base_url, api_key,
timeout_s) -> AsyncOpenAI``; tests hand in a real ``AsyncOpenAI`` over an ``httpx2.MockTransport``.
Streams are read as raw SSE lines (``with_streaming_response``; see :mod:`regen.client.stream`).
Failures become regen errors (see :mod:`regen.client.errors`); retries follow
:class:`regen.client.retry.RetryPolicy`. The API key is read from the endpoint's
``api_key_env`` / ``api_key_file`` and is never logged nor put in an error.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from regen.client.errors import map_error
from regen.client.raw import RawStreamer
from regen.client.retry import FailureHook, RetryPolicy
from regen.client.stream import StreamAccumulator, usage_fields
from regen.errors import ConfigError, PermanentError, RegenError, ServerError, StreamCutError
from regen.manifest import Endpoint, Manifest, Sampling, public_url
from regen.result import TurnResult
from regen.sample import ToolCall

log = logging.getLogger(__name__)

#: the placeholder key sent to servers that need none (the SDK insists on a non-empty key)
NO_KEY = "EMPTY"

#: (base_url, api_key, timeout_s) -> an ``openai.AsyncOpenAI``-like client
ClientFactory = Callable[[str, str, float], Any]


def default_client_factory(base_url: str, api_key: str, timeout_s: float) -> Any:
    """An ``openai.AsyncOpenAI`` with SDK retries off (regen retries) and a stall timeout."""
    import httpx2
    import openai

    timeout = httpx2.Timeout(timeout_s, connect=min(timeout_s, 30.0))
    limits = httpx2.Limits(max_connections=4096, max_keepalive_connections=1024)
    return openai.AsyncOpenAI(
        base_url=base_url,
        api_key=api_key,
        timeout=timeout,
        max_retries=0,
        http_client=httpx2.AsyncClient(timeout=timeout, limits=limits),
    )


def resolve_api_key(endpoint: Endpoint, base_dir: str | Path = ".") -> str:
    """The endpoint's key from its env var or file; :data:`NO_KEY` when it names neither."""
    if endpoint.api_key_env:
        value = os.environ.get(endpoint.api_key_env)
        if not value:
            raise ConfigError(
                f"endpoint {endpoint.url}: environment variable {endpoint.api_key_env} "
                "(api_key_env) is not set",
                field="endpoints.api_key_env",
            )
        return value.strip()
    if endpoint.api_key_file:
        p = Path(endpoint.api_key_file).expanduser()
        if not p.is_absolute():
            p = Path(base_dir) / p
        try:
            value = p.read_text(encoding="utf-8").strip()
        except OSError as e:
            raise ConfigError(
                f"endpoint {endpoint.url}: cannot read api_key_file {p}: {e.strerror or e}",
                field="endpoints.api_key_file",
            ) from None
        if not value:
            raise ConfigError(
                f"endpoint {endpoint.url}: api_key_file {p} is empty",
                field="endpoints.api_key_file",
            )
        return value
    return NO_KEY


def _extra(obj: Any, name: str) -> Any:
    """A field the SDK does not type (``reasoning_content``, ``prompt_token_ids``, ...)."""
    if obj is None:
        return None
    value = getattr(obj, name, None)
    if value is None:
        extra = getattr(obj, "model_extra", None) or {}
        value = extra.get(name)
    return value


def _reasoning_of(obj: Any) -> str | None:
    value = _extra(obj, "reasoning_content")
    if value is None:
        value = _extra(obj, "reasoning")
    return value if isinstance(value, str) else None


def _usage_of(usage: Any) -> dict[str, int | None]:
    """Usage fields of an SDK usage object (non-streaming path)."""
    if usage is None:
        return {}
    dump = usage.model_dump() if hasattr(usage, "model_dump") else dict(usage)
    return usage_fields(dump)


def _id_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(x, int) for x in value):
        return list(value)
    return None


class ChatClient:
    """Chat completions against one endpoint. One instance per endpoint (per actor)."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        model: str,
        sampling: Sampling,
        retry: RetryPolicy | None = None,
        timeout_s: float = 1800.0,
        client_factory: ClientFactory | None = None,
        base_dir: str | Path = ".",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint = endpoint
        #: the URL regen writes and logs: never the user:password of the configured URL
        self.url = public_url(endpoint.url)
        self.model = model
        self.sampling = sampling
        self.retry = retry or RetryPolicy()
        self.timeout_s = timeout_s
        self._clock = clock
        factory = client_factory or default_client_factory
        key = resolve_api_key(endpoint, base_dir)
        self._client = factory(endpoint.url, key, timeout_s)
        #: streaming fast path (aiohttp, raw SSE); an injected SDK client keeps the SDK path
        self._raw = RawStreamer(endpoint.url, key, timeout_s) if client_factory is None else None

    @classmethod
    def from_manifest(
        cls,
        manifest: Manifest,
        endpoint: Endpoint,
        *,
        client_factory: ClientFactory | None = None,
        retry: RetryPolicy | None = None,
    ) -> ChatClient:
        return cls(
            endpoint,
            model=manifest.target.model,
            sampling=manifest.sampling,
            retry=retry or RetryPolicy.from_engine(manifest.engine),
            timeout_s=manifest.engine.request_timeout_s,
            client_factory=client_factory,
            base_dir=manifest.base_dir,
        )

    @property
    def streaming(self) -> bool:
        return not self.sampling.server_token_ids

    def request_kwargs(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for one request."""
        s = self.sampling
        extra: dict[str, Any] = {"chat_template_kwargs": s.template_kwargs()}
        if s.top_k is not None:
            extra["top_k"] = s.top_k
        kw: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_tokens": s.max_tokens,
        }
        if s.seed is not None:
            kw["seed"] = s.seed
        if tools:
            kw["tools"] = tools
        if self.streaming:
            kw["stream"] = True
            kw["stream_options"] = {"include_usage": True}
        else:
            extra["return_prompt_token_ids"] = True
            extra["return_token_ids"] = True
        kw["extra_body"] = extra
        return kw

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        sample_id: str,
        on_failure: FailureHook | None = None,
    ) -> TurnResult:
        """One assistant turn, retried per the policy; ``attempts`` counts every try."""

        async def attempt(n: int) -> TurnResult:
            return await self.complete_once(messages, tools, sample_id=sample_id)

        result, attempts = await self.retry.call(attempt, on_failure=on_failure)
        result.attempts = attempts
        return result

    async def complete_once(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        sample_id: str,
    ) -> TurnResult:
        """One try, no retry. Raises a :class:`regen.errors.RequestError` subclass on failure."""
        kw = self.request_kwargs(messages, tools)
        start = self._clock()
        if self.streaming:
            return await self._stream(kw, start, sample_id)
        return await self._whole(kw, start, sample_id)

    async def _stream(self, kw: dict[str, Any], start: float, sample_id: str) -> TurnResult:
        acc = StreamAccumulator(endpoint=self.url, clock=self._clock)
        try:
            if self._raw is not None:
                await self._raw.stream(kw, acc)
            else:
                await self._stream_sdk(kw, acc)
        except RegenError:
            raise
        except Exception as e:
            raise self._mapped(e, sample_id, received=acc.chunks > 0) from None
        end = self._clock()
        return self._streamed_result(acc, start, end)

    async def _stream_sdk(self, kw: dict[str, Any], acc: StreamAccumulator) -> None:
        create = self._client.chat.completions.with_streaming_response.create
        async with create(**kw) as resp:
            async for line in resp.iter_lines():
                acc.feed_line(line)
                if acc.done:
                    break

    def _streamed_result(self, acc: StreamAccumulator, start: float, end: float) -> TurnResult:
        if acc.finish_reason is None:
            raise StreamCutError(
                f"stream from {self.url} ended without finish_reason after {acc.chunks} chunks",
                endpoint=self.url,
            )
        _check_finish(acc.finish_reason, self.url)
        return TurnResult(
            content="".join(acc.content),
            reasoning="".join(acc.reasoning) if acc.reasoning else None,
            tool_calls=acc.tool_calls(),
            finish_reason=acc.finish_reason,
            model=acc.model or self.model,
            endpoint=self.url,
            latency_s=end - start,
            ttft_s=None if acc.first_token_at is None else acc.first_token_at - start,
            **acc.usage_fields(),
        )

    async def _whole(self, kw: dict[str, Any], start: float, sample_id: str) -> TurnResult:
        try:
            resp = await self._client.chat.completions.create(**kw)
        except Exception as e:
            raise self._mapped(e, sample_id) from None
        end = self._clock()
        if not resp.choices:
            raise PermanentError(f"response from {self.url} has no choices", endpoint=self.url)
        choice = resp.choices[0]
        msg = choice.message
        calls = tuple(
            ToolCall(id=c.id or "", name=c.function.name, arguments=c.function.arguments or "")
            for c in (msg.tool_calls or ())
            if getattr(c, "function", None) is not None
        )
        prompt_ids = _id_list(_extra(choice, "prompt_token_ids")) or _id_list(
            _extra(resp, "prompt_token_ids")
        )
        output_ids = (
            _id_list(_extra(choice, "token_ids"))
            or _id_list(_extra(choice, "response_token_ids"))
            or _id_list(_extra(choice, "output_token_ids"))
            or _id_list(_extra(msg, "token_ids"))
        )
        return TurnResult(
            content=msg.content or "",
            reasoning=_reasoning_of(msg),
            tool_calls=calls,
            finish_reason=_check_finish(choice.finish_reason, self.url),
            model=resp.model or self.model,
            endpoint=self.url,
            prompt_token_ids=prompt_ids,
            output_token_ids=output_ids,
            latency_s=end - start,
            ttft_s=None,
            **_usage_of(resp.usage),
        )

    def _mapped(self, exc: BaseException, sample_id: str, *, received: bool = False) -> Exception:
        err = map_error(exc, endpoint=self.url, received=received)
        log.debug("sample %s: %s", sample_id, err)
        return err

    async def aclose(self) -> None:
        if self._raw is not None:
            await self._raw.aclose()
        close = getattr(self._client, "close", None)
        if close is not None:
            await close()


#: finish reasons of a turn the model really finished (or was cut by max_tokens)
FINISHED = frozenset({"stop", "length", "tool_calls"})


def _check_finish(reason: str | None, url: str) -> str:
    """A turn is stored only when it finished: a missing reason or SGLang's ``abort`` (the server
    dropped the request, e.g. under memory pressure) is transient, anything else unknown permanent.
    """
    if reason in FINISHED:
        return reason  # type: ignore[return-value]
    if reason is None or reason == "abort":
        raise ServerError(f"{url} ended the turn with finish_reason={reason!r}", endpoint=url)
    raise PermanentError(f"{url} ended the turn with finish_reason={reason!r}", endpoint=url)
