"""Every request body regen sends validates against SGLang's own ``ChatCompletionRequest``.

SGLang's model has no ``extra`` config, so it silently drops keys it does not know (a
misspelt field would do nothing on a 24-55 h job). Here unknown keys are forbidden:
:func:`dropped_keys` walks the validated model beside the body and names every key SGLang
would have ignored, at any depth (messages, tool calls, tools, stream options)."""

from __future__ import annotations

import copy
import itertools
import warnings
from typing import Any

import pytest
from pydantic import BaseModel

from regen.client import ChatClient
from regen.core.sample import Message, ToolCall
from regen.manifest import Endpoint, Sampling

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]},
        },
    }
]  # fmt: skip

#: a history with everything regen puts in request messages: a system turn, an assistant turn
#: with reasoning and tool calls, the tool result, and a plain assistant turn
HISTORY = [
    Message("system", "Be brief."),
    Message("user", "Weather in Oslo?"),
    Message(
        "assistant",
        "",
        reasoning="I should call the tool.",
        tool_calls=(ToolCall("functions.get_weather:0", "get_weather", '{"city": "Oslo"}'),),
    ),
    Message("tool", "12 C, rain", tool_call_id="functions.get_weather:0"),
    Message("assistant", "It is 12 C and raining.", reasoning="Report it."),
    Message("user", "And tomorrow?"),
]


def dropped_keys(model: Any, data: Any, path: str = "") -> list[str]:
    """Keys of ``data`` the validated ``model`` has no field for (what SGLang drops)."""
    out: list[str] = []
    if isinstance(model, BaseModel) and isinstance(data, dict):
        names: dict[str, str] = {}
        for name, f in type(model).model_fields.items():
            names[name] = name
            if f.alias:
                names[f.alias] = name
        for key, value in data.items():
            if key not in names:
                out.append(path + key)
            else:  # __dict__: no deprecation warning for max_tokens
                out += dropped_keys(model.__dict__.get(names[key]), value, f"{path}{key}.")
    elif isinstance(model, list) and isinstance(data, list):
        for i, (m, d) in enumerate(zip(model, data, strict=False)):
            out += dropped_keys(m, d, f"{path}{i}.")
    return out


def bodies() -> list[tuple[str, dict[str, Any]]]:
    """Every shape of body regen sends to SGLang: ids streamed / whole / none, a server of no
    known engine (no extensions), thinking on and off, tools or not, seed and top_k or not,
    history or not."""
    out = []
    for mode, engine, thinking, tools, extras, history in itertools.product(
        ("stream", "nonstream", "local"), ("sglang", "openai"), (True, False), (None, TOOLS),
        (False, True), (False, True),
    ):  # fmt: skip
        sampling = Sampling(
            token_ids=mode,
            thinking=thinking,
            max_tokens=1234,
            top_k=20 if extras else None,
            seed=7 if extras else None,
            chat_template_kwargs={"preserve_thinking": True} if extras else {},
        )
        client = ChatClient(Endpoint(url="http://h:1/v1"), model="moonshotai/Kimi-K2.5",
                            sampling=sampling, engine=engine)  # fmt: skip
        msgs = [m.to_openai() for m in (HISTORY if history else HISTORY[-1:])]
        name = f"{mode}-{engine}-think{thinking}-tools{bool(tools)}-x{extras}-h{history}"
        out.append((name, client.request_body(msgs, tools)))
    return out


@pytest.mark.parametrize(("name", "body"), bodies(), ids=[n for n, _ in bodies()])
def test_every_request_body_is_sglangs_with_no_key_dropped(protocol, name, body) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # e.g. SGLang's max_tokens
        req = protocol.ChatCompletionRequest.model_validate(copy.deepcopy(body))
        sp = req.to_sampling_params(stop=[], model_generation_config={})
    assert dropped_keys(req, body) == [], f"SGLang would silently drop these ({name})"
    # serving_chat.py refuses return_token_ids / return_prompt_token_ids with stream (HTTP 400)
    assert not (req.stream and (req.return_token_ids or req.return_prompt_token_ids))
    assert sp["max_new_tokens"] == body["max_completion_tokens"] == 1234
    assert (sp["temperature"], sp["top_p"]) == (body["temperature"], body["top_p"])
    assert sp["sampling_seed"] == body.get("seed")
    assert sp["top_k"] == body.get("top_k", -1)
    assert req.chat_template_kwargs == body["chat_template_kwargs"]
    assert req.tool_choice == ("auto" if body.get("tools") else "none")
    if body.get("stream"):
        assert req.stream_options.include_usage is True
        ids = "-sglang-" in name and not name.startswith("local")
        assert req.return_input_ids_in_sglext is req.return_output_ids_in_sglext is ids
    else:  # a server of no known engine always streams
        assert "-sglang-" in name and req.return_prompt_token_ids and req.return_token_ids


def test_the_walker_names_what_sglang_would_drop(protocol) -> None:
    """SGLang accepts a misspelt key without a word; the test does not."""
    body = {"model": "m", "max_token": 5, "stream_options": {"include_usag": True},
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "", "reasoning": "x",
                          "tool_calls": [{"id": "t", "type": "function",
                                          "function": {"name": "f", "arguments": "{}",
                                                       "argz": 1}}]}]}  # fmt: skip
    req = protocol.ChatCompletionRequest.model_validate(copy.deepcopy(body))
    assert req.max_completion_tokens is None  # the misspelling did nothing, silently
    assert dropped_keys(req, body) == [
        "max_token",
        "stream_options.include_usag",
        "messages.1.reasoning",
        "messages.1.tool_calls.0.function.argz",
    ]
