"""DeepSeek-V4 (DeepSeek-AI): DSML tool calls, prompts from a Python encoder; V4.1's base.

Owns no files. The format (vLLM 0.32 ``tokenizers/deepseek_v4_encoding.py`` and its wrapper
``tokenizers/deepseek_v4.py``; SGLang 0.5.23 renders it with the ``deepseek-recipe`` package,
``parser/deepseek_recipe_renderer.py`` and ``entrypoints/openai/serving_deepseek_recipe.py``,
whose behaviour below was read off deepseek-recipe 0.2.0 by running it), the markup in
:mod:`regen.targets.dsml`:

- ``<｜begin▁of▁sentence｜>``, in thinking mode the effort's text, then the turns: a system
  message's text (and ``\\n\\n## Tools...``); a user turn ``<｜User｜>`` + its text, where tool
  results join it as ``<tool_result>{content}</tool_result>`` (consecutive user and tool messages
  are one turn, parts joined by ``\\n\\n``, results in the order of the calls); an assistant
  turn ``<｜Assistant｜>`` + ``<think>`` or ``</think>`` (the header), ``{reasoning}</think>``
  where it keeps its reasoning, ``{content}``, ``\\n\\n`` + the ``tool_calls`` block, and
  ``<｜end▁of▁sentence｜>``; the prompt ends with a header, ``<think>`` when thinking;
- the history's reasoning: kept everywhere when the request has tools; else dropped before the
  last user turn (whose headers close ``</think>``), with the developer messages there;
- thinking is on by default in vLLM (``thinking`` or ``enable_thinking`` off switch it off), off
  in SGLang (``thinking`` alone); the effort: ``high`` (vLLM's default, and recipe's),
  ``low`` (no text) or ``max`` (vLLM reads ``reasoning_effort`` of the template kwargs or the
  request, the request's winning; SGLang the request's only);
- vLLM needs ``--tokenizer-mode deepseek_v4`` unless the architecture is a DeepSeek-V4 one;
  SGLang selects recipe with ``--tool-call-parser deepseekv4`` (which cannot be mixed with other
  parsers) and has no EAGLE-3 for DeepSeek-V4 (no ``set_eagle3_layers_to_capture``).

Where the engines part ways (each rendered here as that engine renders it):

- tools: vLLM appends them to the first system message wherever it is; recipe to its leading
  system message, each function as ``name``, ``description`` (``""`` when none) and
  ``parameters`` (``{}`` when none; a ``strict`` tool's schema, which recipe rewrites, is not
  modelled);
- JSON (argument values, tool schemas): recipe writes numbers as Rust does (``1e-7``,
  ``0.00001``) and reads integers beyond 64 bits as floats;
- system and developer messages: recipe turns developer messages into system messages, drops
  empty ones and (V4) joins them all, ``\\n\\n`` apart, at the front; vLLM renders each in
  place (a developer one as ``<｜User｜>{content}``);
- headers: recipe writes one before every assistant turn; vLLM only after a user, developer or
  system message (so not between two assistant turns);
- history arguments that are not a JSON object: recipe writes them as one string parameter
  ``arguments`` (SGLang's preparation keeps them, :attr:`Family.sglang_arguments` ``keep``);
  vLLM's preparation has made them ``{}``;
- a tool result without ``tool_call_id``: recipe refuses the request.

Recipe encodes a message's text without the added vocabulary: special-token text typed in a
message is plain text in SGLang's ids, the special token in vLLM's (and here).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from regen.core.errors import TemplateError
from regen.targets.dsml import (
    ASSISTANT,
    DSML,
    EOS,
    LATEST_REMINDER,
    SGLANG,
    SYSTEM,
    THINK_CLOSE,
    THINK_OPEN,
    USER,
    DsmlFamily,
    Tags,
    call_arguments,
    function_of,
    sglang_last_assistant,
    text_of,
    vllm_tools,
)
from regen.targets.dsml_v4 import Dialect, Encoder, Setting, merge_turns
from regen.targets.family import Parsers, Thinking

TAGS = Tags("tool_calls")
#: the effort texts written before the first message in thinking mode
EFFORT_TEXT = {
    "low": "",
    "high": (
        "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
        "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
        "resolve the root cause, rigorously stress-testing your logic against all potential "
        "paths, edge cases, and adversarial scenarios.\n"
        "Explicitly write out your entire deliberation process, documenting every intermediate "
        "step, considered alternative, and rejected hypothesis to ensure absolutely no "
        "assumption is left unchecked.\n\n"
    ),
    "max": (
        "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
        "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: "
        "exhaustively decompose the problem into its most fundamental components, trace every "
        "causal chain to its root, and resolve the underlying cause rather than any surface "
        "symptom.\n"
        "Do not stop reasoning until you have independently verified the solution from "
        "multiple angles and are certain that no assumption remains unchecked and no error "
        "remains undiscovered.\n\n"
    ),
}
#: recipe's tiers of SGLang's ``reasoning_effort`` names (RUN)
RECIPE_TIERS = {"minimal": "low", "low": "low", "medium": "high", "high": "high",
                "xhigh": "high", "ultra": "max", "max": "max"}  # fmt: skip
#: the levels regen asks for: vLLM and recipe render each the same
EFFORTS = ("high", "low", "max")
#: ``config.json`` vocab_size (SGLang 0.5.23 ``configs/deepseek_v4.py``'s default)
VOCAB_SIZE = 129280
SPECIAL_TOKENS = (EOS, USER, ASSISTANT, THINK_OPEN, THINK_CLOSE, DSML)


# -- what each engine hands its encoder -------------------------------------------------------
def vllm_messages(
    messages: list[dict[str, object]], tools: list[dict[str, object]] | None
) -> list[dict[str, object]]:
    """vLLM's wrappers: the tools go to the first system message, or a new one in front."""
    msgs = [dict(m) for m in messages]
    served = vllm_tools(tools)
    if served:
        at = next((i for i, m in enumerate(msgs) if m.get("role") == "system"), None)
        if at is None:
            msgs.insert(0, {"role": "system", "content": ""})
            at = 0
        msgs[at]["tools"] = served
    return msgs


