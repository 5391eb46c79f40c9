"""``ChatClient``: one OpenAI-compatible endpoint, one request → one :class:`TurnResult`.

Every request goes through one transport (:class:`regen.client.transport.ChatTransport`,
aiohttp). The request body (:meth:`ChatClient.request_body`) holds the OpenAI fields SGLang's
``ChatCompletionRequest`` and vLLM's accept (tests/contract checks it against SGLang's own
model with unknown keys forbidden): model, messages, tools, temperature, top_p,
``max_completion_tokens`` (SGLang marks ``max_tokens`` deprecated), seed, and the extras
``top_k`` and ``chat_template_kwargs``. How the exact token ids are asked for and where they
arrive is the endpoint's engine profile (:mod:`regen.client.profiles`, recognised by the
endpoint check); ``sampling.token_ids`` chooses the path:

- ``stream`` (default): streamed (``stream_options.include_usage``), with the profile's id
  fields (SGLang: ``return_{input,output}_ids_in_sglext``, the ids in the ``sglext`` chunk;
  vLLM: ``return_token_ids``, the prompt ids in the first chunk and each chunk's ids);
  the time to first token stays measured;
- ``nonstream``: one JSON answer with the profile's id fields (SGLang:
  ``return_prompt_token_ids`` / ``return_token_ids``, refused with streaming; vLLM:
  ``return_token_ids``); no TTFT;
- ``local``: streamed, no ids asked (the row is rendered locally).

An endpoint of no known engine (:data:`regen.client.profiles.OPENAI`, e.g. ``transformers
serve``, which refuses unknown fields with 422) is never asked for ids and streams. Every
result names the engine and its version (:class:`regen.core.result.TurnResult`, then each row).
Failures become regen errors (:mod:`regen.client.errors`); retries follow
:class:`regen.client.retry.RetryPolicy`. The API key is read from the endpoint's
``api_key_env`` / ``api_key_file``, sent as a bearer token and never logged nor put in an error.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from regen.client.errors import not_protocol
from regen.client.profiles import EngineProfile, profile_named
from regen.client.resolved import NO_KEY as NO_KEY  # what regen.bench compares keys with
from regen.client.resolved import KeySource, ResolvedEndpoint
from regen.client.retry import FailureHook, RetryPolicy
from regen.client.stream import StreamAccumulator, UsageCounts, typed, usage_fields
from regen.client.transport import ChatTransport, Pieces
from regen.core.errors import (
    InvalidTextError,
    PermanentError,
    ServerError,
    StreamCutError,
)
from regen.core.result import LOOP, TurnResult
from regen.core.sample import ToolCall, lone_surrogate
from regen.manifest import Endpoint, Sampling
from regen.quality.config import QualityConfig
from regen.quality.loop import LoopWatch

log = logging.getLogger(__name__)

#: a request's messages or tools: OpenAI JSON objects
JsonObjects = Sequence[Mapping[str, object]]


def _reasoning_of(msg: dict[str, object], url: str) -> str | None:
    value = msg.get("reasoning_content")
    if value is None:
        value = msg.get("reasoning")
    return typed(value, str, "message.reasoning_content", url)


def _tool_calls_of(msg: dict[str, object], url: str) -> tuple[ToolCall, ...]:
    """The calls of a whole answer's message (:class:`MalformedAnswerError` for a field of
    the wrong type; arguments sent as an object are dumped)."""
    calls = []
    for i, c in enumerate(typed(msg.get("tool_calls"), list, "message.tool_calls", url) or ()):
        where = f"message.tool_calls[{i}]"
        c = typed(c, dict, where, url) or {}
        fn = typed(c.get("function"), dict, f"{where}.function", url)
        if fn is None:
            continue
        args: object = fn.get("arguments")
        if isinstance(args, dict):
            args = json.dumps(args)
        calls.append(ToolCall(
            id=typed(c.get("id"), str, f"{where}.id", url) or "",
            name=typed(fn.get("name"), str, f"{where}.function.name", url) or "",
            arguments=typed(args, str, f"{where}.function.arguments", url) or "",
        ))  # fmt: skip
    return tuple(calls)


def token_path(profile: EngineProfile, sampling: Sampling) -> str:
    """Where a client of ``profile`` with ``sampling`` takes its rows' ids from (run.json)."""
    if not profile.gives_ids or sampling.token_ids == "local":
        return "local"
    return profile.token_path(sampling.token_ids == "stream" and profile.can_stream_ids())


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """What every request of a run carries besides its messages, as the driver cut it from the
    manifest once (regen.engine.inputs): the target model, the sampling, the request timeout,
    the requests' ``chat_template_kwargs`` (``Manifest.template_kwargs``: the target family's
    thinking switch; None: ``sampling.chat_template_kwargs`` alone), the top-level fields of
    that switch (``Manifest.request_fields``) and the quality settings whose ``loop_cut``
    closes a streamed answer that loops (None: no cut)."""

    model: str
    sampling: Sampling
    timeout_s: float = 1800.0
    template_kwargs: Mapping[str, object] | None = None
    request_fields: Mapping[str, object] = field(default_factory=dict)
    quality: QualityConfig | None = None


