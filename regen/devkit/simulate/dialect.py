"""How the simulated server speaks: SGLang 0.5.23 (the default) or vLLM 0.32.

The answer, capacity, fault and speculation models are the same; what differs is the wire, as
each engine's own code writes it (docs/engines.md has the table; tests hold the SGLang side
against the sglang wheel's models and the vLLM side against a real vLLM server):

==================  ==========================================  ==============================
                    sglang                                      vllm
==================  ==========================================  ==============================
who it is           /server_info, /get_server_info,             /version, /metrics (``vllm:``);
                    /model_info                                 /server_info is 404
ids asked by        sglext fields (stream), return_*_token_ids  return_token_ids (both ways);
                    (not streamed; 400 with stream)             SGLang's fields ignored
ids, streamed       ``sglext`` chunk after the finish chunk     top-level prompt_token_ids in
                                                                the role chunk, token_ids on
                                                                every later choice
ids, whole          on the choice (prompt/response_token_ids)   top-level prompt_token_ids,
                                                                choices[0].token_ids
reasoning           reasoning_content                           reasoning
empty content       ""                                          null (not streamed)
error body          {object, message, type, param, code}        {"error": {message, type,
                                                                param, code}}
overload (503)      "The request queue is full."                "The engine is currently
                                                                busy ..." (type Service
                                                                Unavailable)
prompt too long     400 BadRequestError                         400, param "input_tokens"
==================  ==========================================  ==============================

Owns no files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Engine = Literal["sglang", "vllm"]


@dataclass(frozen=True, slots=True)
class Dialect:
    """One engine's wire, for the simulator."""

    name: Engine
    reasoning_key: str  #: the message/delta field that carries reasoning
    queue_full: str  #: the message of an overload 503
    queue_full_type: str  #: its error type
    owned_by: str  #: /v1/models' owned_by
    null_empty_content: bool  #: a non-streamed empty content is null (else "")
    #: /metrics is always served (vLLM); else only with --enable-metrics (SGLang)
    metrics_always: bool = False
    #: /health runs the generating check (SGLang 0.5.23's default); else a plain 200
    health_generates: bool = True
    #: the waiting-queue limit counts the running requests too and is not per data-parallel
    #: rank (vLLM's --max-num-seqs admission); else queued ones per rank (SGLang)
    queue_counts_running: bool = False
    #: token ids are asked with return_token_ids, streamed or not, and come back as
    #: top-level prompt_token_ids and per-choice token_ids (vLLM); else on the choice, and
    #: through sglext for streams (SGLang)
    vllm_ids: bool = False
    #: answers carry SGLang's ``sglext`` (spec details, stream ids)
    sglext: bool = True
    #: the wording of a prompt longer than the context: (message, its ``param``)
    long_prompt: str = (
        "The input ({n} tokens) is longer than the model's context length ({ctx} tokens)."
    )
    long_prompt_param: str | None = None
    #: /server_info and /model_info (SGLang's; else /version)
    server_info: bool = True
    #: the stream's status line and headers wait for the first token (SGLang's handler awaits
    #: the generator's first item); else they go at once (vLLM's StreamingResponse)
    status_with_first_token: bool = True
    #: an unknown model's 404 lists the valid aliases, with ``param`` "model" (vLLM)
    model_404_aliases: bool = False
    #: a history tool call's arguments that are not a JSON object refuse the request (400),
    #: as SGLang's Jinja path does; vLLM renders them as {} (regen.template.prepare)
    strict_arguments: bool = False

    def long_prompt_error(self, n_prompt: int, ctx: int) -> tuple[str, str | None]:
        return self.long_prompt.format(n=n_prompt, ctx=ctx, over=ctx + 1), self.long_prompt_param

    def error_body(self, status: int, message: str, err_type: str, param: str | None = None):
        err = {"message": message, "type": err_type, "param": param, "code": status}
        if self.name == "vllm":
            return {"error": err}
        return {"object": "error", **err}

    def stream_error(self, message: str, code: int = 503) -> bytes:
        """The error event a stream carries after HTTP 200 (SGLang:
        serving_base.create_streaming_error_response; vLLM: the chat stream generator)."""
        err_type = "SERVICE_UNAVAILABLE" if self.name == "sglang" else self.queue_full_type
        err = {"message": message, "type": err_type, "param": None, "code": code}
        if self.name == "sglang":
            err = {"object": "error", **err}
        return b"data: " + json.dumps({"error": err}, separators=(",", ":")).encode() + b"\n\n"

    def asks_ids(self, body: Mapping[str, Any], stream: bool) -> tuple[bool, bool]:
        """(prompt ids, output ids) the request asks for in this dialect."""
        if self.name == "vllm":
            want = bool(body.get("return_token_ids"))
            return want, want
        if stream:
            return bool(body.get("return_input_ids_in_sglext")), bool(
                body.get("return_output_ids_in_sglext")
            )
        want = bool(body.get("return_token_ids"))
        return bool(body.get("return_prompt_token_ids")) or want, want


SGLANG = Dialect("sglang", "reasoning_content", "The request queue is full.", "503", "sglang",
                 False, strict_arguments=True)  # fmt: skip
VLLM = Dialect(
    "vllm",
    "reasoning",
    "The engine is currently busy and cannot accept new requests. Please try again later or "
    "on a different instance.",
    "Service Unavailable",
    "vllm",
    True,
    metrics_always=True,
    health_generates=False,
    queue_counts_running=True,
    vllm_ids=True,
    sglext=False,
    long_prompt=(
        "This model's maximum context length is {ctx} tokens. However, your prompt contains "
        "at least {over} input tokens, which exceeds this limit even without any output "
        "tokens. Please reduce the length of the input prompt. (parameter=input_tokens, "
        "value={n})"
    ),
    long_prompt_param="input_tokens",
    server_info=False,
    status_with_first_token=False,
    model_404_aliases=True,
)
DIALECTS: dict[str, Dialect] = {"sglang": SGLANG, "vllm": VLLM}