def recipe_messages(
    messages: list[dict[str, object]], tools: list[dict[str, object]] | None, *, hoist: bool
) -> list[dict[str, object]]:
    """SGLang's recipe path: a trailing assistant turn re-sent as a user turn, developer
    messages as system messages, empty ones gone; ``hoist`` (V4): every system message joined
    at the front; the tools on the leading system message (a new empty one where there is
    none)."""
    msgs = []
    for m in sglang_last_assistant([dict(m) for m in messages]):
        if m.get("role") == "tool" and not m.get("tool_call_id"):
            raise TemplateError("SGLang (deepseek-recipe) refuses a tool result without "
                                "tool_call_id")  # fmt: skip
        if m.get("role") in ("system", "developer"):
            if not m.get("content"):
                continue
            m = {"role": "system", "content": m["content"]}
        msgs.append(m)
    if hoist:
        texts = [text_of(m["content"]) for m in msgs if m.get("role") == "system"]
        msgs = [m for m in msgs if m.get("role") != "system"]
        if texts:
            msgs.insert(0, {"role": "system", "content": "\n\n".join(texts)})
    if tools:
        if not msgs or msgs[0].get("role") != "system":
            msgs.insert(0, {"role": "system", "content": ""})
        msgs[0]["tools"] = recipe_tools(tools)
    return msgs


