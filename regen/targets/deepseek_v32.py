"""DeepSeek-V3.2 (DeepSeek-AI): DSML tool calls, prompts from a Python encoder.

Owns no files. The format (vLLM 0.32 ``tokenizers/deepseek_v32_encoding.py`` and its wrapper
``tokenizers/deepseek_v32.py``; SGLang 0.5.23 ``entrypoints/openai/encoding_dsv32.py``, called
from ``serving_chat.py``'s ``_apply_jinja_template``; the same encoder in both, from DeepSeek's
``encoding/encoding_dsv32.py``), the markup in :mod:`regen.targets.dsml`:

- ``<｜begin▁of▁sentence｜>``, then each message: a system message's text (and the tool
  declarations, ``\\n\\n## Tools...``); a user turn ``<｜User｜>{content}<｜Assistant｜>`` and
  ``<think>`` when it is the last user turn and thinking is on, else ``</think>``; an assistant
  turn ``{content}`` (after the last user turn in thinking mode: ``{reasoning}</think>`` first),
  then ``\\n\\n`` and the ``function_calls`` block, then ``<｜end▁of▁sentence｜>``; the results
  of an assistant's calls ``\\n\\n<function_results>`` + per result ``\\n<result>{content}
  </result>`` + ``\\n</function_results>\\n\\n`` and ``<think>`` / ``</think>`` as after a user
  turn (so a prompt after tool results reopens the reasoning with no ``<｜Assistant｜>``);
  a developer message is a user turn ``<｜User｜>`` + tools + ``\\n\\n# The user's message is:
  {content}``;
- in thinking mode an assistant turn after the last user turn must carry reasoning or calls
  (both engines refuse the request otherwise), and developer messages before the last user turn
  are dropped (vLLM only when the request ends with a user turn);
- thinking: vLLM ``thinking`` or ``enable_thinking`` (default off); SGLang ``thinking`` only
  (``SGLANG_DEFAULT_THINKING``, default off); no effort levels;
- the engines differ on a request with tools **and** a system message: vLLM puts the tools in a
  new system message before it (the tool text first), SGLang appends them to it; vLLM reads the
  history's reasoning from ``reasoning``, SGLang from ``reasoning_content`` (each engine's
  preparation sets its own);
- vLLM needs ``--tokenizer-mode deepseek_v32`` unless the architecture is
  ``DeepseekV32ForCausalLM``; SGLang picks the encoder by ``--tool-call-parser deepseekv32`` (or
  a DeepSeek-V3 architecture without a chat template);
- SGLang's DeepSeek-V2 loader (``DeepseekV32ForCausalLM`` inherits it) adds 1 to the aux ids only
  when the first is 1; its strict path refuses history arguments that are not a JSON object.

Parsers: SGLang ``deepseekv32`` (strips string values and the ``\\n\\n`` before the block) with
``deepseek-v3`` reasoning; vLLM ``deepseek_v32`` (an engine parser) with ``deepseek_v3``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from regen.core import jsontext
from regen.core.errors import TemplateError
from regen.targets.dsml import (
    ASSISTANT,
    BOS,
    EOS,
    LATEST_REMINDER,
    PAD,
    SGLANG,
    SYSTEM,
    THINK_CLOSE,
    THINK_OPEN,
    USER,
    DsmlFamily,
    Tags,
    history_calls,
    json_text,
    object_arguments,
    reasoning_of,
    sglang_last_assistant,
    text_of,
    think_tag,
    vllm_tools,
    wide_ints_in_object,
)
from regen.targets.family import Parsers

TAGS = Tags("function_calls")
_D = "<｜DSML｜"
#: the tool declarations (``TOOLS_SYSTEM_TEMPLATE``; ``{schemas}``: one JSON object a line)
TOOLS_TEXT = (
    "## Tools\n"
    "You have access to a set of tools you can use to answer the user's question.\n"
    f'You can invoke functions by writing a "{_D}function_calls>" block like the following as '
    "part of your reply to the user:\n"
    f"{_D}function_calls>\n"
    f'{_D}invoke name="$FUNCTION_NAME">\n'
    f'{_D}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE'
    "</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    f'{_D}invoke name="$FUNCTION_NAME2">\n'
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜function_calls>\n"
    "String and scalar parameters should be specified as is without any escaping or quotes, "
    'while lists and objects should use JSON format. The "string" attribute should be set to '
    '"true" for string type parameters and "false" for other types (numbers, booleans, arrays, '
    "objects).\n"
    "If the thinking_mode is enabled, then after function results you should strongly consider "
    "outputting a thinking block. Here is an example:\n"
    f"{_D}function_calls>\n"
    "...\n"
    "</｜DSML｜function_calls>\n"
    "<function_results>\n"
    "...\n"
    "</function_results>\n"
    f"{THINK_OPEN}...thinking about results{THINK_CLOSE}\n"
    "Here are the functions available in JSONSchema format:\n"
    "<functions>\n"
    "{schemas}\n"
    "</functions>\n"
)
#: DeepSeek-V3 tokenizer ids (DeepSeek's V3.2 README encodes a prompt as ``[0, 128803, ...]``;
#: the same as :mod:`regen.targets.deepseek`'s); vocab 129280
PUBLISHED_IDS: dict[str, int] = {BOS: 0, EOS: 1, USER: 128803, ASSISTANT: 128804}
VOCAB_SIZE = 129280
SPECIAL_TOKENS = (EOS, USER, ASSISTANT, THINK_OPEN, THINK_CLOSE)


def tools_text(tools: object) -> str:
    """The declarations of OpenAI-form tools (their ``function`` objects)."""
    schemas = [json_text(_declared(t)) for t in jsontext.iterate(tools)]
    return TOOLS_TEXT.replace("{schemas}", "\n".join(schemas))


def _declared(tool: object) -> object:
    if not isinstance(tool, Mapping):
        raise TemplateError(f"DeepSeek-V3.2 needs a tool as an object, not {tool!r}")
    return tool["function"]


def last_user_index(messages: Sequence[Mapping[str, object]]) -> int:
    """The last user or developer message (-1: none)."""
    found = [i for i, m in enumerate(messages) if m.get("role") in ("user", "developer")]
    return found[-1] if found else -1


def check_nothing_dropped(messages: Sequence[Mapping[str, object]]) -> None:
    """Thinking mode drops the developer messages before the last user turn, and both engines'
    encoders then fail (they render as many messages as they were given, over the shorter
    list: "Index … out of range"). The reasoning it also drops is never rendered there."""
    last = last_user_index(messages)
    keep = ("user", "system", "tool", "assistant")
    if any(i < last and m.get("role") not in keep for i, m in enumerate(messages)):
        raise TemplateError("DeepSeek-V3.2 (thinking): the engines' encoder fails on a developer "
                            "message before the last user turn")  # fmt: skip


class Encoder:
    """One request's prompt (module docstring); ``engine`` picks the reasoning key."""

    def __init__(self, messages: list[dict[str, object]], thinking: bool, engine: str) -> None:
        self.messages = messages
        self.thinking = thinking
        self.engine = engine
        self.last_user = last_user_index(messages)

    def arguments(self, call: Mapping[str, object]) -> Mapping[str, object]:
        """A history call's arguments: SGLang read them with orjson (wide integers as floats)."""
        args = object_arguments(call)
        return wide_ints_in_object(args) if self.engine == SGLANG else args

    def text(self) -> str:
        return BOS + "".join(self.message_text(i) for i in range(len(self.messages)))

    def message_text(self, i: int) -> str:
        m = self.messages[i]
        role, content, tools = m.get("role"), m.get("content"), m.get("tools")
        opens = self.thinking and i == self.last_user
        if role == "system":
            return text_of(content or "") + (f"\n\n{tools_text(tools)}" if tools else "")
        if role == "user":
            return f"{USER}{content}{ASSISTANT}{think_tag(opens)}"
        if role == "developer":
            if not content:
                raise TemplateError("DeepSeek-V3.2: a developer message needs content")
            body = (f"\n\n{tools_text(tools)}" if tools else "") + (
                f"\n\n# The user's message is: {content}"
            )
            return f"{USER}{body}{ASSISTANT}{think_tag(opens)}"
        if role == "tool":
            return self.result_text(i)
        if role == "assistant":
            return self.assistant_text(i)
        raise TemplateError(f"DeepSeek-V3.2 renders no {role!r} message")

    def result_text(self, i: int) -> str:
        """The ``k``-th result of the preceding assistant turn's ``n`` calls."""
        start = i
        while start > 0 and self.messages[start - 1].get("role") == "tool":
            start -= 1
        caller = self.messages[start - 1] if start > 0 else {}
        calls = caller.get("tool_calls") or () if caller.get("role") == "assistant" else ()
        n = len(list(jsontext.iterate(calls)))
        k = i - start + 1
        if k > n:
            raise TemplateError("DeepSeek-V3.2: a tool result without a matching call")
        head = "\n\n<function_results>" if k == 1 else ""
        text = f"{head}\n<result>{self.messages[i].get('content')}</result>"
        if k == n:
            opens = self.thinking and i >= self.last_user
            text += f"\n</function_results>\n\n{think_tag(opens)}"
        return text

    def assistant_text(self, i: int) -> str:
        m = self.messages[i]
        calls = history_calls(m, self.arguments)
        reasoning = reasoning_of(m, self.engine)
        head = ""
        if self.thinking and i > self.last_user:
            if not (reasoning or calls):
                raise TemplateError("DeepSeek-V3.2 (thinking): an assistant turn after the last "
                                    "user turn needs reasoning or tool calls")  # fmt: skip
            head = f"{reasoning or ''}{THINK_CLOSE}"
        block = f"\n\n{TAGS.block_text(calls, json_text)}" if calls else ""
        return f"{head}{m.get('content') or ''}{block}{EOS}"