class ChatClient:
    """Chat completions against one endpoint. One instance per endpoint (per actor).

    A run's workers make it with :meth:`of` (the endpoint resolved by the start check, the
    run's :class:`ClientSettings`); a tool talking to one server configures it by hand with
    the constructor."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        model: str,
        sampling: Sampling,
        retry: RetryPolicy | None = None,
        timeout_s: float = 1800.0,
        base_dir: str | Path = ".",
        engine: EngineProfile | str | None = None,
        engine_version: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        template_kwargs: Mapping[str, object] | None = None,
        request_fields: Mapping[str, object] | None = None,
        quality: QualityConfig | None = None,
    ) -> None:
        """``engine``: the endpoint's profile (or its name; None: SGLang); ``engine_version``
        what the server reported; the rest: :class:`ClientSettings`. The key is read from the
        endpoint's env var or file (relative to ``base_dir``)."""
        profile = engine if isinstance(engine, EngineProfile) else profile_named(engine)
        resolved = ResolvedEndpoint(url=endpoint.url, profile=profile,
                                    key=KeySource.of(endpoint, base_dir), version=engine_version,
                                    weight=endpoint.weight)  # fmt: skip
        settings = ClientSettings(model=model, sampling=sampling, timeout_s=timeout_s,
                                  template_kwargs=template_kwargs,
                                  request_fields=request_fields or {}, quality=quality)  # fmt: skip
        self._open(resolved, settings, retry, clock)

    @classmethod
    def of(
        cls,
        endpoint: ResolvedEndpoint,
        settings: ClientSettings,
        *,
        retry: RetryPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> ChatClient:
        """The client of a run's endpoint, as the start check resolved it, with the run's
        settings; ``retry``: the policy of :meth:`complete` (None: the defaults)."""
        client = cls.__new__(cls)
        client._open(endpoint, settings, retry, clock)
        return client

    def _open(
        self,
        endpoint: ResolvedEndpoint,
        settings: ClientSettings,
        retry: RetryPolicy | None,
        clock: Callable[[], float],
    ) -> None:
        self.endpoint = endpoint
        #: the URL regen writes and logs: never the user:password of the configured URL
        self.url = endpoint.public
        self.model = settings.model
        self.sampling = sampling = settings.sampling
        kwargs = settings.template_kwargs
        self.template_kwargs = dict(sampling.chat_template_kwargs if kwargs is None else kwargs)
        self.request_fields = dict(settings.request_fields)
        self.retry = retry or RetryPolicy()
        self.timeout_s = settings.timeout_s
        self.profile = endpoint.profile
        self.engine_version = endpoint.version
        #: ask for the server's ids (False: the engine has none, or token_ids is local)
        self.server_ids = self.profile.gives_ids and sampling.token_ids != "local"
        self._clock = clock
        quality = settings.quality
        cut = quality.loop_cut if quality is not None else None
        #: the loop cut of streamed answers (None: off)
        self.loop_cut = cut if cut is not None and cut.enabled else None
        self._max_ngram = quality.repeat_max_ngram if quality is not None else 64
        key = endpoint.key.read(self.url)
        self._transport = ChatTransport(endpoint.url, key, settings.timeout_s, shown=self.url)

    @property
    def streaming(self) -> bool:
        if not self.server_ids:
            return True
        return self.sampling.token_ids == "stream" and self.profile.can_stream_ids()

    @property
    def token_path(self) -> str:
        """How this client's rows get their ids (run.json's ``token_path``)."""
        return token_path(self.profile, self.sampling)

    def request_body(
        self,
        messages: JsonObjects,
        tools: JsonObjects | None,
        *,
        seed: int | None = None,
    ) -> dict[str, object]:
        """The JSON body of one ``POST /chat/completions``; ``seed`` replaces the sampling
        seed (a new attempt of a flagged sample, regen.plan.attempts)."""
        s = self.sampling
        body: dict[str, object] = {
            "model": self.model,
            "messages": messages,
            "temperature": s.temperature,
            "top_p": s.top_p,
            # not max_tokens: SGLang marks it deprecated (max_completion_tokens or max_tokens)
            "max_completion_tokens": s.max_tokens,
            "chat_template_kwargs": self.template_kwargs,
            **self.request_fields,
        }
        if s.top_k is not None:
            body["top_k"] = s.top_k
        if seed is None:
            seed = s.seed
        if seed is not None:
            body["seed"] = seed
        if tools:
            body["tools"] = tools
        if self.streaming:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if self.server_ids:
            body.update(self.profile.ids_fields(self.streaming))
        return body

    async def complete(
        self,
        messages: JsonObjects,
        tools: JsonObjects | None = None,
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
        messages: JsonObjects,
        tools: JsonObjects | None = None,
        *,
        sample_id: str,
        seed: int | None = None,
        beat: Pieces | None = None,
    ) -> TurnResult:
        """One try, no retry (``seed``: see :meth:`request_body`; ``beat``: a
        regen.engine.stall.Beat the stream's pieces are counted on). Raises a
        :class:`regen.core.errors.RequestError` subclass on failure."""
        body = self.request_body(messages, tools, seed=seed)
        start = self._clock()
        try:
            if self.streaming:
                result = await self._stream(body, start, beat)
            else:
                result = await self._whole(body, start)
            _check_text(result, self.url)
            return result
        except Exception as e:
            log.debug("sample %s: %s", sample_id, e)
            raise

    async def _stream(
        self, body: dict[str, object], start: float, beat: Pieces | None = None
    ) -> TurnResult:
        acc = StreamAccumulator(endpoint=self.url, clock=self._clock)
        watch = None
        if self.loop_cut is not None:
            watch = LoopWatch(self.loop_cut, self._max_ngram, self.sampling.max_tokens)
        await self._transport.stream(body, acc, beat, watch)
        end = self._clock()
        prompt_ids, output_ids = self.profile.stream_ids(acc) if self.server_ids else (None, None)
        if acc.looped:  # closed by regen: the usage chunk never came, the counts are regen's
            finish, tokens = LOOP, acc.tokens()
            saved = max(0, self.sampling.max_tokens - tokens)
            counts: UsageCounts = {"completion_tokens": tokens, "cut_saved": saved}
            if not (prompt_ids and output_ids):  # half the server's ids are none of them
                prompt_ids = output_ids = None
        elif acc.finish_reason is None:
            raise StreamCutError(
                f"stream from {self.url} ended without finish_reason after {acc.chunks} chunks",
                endpoint=self.url,
            )
        else:
            finish, counts = _check_finish(acc.finish_reason, self.url), acc.usage_fields()
        return TurnResult(
            content="".join(acc.content),
            reasoning="".join(acc.reasoning) if acc.reasoning else None,
            tool_calls=acc.tool_calls(),
            finish_reason=finish,
            model=acc.model or self.model,
            endpoint=self.url,
            prompt_token_ids=prompt_ids,
            output_token_ids=output_ids,
            latency_s=end - start,
            ttft_s=None if acc.first_token_at is None else acc.first_token_at - start,
            engine=self.profile.name,
            engine_version=self.engine_version,
            **counts,
        )

    async def _whole(self, body: dict[str, object], start: float) -> TurnResult:
        data = await self._transport.complete(body)
        end = self._clock()
        choices = data.get("choices")
        if not isinstance(choices, list):  # JSON, but not a chat completion: the endpoint's
            raise not_protocol(self.url, "JSON without choices", "application/json",
                               json.dumps(data, default=str)[:1000])  # fmt: skip
        if not choices or not isinstance(choices[0], dict):
            raise PermanentError(f"response from {self.url} has no choices", endpoint=self.url)
        choice = choices[0]
        url = self.url
        msg = typed(choice.get("message"), dict, "message", url) or {}
        finish = typed(choice.get("finish_reason"), str, "finish_reason", url)
        prompt_ids, output_ids = self.profile.whole_ids(data, choice)
        return TurnResult(
            content=typed(msg.get("content"), str, "message.content", url) or "",
            reasoning=_reasoning_of(msg, url),
            tool_calls=_tool_calls_of(msg, url),
            finish_reason=_check_finish(finish, url),
            model=typed(data.get("model"), str, "model", url) or self.model,
            endpoint=url,
            prompt_token_ids=prompt_ids,
            output_token_ids=output_ids,
            latency_s=end - start,
            ttft_s=None,
            engine=self.profile.name,
            engine_version=self.engine_version,
            **usage_fields(data.get("usage"), url),
        )

    async def aclose(self) -> None:
        await self._transport.aclose()


def _check_text(result: TurnResult, url: str) -> None:
    """An answer whose text is not valid Unicode (a lone surrogate) cannot become a row: the
    sample fails with :class:`InvalidTextError` naming the field (regen.core.sample's rule)."""
    fields = [("content", result.content), ("reasoning", result.reasoning or "")]
    for i, c in enumerate(result.tool_calls):
        fields += [(f"tool_calls[{i}].name", c.name), (f"tool_calls[{i}].arguments", c.arguments),
                   (f"tool_calls[{i}].id", c.id)]  # fmt: skip
    for name, text in fields:
        if (bad := lone_surrogate(text)) is not None:
            raise InvalidTextError(
                f"answer from {url}: field {name!r}: invalid_unicode (lone surrogate {bad})",
                endpoint=url,
            )


#: finish reasons of a turn the model really finished (or was cut by max_tokens)
FINISHED = frozenset({"stop", "length", "tool_calls"})


def _check_finish(reason: str | None, url: str) -> str:
    """A turn is stored only when it finished: a missing reason or SGLang's ``abort`` (the server
    dropped the request, e.g. under memory pressure) is transient, anything else unknown permanent.
    """
    if reason is not None and reason in FINISHED:
        return reason
    if reason is None or reason == "abort":
        raise ServerError(f"{url} ended the turn with finish_reason={reason!r}", endpoint=url)
    raise PermanentError(f"{url} ended the turn with finish_reason={reason!r}", endpoint=url)
