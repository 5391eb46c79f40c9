"""The one error taxonomy of regen.

Every failure regen raises on purpose is a subclass of :class:`RegenError`. Callers decide by
type (and, for HTTP, by status code carried on the exception), never by message text.

    RegenError
    ├── ConfigError                 bad manifest / train config / CLI override (names the field)
    ├── SourceError                 a source cannot be read at all (names the source)
    ├── RowError                    one input row is unusable (source, row, field, reason)
    ├── TemplateError               chat template / tokenizer problem
    │   └── ArgumentsError          history tool-call arguments the engine refuses
    ├── RunDirError                 run directory problems
    │   ├── LockHeldError           another live run holds the directory
    │   └── FingerprintMismatchError  the directory was made by a different manifest
    ├── EndpointError               no usable endpoint at start (names each and why)
    ├── MetricsPageError            a server's /metrics page is not Prometheus text (advice
    │                               only: a scrape that meets it is reported, never fatal)
    ├── RequestError                one request to an endpoint failed
    │   ├── TransientError          retried: connection, timeout, 408/429/5xx, stream cut
    │   │   ├── ConnectError
    │   │   ├── RequestTimeoutError
    │   │   ├── OverloadedError     503: the server is busy, not sick (carries retry_after)
    │   │   │   └── RateLimitedError  429 (a gateway's way of saying the same)
    │   │   ├── ServerError         (other 5xx, 408)
    │   │   └── StreamCutError      stream ended before finish_reason
    │   ├── EndpointFaultError      about the endpoint, never the sample: 401, 403, 404, 405, 407;
    │   │   │                       the endpoint leaves rotation, the request goes elsewhere
    │   │   └── NotProtocolError    an answer that is not the protocol (HTML, JSON without
    │   │                           choices, HTTP 200 with another content type)
    │   └── PermanentError          recorded, not retried: other 4xx, context too long
    │       ├── ContextLengthError
    │       ├── MalformedAnswerError  an answer with a field of the wrong type
    │       └── InvalidTextError    an answer whose text is not valid Unicode
    ├── RunIncompleteError          the session stopped with samples left for the next run
    │   └── NoEndpointLeftError     every endpoint left rotation for an endpoint-wide fault
    └── TrapError                   a training/serving configuration that silently ruins a draft

The text of every regen error is writable: a lone surrogate the server or a row put into a
message is shown as U+FFFD (:func:`regen.core.sample.scrub`), so logging, ``failures/`` and
``progress.json`` never fail on it.
"""

from __future__ import annotations

from regen.core.sample import scrub


class RegenError(Exception):
    """Base of every error regen raises on purpose."""

    #: short machine-readable class name used in counters and failure records
    kind: str = "error"

    def __str__(self) -> str:
        return scrub(super().__str__())


class ConfigError(RegenError):
    """A configuration value is invalid. ``field`` is the dotted path of the offending field."""

    kind = "config"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SourceError(RegenError):
    """A whole source cannot be read (unreachable hub id, missing file, no network)."""

    kind = "source"

    def __init__(self, source: str, message: str) -> None:
        super().__init__(f"source {source!r}: {message}")
        self.source = source


