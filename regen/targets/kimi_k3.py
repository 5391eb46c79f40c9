"""Kimi K3 (moonshotai/Kimi-K3; Moonshot AI): the XTML chat format.

Owns no files. Where each fact was read (vLLM 0.32 and SGLang 0.5.23 as pinned; the checkpoint's
remote code ``encoding_k3.py`` / ``tokenization_kimi.py`` in public copies, third-party):

- **The format.** Four special tokens frame everything: a tag is ``<|open|>{name}{ k="v"}*<|sep|>``
  … ``<|close|>{name}<|sep|>`` (attribute values escape ``&`` then ``"``), and every message is
  ``<|open|>message role="{role}"[ name="…"]<|sep|>{body}<|close|>message<|sep|><|end_of_msg|>``.
  An assistant body is ``[<|open|>think<|sep|>{reasoning}<|close|>think<|sep|>]`` (the think
  channel exactly when thinking is on, empty without reasoning; every history turn keeps its
  reasoning) + ``<|open|>response<|sep|>{content}<|close|>response<|sep|>`` + the calls:
  ``<|open|>tools<|sep|>`` + per call ``<|open|>call tool="{name}" index="{i}"<|sep|>`` + per
  argument ``<|open|>argument key="{k}" type="{t}"<|sep|>{value}<|close|>argument<|sep|>``
  + ``<|close|>call<|sep|>`` … + ``<|close|>tools<|sep|>`` (a string value raw, any other
  ``json.dumps``; type boolean / null / number / string / object / array by the value; text
  arguments that are no JSON go whole into ``<|open|>json type="object"<|sep|>…``). Tool results
  are ``role="tool" tool="{name}" index="{n}"`` (n counts results since the assistant turn), the
  request's tools one ``type="tool-declare"`` system message of key-sorted compact JSON, the
  effort a ``type="thinking-effort"`` one, and the generation prompt
  ``<|open|>message role="assistant"<|sep|><|open|>think<|sep|>`` (thinking) or
  ``…<|open|>response<|sep|>`` (not). Sources: ``encoding_k3.py`` (moonshotai/Kimi-K3 main, and
  the copy derived from commit c5d1dd4), llama.cpp's port ``models/templates/Kimi-K3.jinja``
  (vendored as ``regen/devkit/tokenizers/templates/kimi_k3.jinja``: the witness of the tests).
  Where c5d1dd4 and main differ (main names an assistant message's ``name``; main writes each
  attribute as four text segments) regen's port follows main, as the llama.cpp port does.
- **No chat template.** The checkpoint's tokenizer renders in Python (``apply_chat_template``:
  ``thinking`` defaults to True, ``thinking_effort`` to ``max``; low / high / max only), so both
  engines call it and regen ports it (:mod:`regen.targets.kimi_k3_encoding`, over the markup of
  :mod:`regen.targets.kimi_k3_xtml`; :meth:`KimiK3Family.encode_prompt`), with each engine's
  own preparation before it (:mod:`regen.targets.kimi_k3_engines`):

  - vLLM (``renderers/kimi_k3.py``; ``--tokenizer-mode kimi_k3`` is what ``auto`` picks for the
    architecture, ``config/model.py``; ``--trust-remote-code``): ``_normalize_k3_tool_messages``
    puts a block of tool results in the calls' order when every result names a call by its id
    or by ``"{name}:{0-based position}"``; ``enable_thinking`` becomes ``thinking`` and a
    ``reasoning_effort`` kwarg ``thinking_effort`` (``none``: thinking off); an effort other
    than low / high / max is refused (HTTP 400); a kwarg set to None or ``auto`` is dropped
    (so ``thinking_effort: null`` is the default ``max``); tools are ``model_dump()`` (a missing
    description is declared ``"description":null``); a ``developer`` message reaches the
    encoder as it is, which writes none, and a system message loses its tools;
  - SGLang (``entrypoints/openai/serving_chat.py`` ``_prepare_kimi_k3_messages`` and
    ``_encode_messages``; ``chat_encoding.py``): history arguments are parsed leniently (text
    that is no JSON stays text: a ``json`` block), ``<|kimi_image_placeholder|>`` typed in text
    becomes ``<| kimi_image_placeholder |>``, content None becomes ``""``, ``developer``
    becomes ``system`` and a system message keeps its tools (a lazy-loading declaration); the
    chat_template_kwargs reach the encoder as they are (``enable_thinking`` is not read); tools
    are ``model_dump(exclude_unset=True)``: only what the client set. regen gets the request's
    tools as regen.template.prepare completed them and drops what it filled in, so a client's
    own ``"description": null`` and a tool sent without ``"type"`` render as if the null were
    absent and the type given (both rare: datasets send OpenAI's full shape);
  - no engine known (``plain``, ``legacy``): vLLM's.

  Both encoders then order tool results whose ``tool_call_id`` matches a call id.
- **Thinking** is a switch plus an effort: regen sends ``chat_template_kwargs``
  ``{"thinking": bool, "thinking_effort": level}`` (the level only with thinking on), which both
  engines hand the encoder unchanged and vLLM's reasoning parser reads.
- **The answer** after ``<|open|>think<|sep|>`` is ``{reasoning}<|close|>think<|sep|>`` +
  ``<|open|>response<|sep|>{content}<|close|>response<|sep|>`` + the calls +
  ``<|close|>message<|sep|>``, and ``<|end_of_msg|>`` (the generation config's eos) stops it;
  after ``<|open|>response<|sep|>`` (thinking off) the model writes the response body directly.
  Parsers (SGLang ``function_call/kimik3_detector.py``, ``kimik3_format.py``,
  ``parser/reasoning_parser.py`` ``KimiK3Detector``; vLLM ``parser/kimi_k3.py`` composing
  ``reasoning/kimi_k3_reasoning_parser.py`` and ``tool_parsers/kimi_k3_tool_parser.py``): the
  reasoning raw, the content the response channel's body, ``<|close|>message<|sep|>`` dropped,
  each argument typed back (a ``string`` raw, else ``json.loads``) and returned as
  ``json.dumps``. vLLM returns no reasoning (None) for an empty think channel. With tools,
  SGLang adds ``<|close|>tools<|sep|>`` as a stop string (``serving_chat.py``
  ``tool_call_stop``): a turn with calls stops there, trimmed, and never writes
  ``<|close|>message<|sep|><|end_of_msg|>``; the rebuild writes the template's form.
- SGLang 0.5.23's K3 model has no EAGLE-3 capture (``models/kimi_k3.py``: no
  ``set_eagle3_layers_to_capture``; the server refuses to start): ``aux_shift`` unsupported.

**Token ids of a local row.** K3's tokenizer encodes the prompt segment by segment: control
segments (the four tokens, image prompts) with special tokens recognised, every other segment
(message text, reasoning, argument values, names, attribute values, the tools' JSON) with
``disallowed_special=()``, so marker strings typed in text stay plain BPE; and BPE never merges
across segments. regen's Renderer encodes the joined text whole. A server row carries the
server's ids (and its check compares decoded text), so it is exact. A local row differs only
where (a) text holds one of K3's special-token strings (``<|open|>``, ``<|end_of_msg|>``,
``[EOS]``, ``<|media_pad|>``…): conversations about K3's own format, pasted chat logs: rare; or
(b) the whole-text pre-tokenizer splits differently at a join of two text segments: only inside
a tag's header, where the name and each attribute's `` key``, ``="``, value and ``"`` are
separate segments; K3's pattern splits there anyway except for a value that starts or ends with
punctuation (``key="$ref"``: ``="$`` + ``ref`` whole against ``="`` + ``$ref``): rarer.
:meth:`KimiK3Family.prompt_segments` gives the segments; encoding them one by one (control ones
with special tokens, the rest as plain text) reproduces the engines' ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from regen.core.errors import TemplateError
from regen.core.sample import ToolCall
from regen.core.tools import vllm_tools
from regen.targets.family import (
    Family,
    Parsers,
    RenderFlag,
    Thinking,
    ThinkState,
    TokenizerFacts,
    arguments_json,
)
from regen.targets.kimi_k3_encoding import EFFORTS, Images, tokenizer_segments, write_call
from regen.targets.kimi_k3_engines import (
    MEDIA_PAD,
    SGLANG,
    VLLM,
    sglang_kwargs,
    sglang_messages,
    sglang_tools,
    vllm_kwargs,
    vllm_tool_order,
)
from regen.targets.kimi_k3_xtml import (
    CALL_OPEN,
    CLOSE,
    END_OF_MSG,
    MESSAGE_CLOSE,
    MESSAGE_END,
    OPEN,
    RESPONSE_CLOSE,
    RESPONSE_OPEN,
    SEP,
    THINK_CLOSE,
    THINK_OPEN,
    TOOLS_OPEN,
    Segments,
)

#: ids of the published tokenizer (third-party copies of its tokenizer_config.json and of the
#: config.json, which agree; vocab 163840 like K2's, whose ids 163586-163588 these reuse)
PUBLISHED_IDS: dict[str, int] = {
    "[BOS]": 163584,
    "[EOS]": 163585,
    END_OF_MSG: 163586,
    OPEN: 163587,
    CLOSE: 163588,
    SEP: 163589,
    "[PAD]": 163839,
}
VOCAB_SIZE = 163840
SPECIAL_TOKENS = (OPEN, CLOSE, SEP, END_OF_MSG)
MODEL_TYPES = ("kimi_k3",)


class KimiK3Family(Family):
    """Kimi K3's XTML format and its Python-encoded prompts (module docstring)."""

    #: vLLM's ``--tokenizer-mode`` (``auto`` picks it for KimiK3ForConditionalGeneration)
    vllm_tokenizer_mode: ClassVar[str | None] = "kimi_k3"

    # -- thinking -----------------------------------------------------------------------------
    def template_kwargs(self, thinking: Thinking) -> dict[str, object]:
        """``{"thinking": bool}``, and the effort level (``thinking_effort``) with it on."""
        level = self.effort(thinking)
        kwargs: dict[str, object] = {"thinking": bool(thinking)}
        if level is not None:
            kwargs["thinking_effort"] = level
        return kwargs

    # -- the prompt ---------------------------------------------------------------------------
    @property
    def encodes_prompts(self) -> bool:
        return True

    def encode_prompt(
        self,
        messages: list[dict[str, object]],
        tools: list[dict[str, object]] | None,
        kwargs: Mapping[str, object],
        engine: str,
    ) -> str:
        """The prompt ``engine`` renders (SGLang's preparation for ``sglang``, vLLM's for every
        other engine; module docstring)."""
        return self.prompt_segments(messages, tools, kwargs, engine).joined()

    def prompt_segments(
        self,
        messages: list[dict[str, object]],
        tools: list[dict[str, object]] | None,
        kwargs: Mapping[str, object],
        engine: str,
    ) -> Segments:
        """The prompt as the segments K3's tokenizer encodes one by one (module docstring)."""
        if engine == SGLANG:
            msgs, images = sglang_messages(messages)
            return tokenizer_segments(msgs, sglang_tools(tools), sglang_kwargs(kwargs),
                                      [MEDIA_PAD] * images if images else None)  # fmt: skip
        if engine != VLLM:  # no engine known: vLLM's tools, and its messages carry none
            tools = vllm_tools(tools)
            messages = [{k: v for k, v in m.items() if k != "tools"} for m in messages]
        return tokenizer_segments(vllm_tool_order(messages), tools, vllm_kwargs(kwargs))

    # -- the response -------------------------------------------------------------------------
    def think_state(self, prompt_text: str) -> ThinkState:
        """``open`` after ``<|open|>think<|sep|>``, ``closed`` after ``<|open|>response<|sep|>``
        (thinking off: the model writes the response body), else ``none``."""
        if prompt_text.endswith(THINK_OPEN):
            return "open"
        if prompt_text.endswith(RESPONSE_OPEN):
            return "closed"
        return "none"

    def split_response(
        self, state: ThinkState, reasoning: str | None, content: str
    ) -> tuple[str | None, str, RenderFlag | None]:
        """No reasoning after an open prompt is vLLM's answer to an empty think channel; a
        parser-less server's content (it holds the channel markers the parsers drop) is split
        at ``<|close|>think<|sep|>`` and unwrapped (``think_inserted`` without one). Content
        that still holds channel markup is flagged ``content_has_think``."""
        flag: RenderFlag | None = None
        raw = reasoning is None and any(m in content for m in (RESPONSE_CLOSE, MESSAGE_CLOSE))
        if reasoning is None and state == "open" and THINK_CLOSE in content:
            reasoning, _, content = content.partition(THINK_CLOSE)
            content = unwrapped(content.removeprefix(RESPONSE_OPEN))
        elif raw:
            content = unwrapped(content)
            flag = "think_inserted" if state == "open" else None
        markup = (THINK_OPEN, THINK_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE, TOOLS_OPEN, MESSAGE_CLOSE)
        if flag is None and any(m in content for m in markup):
            flag = "content_has_think"
        return reasoning, content, flag

    def response_text(
        self,
        state: ThinkState,
        reasoning: str | None,
        content: str,
        tool_calls: Sequence[ToolCall] = (),
        finish_reason: str = "stop",
    ) -> str:
        """What the model wrote: ``{reasoning}<|close|>think<|sep|><|open|>response<|sep|>``
        after an open prompt (the response body alone after a closed one), the content,
        ``<|close|>response<|sep|>``, the calls, ``<|close|>message<|sep|><|end_of_msg|>``.
        A truncated turn has no message end; one cut in its reasoning or its content ends
        there."""
        truncated = finish_reason == "length"
        cut_in_reasoning = truncated and not content and not tool_calls
        if state == "closed":
            if reasoning:
                raise TemplateError(
                    "the prompt opened the response channel (thinking off) but the server "
                    "returned reasoning; check chat_template_kwargs.thinking"
                )
            return self.answer(content, tool_calls, truncated)
        if state == "none" and reasoning is None:
            return f"{RESPONSE_OPEN}{self.answer(content, tool_calls, truncated)}"
        head = "" if state == "open" else THINK_OPEN
        if cut_in_reasoning:
            return f"{head}{reasoning or ''}"
        answer = self.answer(content, tool_calls, truncated)
        return f"{head}{reasoning or ''}{THINK_CLOSE}{RESPONSE_OPEN}{answer}"

    def answer(self, content: str, calls: Sequence[ToolCall], truncated: bool) -> str:
        """The response body, its close, the calls, the message end (module docstring)."""
        if truncated and not calls:
            return content
        text = f"{content}{RESPONSE_CLOSE}{self.tool_calls_text(calls)}"
        return text if truncated else f"{text}{self.end_text(calls)}"

    def tool_calls_text(self, calls: Sequence[ToolCall], content: str = "") -> str:
        """The tools channel: each call's arguments typed by their JSON values."""
        if not calls:
            return ""
        out = Segments()
        out.open("tools")
        for i, call in enumerate(calls, start=1):
            args = arguments_json(call.arguments)
            mapping = isinstance(args, dict)
            write_call(out, call.name, i, args if mapping else None,
                       None if mapping else call.arguments, Images(None))  # fmt: skip
        out.close("tools")
        return out.joined()

    def end_text(self, calls: Sequence[ToolCall]) -> str:
        """``<|close|>message<|sep|><|end_of_msg|>``."""
        return MESSAGE_END

    def cut_close(self) -> str | None:
        """None: the close marker is three tokens, so the one-token count check of a turn cut
        in its reasoning (regen.template.render) cannot say it was written."""
        return None

    # -- recognition --------------------------------------------------------------------------
    def recognises(self, facts: TokenizerFacts) -> bool:
        """``<|open|>``, ``<|close|>``, ``<|sep|>`` and ``<|end_of_msg|>`` (no K2 tokenizer holds
        them), or ``config.json``'s ``kimi_k3``."""
        return facts.model_type in self.model_types or super().recognises(facts)