def engine_messages(
    messages: list[dict[str, object]], tools: list[dict[str, object]] | None, engine: str
) -> list[dict[str, object]]:
    """The messages the engine's encoder gets: SGLang appends the tools to the first message, a
    system message (an empty one inserted where there is none); vLLM inserts a new system
    message for them, always."""
    msgs = [dict(m) for m in messages]
    if engine == SGLANG:
        msgs = sglang_last_assistant(msgs)
        if not msgs or msgs[0].get("role") != "system":
            msgs.insert(0, {"role": "system", "content": ""})
        if tools:
            msgs[0]["tools"] = tools
        return msgs
    served = vllm_tools(tools)
    return [{"role": "system", "tools": served}, *msgs] if served else msgs


class DeepSeekV32Family(DsmlFamily):
    """DeepSeek-V3.2 (module docstring)."""

    tags = TAGS
    vllm_tokenizer_mode = "deepseek_v32"

    def encode_prompt(
        self,
        messages: list[dict[str, object]],
        tools: list[dict[str, object]] | None,
        kwargs: Mapping[str, object],
        engine: str,
    ) -> str:
        """The prompt the engine renders (module docstring; any engine but SGLang: vLLM's)."""
        if engine == SGLANG:
            thinking = bool(kwargs.get("thinking", False))
            drop = True
        else:
            thinking = bool(kwargs.get("thinking") or kwargs.get("enable_thinking"))
            drop = bool(messages) and messages[-1].get("role") == "user"
        msgs = engine_messages(messages, tools, engine)
        if thinking and drop:
            check_nothing_dropped(msgs)
        return Encoder(msgs, thinking, engine).text()

    def token_hint(self, tokens: frozenset[str]) -> bool:
        """No V4 token (a V4 tokenizer holds the latest reminder, V4.1's the system token)."""
        return not {LATEST_REMINDER, SYSTEM} & tokens


DEEPSEEK_V32 = DeepSeekV32Family(
    name="deepseek_v32",
    title="DeepSeek-V3.2",
    end_of_turn=EOS,
    special_tokens=SPECIAL_TOKENS,
    turn_open_tokens=(USER, ASSISTANT),
    call_markers=(TAGS.opener, TAGS.invoke_opener),
    sglang=Parsers(tool="deepseekv32", reasoning="deepseek-v3"),
    vllm=Parsers(tool="deepseek_v32", reasoning="deepseek_v3"),
    aux_shift="first_is_one",
    thinking_kwarg="thinking",
    published_ids=PUBLISHED_IDS,
    published_vocab=VOCAB_SIZE,
    model_types=("deepseek_v32",),
    sglang_arguments="refuse",
)

__all__ = ["DEEPSEEK_V32", "PAD", "DeepSeekV32Family"]