class RowError(RegenError):
    """One input row is unusable. ``reason`` is a short stable code used for counting."""

    kind = "row"

    def __init__(self, reason: str, detail: str = "", *, field: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.field = field


class TemplateError(RegenError):
    """The chat template or tokenizer cannot produce a training row."""

    kind = "template"


class ArgumentsError(TemplateError):
    """A history tool call's arguments the answering engine refuses (SGLang: not a JSON
    object); the request, hence the sample, fails, never the run (regen.template.prepare)."""


class RunDirError(RegenError):
    """The run directory cannot be used as asked."""

    kind = "rundir"


class LockHeldError(RunDirError):
    """Another live run holds the run directory's lock."""

    kind = "lock_held"


class FingerprintMismatchError(RunDirError):
    """The run directory was made by a different manifest/model/sampling/template."""

    kind = "fingerprint_mismatch"


class EndpointError(RegenError):
    """No endpoint is usable at start."""

    kind = "endpoint"


class MetricsPageError(RegenError):
    """A server's ``/metrics`` page is not Prometheus text (the parser's reason in the
    message). Caught where pages are read: a server's metrics never stop a run."""

    kind = "metrics_page"


class RequestError(RegenError):
    """One request to an endpoint failed."""

    kind = "request"

    def __init__(
        self, message: str, *, status: int | None = None, endpoint: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.endpoint = endpoint


class TransientError(RequestError):
    """Worth retrying: the same request may succeed later."""

    kind = "transient"


class ConnectError(TransientError):
    kind = "connect"


class RequestTimeoutError(TransientError):
    kind = "timeout"


class StallError(RequestTimeoutError):
    """A stream (or every request of an endpoint) sent no byte for the stall timeout: cancelled
    long before the request timeout, and retried on another endpoint (regen.engine.stall)."""

    kind = "stall"


class OverloadedError(TransientError):
    """The server is busy, not sick: HTTP 503 (SGLang answers a full queue, a request that
    waited or ran past its timeout, and a request retracted under memory pressure with 503,
    before the stream or inside it after HTTP 200). A back-off signal for the in-flight limit;
    it never takes an endpoint out of rotation by itself. ``retry_after``: the server's
    Retry-After in seconds, when it sent one (SGLang never does)."""

    kind = "overloaded"

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        status: int | None = None,
        endpoint: str | None = None,
    ) -> None:
        super().__init__(message, status=status, endpoint=endpoint)
        self.retry_after = retry_after


class RateLimitedError(OverloadedError):
    """HTTP 429 (gateways and other servers; SGLang never sends it): an overload signal too."""

    kind = "rate_limited"


class ServerError(TransientError):
    """HTTP 5xx other than 503, or 408."""

    kind = "server_error"

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        status: int | None = None,
        endpoint: str | None = None,
    ) -> None:
        super().__init__(message, status=status, endpoint=endpoint)
        self.retry_after = retry_after


class StreamCutError(TransientError):
    """The stream ended before a finish_reason arrived."""

    kind = "stream_cut"


class PermanentError(RequestError):
    """Not worth retrying automatically: recorded with its reason, retried only on request."""

    kind = "permanent"


class ContextLengthError(PermanentError):
    """The prompt (plus max_tokens) does not fit the server's context."""

    kind = "context_length"


class MalformedAnswerError(PermanentError):
    """The answer is the protocol's shape, but a field of it has the wrong type (a number where
    text belongs, a list of ids that are not all integers, a chunk that is not an object): no
    row is built from it. The sample fails with the field's name; retried only on request."""

    kind = "malformed_answer"


class InvalidTextError(PermanentError):
    """The answer holds text that is not valid Unicode (a lone surrogate): no row can be built
    from it, so the sample fails like a row that cannot be built (regen.core.sample)."""

    kind = "invalid_unicode"


class EndpointFaultError(RequestError):
    """The endpoint refuses every request, whatever the sample: HTTP 401/403 (the key, a
    gateway), 404 (a model it does not serve, or a URL without ``/v1``), 405, 407. Never a
    sample's failure: the endpoint leaves rotation for the session and the request is sent to
    another one. ``fix``: what to change; ``excerpt``: the start of the server's body."""

    kind = "endpoint_fault"

    def __init__(
        self,
        message: str,
        *,
        fix: str = "",
        excerpt: str = "",
        status: int | None = None,
        endpoint: str | None = None,
    ) -> None:
        super().__init__(message, status=status, endpoint=endpoint)
        self.fix = fix
        self.excerpt = excerpt


class NotProtocolError(EndpointFaultError):
    """The answer is not the OpenAI protocol at all: an HTML page, JSON without ``choices``,
    HTTP 200 with a content type that is neither an event stream nor JSON (a gateway's page)."""

    kind = "not_protocol"


class RunIncompleteError(RegenError):
    """The session stopped with samples left for the next run (nothing done is lost; the same
    command continues): every endpoint refused, or every worker died. Exit code 75."""

    kind = "incomplete"


class NoEndpointLeftError(RunIncompleteError):
    """Every endpoint left rotation for an endpoint-wide fault (:class:`EndpointFaultError`)."""

    kind = "no_endpoint_left"


class TrapError(RegenError):
    """A configuration that would silently ruin a draft model. ``trap`` names it."""

    kind = "trap"

    def __init__(self, trap: str, message: str, fix: str) -> None:
        super().__init__(f"[{trap}] {message} Fix: {fix}")
        self.trap = trap
        self.fix = fix
