"""DeepSeek-V4.1 (DeepSeek-AI): DeepSeek-V4's prompt with a system token and a numeric effort.

Owns no files. The format (vLLM 0.32 ``tokenizers/deepseek_v41_encoding.py`` and its wrapper
``tokenizers/deepseek_v41.py``; SGLang 0.5.23 through deepseek-recipe 0.2.0, as V4) is
:mod:`regen.targets.deepseek_v4`'s but:

- the DSML tags carry a leading space: ``<｜DSML｜ calls>``, ``<｜DSML｜ invoke name=…>``,
  ``<｜DSML｜ parameter …>``;
- ``<｜System｜>`` opens the prompt when the first message is a system message or an effort is
  written, and every later system message (which counts as a user turn: the history before it
  loses its reasoning, and a header follows it before an assistant turn or the generation);
- the effort is one line, ``<｜System｜>Reasoning Effort: {budget} (range 1-100, the higher the
  value, the more thorough the reasoning)\\n\\n``: ``low`` 50, ``high`` 75 (the default in both
  engines), ``max`` 100; vLLM also takes ``xhigh`` (75) and an integer 1..100 from the template
  kwargs and refuses other names; SGLang maps ``minimal`` 50, ``medium`` / ``xhigh`` 75,
  ``ultra`` 100 and takes a number (an integer 1..100, or a fraction below 1 as a percentage);
- vLLM's wrapper encodes the request's own messages, whose history arguments vLLM's
  preparation has already made objects (``{}`` for anything else, RUN); its encoder reads a
  text leniently (JSON encoded once or twice; anything else as the string parameter
  ``arguments``), which only a run rendering arguments as text (``legacy``) hands it; it
  accepts only system, developer, user, assistant and tool messages;
- vLLM needs ``--tokenizer-mode deepseek_v41`` unless the architecture is
  ``DeepseekV41ForCausalLM``; SGLang selects recipe with ``--tool-call-parser deepseekv41``.

Where the engines part ways, besides V4's (recipe writes system messages in place here, not
joined at the front): a first system message followed by an assistant turn gets a header in
recipe, none in vLLM; an empty system message is dropped by recipe, written (``<｜System｜>``)
by vLLM.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from regen.core import jsontext
from regen.core.errors import TemplateError
from regen.targets.deepseek_v4 import (
    VOCAB_SIZE,
    DeepSeekV4Family,
    sglang_effort,
    vllm_messages,
    vllm_thinking,
)
from regen.targets.dsml import (
    ASSISTANT,
    DSML,
    EOS,
    SYSTEM,
    THINK_CLOSE,
    THINK_OPEN,
    USER,
    Tags,
    call_arguments,
    function_of,
    json_text,
    wide_ints_as_floats,
)
from regen.targets.dsml_v4 import Dialect, Setting
from regen.targets.family import Parsers

TAGS = Tags(" calls", " invoke", " parameter")
#: the effort line and the budget of each named level (vLLM; recipe's names in RECIPE_BUDGETS)
EFFORT_LINE = (
    "Reasoning Effort: {budget} (range 1-100, the higher the value, the more thorough the "
    "reasoning)\n\n"
)
VLLM_BUDGETS = {"low": 50, "high": 75, "xhigh": 75, "max": 100}
RECIPE_BUDGETS = {"minimal": 50, "low": 50, "medium": 75, "high": 75, "xhigh": 75, "ultra": 100,
                  "max": 100}  # fmt: skip
#: the roles vLLM's V4.1 wrapper accepts
VLLM_ROLES = ("system", "developer", "user", "assistant", "tool")
SPECIAL_TOKENS = (EOS, USER, ASSISTANT, THINK_OPEN, THINK_CLOSE, DSML, SYSTEM)


def python_recipe_json(value: object) -> str:
    """How recipe writes V4.1's argument values and tool schemas: Python's JSON, integers
    beyond 64 bits as floats (RUN)."""
    return json_text(wide_ints_as_floats(value))


def lenient_arguments(call: Mapping[str, object]) -> Mapping[str, object]:
    """vLLM V4.1's history arguments: an object, or JSON text holding one (encoded once or
    twice); anything else as the string parameter ``arguments``."""
    raw = function_of(call).get("arguments")
    args = call_arguments(call)
    if isinstance(args, str):
        with contextlib.suppress(ValueError):
            args = jsontext.loads(args)
    return args if isinstance(args, dict) else {"arguments": raw}


def vllm_budget(effort: object) -> int:
    if type(effort) is int and 1 <= effort <= 100:
        return effort
    if isinstance(effort, str) and effort in VLLM_BUDGETS:
        return VLLM_BUDGETS[effort]
    raise TemplateError(f"vLLM refuses DeepSeek-V4.1 reasoning_effort {effort!r} (low, high, "
                        "xhigh, max, or an integer 1..100)")  # fmt: skip


def recipe_budget(effort: object) -> int:
    """SGLang's budget (``parse_effort_budget``; recipe's tiers for names)."""
    if effort is None:
        return RECIPE_BUDGETS["high"]
    if isinstance(effort, str):
        return RECIPE_BUDGETS[effort]
    if isinstance(effort, int) and 1 <= effort <= 100:
        return effort
    if isinstance(effort, float) and 0.0 <= effort <= 0.99:
        return max(1, round(effort * 100))
    raise TemplateError(f"SGLang refuses DeepSeek-V4.1 reasoning_effort {effort!r}")


class DeepSeekV41Family(DeepSeekV4Family):
    """DeepSeek-V4.1 (module docstring)."""

    tags = TAGS
    dialect = Dialect(TAGS, python_recipe_json, system_token=SYSTEM, system_is_user=True)
    vllm_tokenizer_mode = "deepseek_v41"

    def vllm_messages(
        self, messages: list[dict[str, object]], tools: list[dict[str, object]] | None
    ) -> list[dict[str, object]]:
        for m in messages:
            if m.get("role") not in VLLM_ROLES:
                raise TemplateError(f"vLLM refuses a {m.get('role')!r} message for DeepSeek-V4.1")
        return vllm_messages(messages, tools)

    def vllm_setting(self, kwargs: Mapping[str, object]) -> Setting:
        """vLLM's wrapper: thinking on by default, ``none`` switches it off; the budget."""
        thinking = vllm_thinking(kwargs)
        effort = kwargs.get("reasoning_effort")
        if effort == "none":
            thinking, effort = False, None
        budget = vllm_budget("high" if effort is None else effort)
        return Setting(thinking, self.effort_line(budget), recipe=False,
                       arguments=lenient_arguments,
                       drop=bool(kwargs.get("drop_thinking", True)))  # fmt: skip

    def sglang_setting(self, kwargs: Mapping[str, object]) -> Setting:
        return self.recipe_setting(kwargs, self.effort_line(recipe_budget(sglang_effort(kwargs))))

    @staticmethod
    def effort_line(budget: int) -> str:
        return EFFORT_LINE.format(budget=budget)

    def token_hint(self, tokens: frozenset[str]) -> bool:
        """DSML and V4.1's system token."""
        return DSML in tokens and SYSTEM in tokens


DEEPSEEK_V41 = DeepSeekV41Family(
    name="deepseek_v41",
    title="DeepSeek-V4.1",
    end_of_turn=EOS,
    special_tokens=SPECIAL_TOKENS,
    turn_open_tokens=(USER, ASSISTANT, SYSTEM),
    call_markers=(TAGS.opener, TAGS.invoke_opener),
    sglang=Parsers(tool="deepseekv41", reasoning="deepseek-v41"),
    vllm=Parsers(tool="deepseek_v41", reasoning="deepseek_v41"),
    aux_shift="unsupported",
    thinking_kwarg="thinking",
    efforts=("high", "low", "max"),
    published_vocab=VOCAB_SIZE,
    model_types=("deepseek_v41",),
    sglang_arguments="keep",
)