def unwrapped(text: str) -> str:
    """A raw answer's response body: the message end and response close taken off its end."""
    return text.removesuffix(END_OF_MSG).removesuffix(MESSAGE_CLOSE).removesuffix(RESPONSE_CLOSE)


KIMI_K3 = KimiK3Family(
    name="kimi_k3",
    title="Kimi K3",
    end_of_turn=END_OF_MSG,
    special_tokens=SPECIAL_TOKENS,
    # a produced answer holds all four special tokens (its channels; <|end_of_msg|> ends it): a
    # prompt's framing is ``<|open|>message role=…`` (a special token and text), which no single
    # id marks, so the loss-mask scan checks only the first token and all-trained masks
    turn_open_tokens=(),
    call_markers=(TOOLS_OPEN, CALL_OPEN),
    sglang=Parsers(tool="kimi_k3", reasoning="kimi_k3"),
    vllm=Parsers(tool="kimi_k3", reasoning="kimi_k3"),
    aux_shift="unsupported",
    think=(THINK_OPEN, THINK_CLOSE),
    thinking_kwarg="thinking",
    efforts=EFFORTS,
    published_ids=PUBLISHED_IDS,
    published_vocab=VOCAB_SIZE,
    model_types=MODEL_TYPES,
    remote_code=True,
    sglang_arguments="keep",
)