def recipe_tools(tools: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """Each function as recipe writes it: name, description, parameters (module docstring)."""
    out: list[dict[str, object]] = []
    for tool in tools:
        fn = function_of(tool)
        params = fn.get("parameters")
        if params is not None and (not isinstance(params, dict) or params.get("type") != "object"):
            raise TemplateError(f"SGLang (deepseek-recipe) refuses tool {fn.get('name')!r}: its "
                                "parameters are not an object schema")  # fmt: skip
        spec: dict[str, object] = {"name": fn.get("name"),
                                   "description": fn.get("description") or "",
                                   "parameters": {} if params is None else params}  # fmt: skip
        out.append({"type": "function", "function": spec})
    return out


def recipe_arguments(call: Mapping[str, object]) -> Mapping[str, object]:
    """Recipe's history arguments: the JSON object they hold, else their text as the string
    parameter ``arguments``."""
    args = call_arguments(call)
    if isinstance(args, dict):
        return args
    raw = function_of(call).get("arguments")
    if not isinstance(raw, str):  # SGLang sends recipe other values as compact JSON
        raw = json.dumps(raw, ensure_ascii=False, separators=(",", ":"))
    return {"arguments": raw}


def sglang_effort(kwargs: Mapping[str, object]) -> object:
    """The effort SGLang hands recipe (``serving_deepseek_recipe.py`` ``_encode``): a numeric
    text as its number; None for none or ``none``; a name recipe does not know is refused."""
    effort = kwargs.get("reasoning_effort")
    if isinstance(effort, str) and re.fullmatch(r"\d+(\.\d+)?", effort.strip()):
        effort = float(effort) if "." in effort else int(effort)
    if effort is None or effort == "none":
        return None
    if isinstance(effort, bool) or (isinstance(effort, str) and effort not in RECIPE_TIERS):
        raise TemplateError(f"SGLang refuses reasoning_effort {effort!r}")
    return effort


def sglang_thinking(kwargs: Mapping[str, object]) -> bool:
    """SGLang's switch: ``thinking``; a request effort other than ``none`` sets it where the
    kwargs do not (protocol ``normalize_reasoning_inputs``); default off."""
    effort = kwargs.get("reasoning_effort")
    return bool(kwargs.get("thinking", effort is not None and effort != "none"))


def vllm_thinking(kwargs: Mapping[str, object]) -> bool:
    """vLLM V4 / V4.1's switch: ``thinking`` or ``enable_thinking``; on when neither is given."""
    if "thinking" not in kwargs and "enable_thinking" not in kwargs:
        return True
    return bool(kwargs.get("thinking")) or bool(kwargs.get("enable_thinking"))


class DeepSeekV4Family(DsmlFamily):
    """DeepSeek-V4 (module docstring); V4.1 changes :attr:`dialect` and the effort."""

    tags = TAGS
    dialect = Dialect(TAGS)
    vllm_tokenizer_mode = "deepseek_v4"

    def template_kwargs(self, thinking: Thinking) -> dict[str, object]:
        """Both switches, and the effort with thinking on (what regen's own render reads: the
        same as :meth:`request_fields` sends)."""
        return {**super().template_kwargs(thinking), **self.request_fields(thinking)}

    def request_fields(self, thinking: Thinking) -> dict[str, object]:
        """``reasoning_effort`` with thinking on: SGLang reads the effort from the request
        only (vLLM from either, the request's winning)."""
        level = self.effort(thinking)
        return {} if level is None else {"reasoning_effort": level}

    def encode_prompt(
        self,
        messages: list[dict[str, object]],
        tools: list[dict[str, object]] | None,
        kwargs: Mapping[str, object],
        engine: str,
    ) -> str:
        """The prompt the engine renders (module docstring; any engine but SGLang: vLLM's).
        The kwargs' ``reasoning_effort`` stands for the request's (regen sends both)."""
        if engine == SGLANG:
            setting = self.sglang_setting(kwargs)
            msgs = recipe_messages(messages, tools, hoist=self.dialect.system_token is None)
        else:
            setting = self.vllm_setting(kwargs)
            msgs = self.vllm_messages(messages, tools)
        setting.engine = engine
        return Encoder(merge_turns(msgs), self.dialect, setting).text()

    def vllm_messages(
        self, messages: list[dict[str, object]], tools: list[dict[str, object]] | None
    ) -> list[dict[str, object]]:
        return vllm_messages(messages, tools)

    def vllm_setting(self, kwargs: Mapping[str, object]) -> Setting:
        """vLLM's wrapper: thinking on by default; ``none`` switches it off; ``max`` is max,
        ``low`` / ``minimal`` / ``medium`` low, any other name high."""
        thinking = vllm_thinking(kwargs)
        effort = kwargs.get("reasoning_effort")
        level = "high"
        if effort == "none":
            thinking = False
        elif isinstance(effort, str):
            level = {"max": "max", "low": "low", "minimal": "low", "medium": "low"}.get(
                effort, "high"
            )
        return Setting(thinking, EFFORT_TEXT[level], recipe=False,
                       drop=bool(kwargs.get("drop_thinking", True)))  # fmt: skip

    def sglang_setting(self, kwargs: Mapping[str, object]) -> Setting:
        """SGLang's recipe: recipe's tier of the effort (``high`` when none is given); a
        numeric effort is refused."""
        effort = sglang_effort(kwargs)
        if effort is not None and not isinstance(effort, str):
            raise TemplateError(f"SGLang refuses reasoning_effort {effort!r} for DeepSeek-V4")
        return self.recipe_setting(kwargs, EFFORT_TEXT[RECIPE_TIERS[effort or "high"]])

    def recipe_setting(self, kwargs: Mapping[str, object], effort_text: str) -> Setting:
        return Setting(sglang_thinking(kwargs), effort_text, recipe=True,
                       arguments=recipe_arguments, dump=self.dialect.recipe_dump)  # fmt: skip

    def token_hint(self, tokens: frozenset[str]) -> bool:
        """DSML and the latest reminder, and no V4.1 system token."""
        return DSML in tokens and LATEST_REMINDER in tokens and SYSTEM not in tokens


DEEPSEEK_V4 = DeepSeekV4Family(
    name="deepseek_v4",
    title="DeepSeek-V4",
    end_of_turn=EOS,
    special_tokens=SPECIAL_TOKENS,
    turn_open_tokens=(USER, ASSISTANT),
    call_markers=(TAGS.opener, TAGS.invoke_opener),
    sglang=Parsers(tool="deepseekv4", reasoning="deepseek-v4"),
    vllm=Parsers(tool="deepseek_v4", reasoning="deepseek_v4"),
    aux_shift="unsupported",
    thinking_kwarg="thinking",
    efforts=EFFORTS,
    published_vocab=VOCAB_SIZE,
    model_types=("deepseek_v4",),
    sglang_arguments="keep",
)
