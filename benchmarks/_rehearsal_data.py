"""The rehearsal's data: the production manifest's ten sources, generated locally in each
source's real row shape, and the manifest that reads them (issue 32). Imported by
``benchmarks/rehearsal.py`` and tests/reliability/test_rehearsal.py; writes only below the
work directory it is given.

The shapes are the adapters' (regen/sources/shapes.py; CONTRACTS §5 and §5b): ShareGPT
(``id`` like ``hRPPgZT_3``, ``conversations: [{from, value}]``, chunks that start with a
``gpt`` turn are rejected as ``assistant_first``, as ~36% of Aeala's rows are), UltraChat
(``prompt``, ``prompt_id``, ``messages``), OpenThoughts (``system`` + ``conversations`` with
``<|begin_of_thought|>`` answers), Perfect-Blend (``conversations``, ``source``, no id),
OpenCodeReasoning split_0 (``id``, ``input``, ``output`` with ``<think>``, ``source``,
``license``, ``dataset``, ``split``, ``difficulty`` on mixed scales, ``solution``), xLAM (int
``id``, ``query``, ``answers`` and ``tools`` as ``json.dumps`` strings, Python-style parameter
types), Glaive v2 (``system`` prose + indented function JSON, ``chat`` with ``USER:`` /
``ASSISTANT: <functioncall> {..., "arguments": '{...}'}`` / ``FUNCTION RESPONSE:``, turns
separated by ``\\n\\n\\n`` with functions and ``\\n\\n`` without, ~1.4% ending on a user turn),
SWE-Gym OpenHands trajectories (``instance_id``, ``run_id``, ``resolved``, ``messages`` whose
every message carries ``content, function_call, name, role, tool_call_id, tool_calls``, tool
messages back to back, ``tools``, ``test_result``), Magicoder Evol-Instruct (``instruction``,
``response``) and Kimi-native rows (Parquet ``id``, ``input_ids``, ``loss_mask`` in the demo's
tiny Kimi tokenizer, which the rehearsal's target uses).

Sizes follow the public datasets (lognormal characters per message, turn counts per source;
:data:`PROFILES`): ShareGPT ~3 assistant turns per chunk, UltraChat ~3.3, Perfect-Blend mostly
one, Glaive 1-4 exchanges with function calls, SWE-Gym trajectories of 5-60 steps (~36K
characters, a long tail), OpenThoughts and OpenCodeReasoning with reasoning answers of ~10K
characters. Each original answer's length shares half of its log variance with the
simulator's draw for the same prompt (``regen simulate --prompt-share``; the manifest's seed is
null, as production's), so the originals predict the target's lengths as another model's
answers would. Text is random words from a few thousand pseudo-words (no two prompts are near
duplicates); every good row is kept by the plan, so the counts are the manifest's limits.

Files, under ``WORK/data/``: ``{source}.jsonl`` for the nine regenerated sources,
``kimi_native.parquet``, and ``counts.json`` (good rows, extra rejected rows, exact duplicates
and requests per source); the manifest is ``WORK/manifest.yaml``.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import string
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from regen.devkit.simulate.answer import prompt_z

REPO = Path(__file__).resolve().parents[1]
PRODUCTION = REPO / "manifests" / "kimi-k25-eagle3.yaml"
TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"
MODEL = "rehearsal-kimi-k25"

#: the production manifest's counts (88,088 samples; 83,288 regenerated)
FULL_COUNTS: dict[str, int] = {
    "sharegpt": 15000,
    "ultrachat": 15000,
    "openthoughts": 10000,
    "perfectblend": 15000,
    "opencodereasoning": 8000,
    "xlam": 5000,
    "glaive": 4288,
    "swe_gym": 6000,
    "magicoder": 5000,
    "kimi_native": 4800,
}
FULL_TOTAL = sum(FULL_COUNTS.values())
#: the share of a prompt's log answer length fixed by the prompt (simulator and originals)
PROMPT_SHARE = 0.5
#: production's answers per regenerated turn average ~1,300 tokens (the manifest's bands);
#: the simulator's mean and sampling.max_tokens are production's ÷ the output scale
PRODUCTION_MEAN_TOKENS = 1300.0
PRODUCTION_MAX_TOKENS = 16384


@dataclass(slots=True, frozen=True)
class Profile:
    """Sizes of one source's rows (characters are lognormal: median, sigma, cap)."""

    user: tuple[float, float, int]  #: a user message
    answer: tuple[float, float, int]  #: an original answer (its visible part)
    reasoning: tuple[float, float, int] | None = None  #: its reasoning block, if any
    turns: tuple[tuple[int, float], ...] = ((1, 1.0),)  #: (user turns, weight)


PROFILES: dict[str, Profile] = {
    "sharegpt": Profile(
        (160, 1.3, 9000),
        (1100, 0.8, 9000),
        None,
        (
            (1, 33),
            (2, 20),
            (3, 13),
            (4, 9),
            (5, 7),
            (6, 5),
            (7, 4),
            (8, 3),
            (9, 2),
            (10, 2),
            (12, 1),
            (16, 1),
        ),
    ),
    "ultrachat": Profile(
        (180, 0.9, 4000),
        (1500, 0.6, 7000),
        None,
        ((1, 8), (2, 22), (3, 30), (4, 22), (5, 10), (6, 5), (7, 3)),
    ),
    "openthoughts": Profile((650, 0.7, 6000), (1400, 0.7, 8000), (11000, 0.6, 60000)),
    "perfectblend": Profile(
        (320, 1.2, 12000), (750, 0.9, 8000), None, ((1, 88), (2, 7), (3, 3), (4, 1), (5, 1))
    ),
    "opencodereasoning": Profile((1800, 0.5, 9000), (1500, 0.6, 8000), (9000, 0.6, 50000)),
    "xlam": Profile((170, 0.5, 800), (0, 0, 0)),
    "glaive": Profile(
        (140, 0.6, 1500), (320, 0.7, 2500), None, ((1, 45), (2, 35), (3, 15), (4, 5))
    ),
    "swe_gym": Profile((1400, 0.5, 6000), (180, 0.6, 1200)),
    "magicoder": Profile((480, 0.7, 5000), (1500, 0.6, 7000)),
}
#: ShareGPT chunks that start with a ``gpt`` turn (rejected as ``assistant_first``) per good row
SHAREGPT_GPT_FIRST = 0.36 / 0.64
#: exact duplicates (dropped by dedup) per good row, for the sources that have them upstream
DUPLICATES = {"sharegpt": 0.01, "ultrachat": 0.005, "perfectblend": 0.01}


# -- text -------------------------------------------------------------------------------------


def _vocabulary(seed: int = 20261203) -> tuple[list[str], list[str]]:
    """Pseudo-words (prose) and code-ish tokens, fixed for every run."""
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ne", "ra", "tu", "se", "vi", "po", "da", "gre", "stra", "ion",
            "ent", "al", "or", "th", "sh", "qu", "ble", "ing", "ed", "er", "an", "is", "co",
            "pre", "con", "ti", "mo", "ba", "fe", "lu", "zo", "wi", "ya"]  # fmt: skip
    common = ["the", "of", "and", "to", "a", "in", "is", "that", "for", "it", "with", "as",
              "on", "this", "be", "are", "by", "how", "what", "why", "can", "you", "please",
              "write", "explain", "function", "list", "code", "data", "value", "error",
              "return", "example", "number", "file", "use", "which", "when", "then"]  # fmt: skip
    words = set(common)
    while len(words) < 4000:
        words.add("".join(rng.choice(syll) for _ in range(rng.randint(1, 4))))
    code = ["def", "return", "if", "else", "for", "in", "range(n)", "x", "i", "j", "=", "==",
            "+=", "(", ")", ":", "[", "]", "self", "print(", "import", "from", "class",
            "None", "True", "len(a)", "{", "}", "0", "1", "n", "res", "dp[i]", "->", "int",
            "str", "while", "break", "#", "\n    ", "\n        ", "\n"]  # fmt: skip
    code += rng.sample(sorted(words), 900)
    return sorted(words), code


WORDS, CODE = _vocabulary()


class Text:
    """Random text of a given size from the fixed vocabularies."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def size(self, spec: tuple[float, float, int], lo: int = 48) -> int:
        """Characters drawn from ``spec``, at least ``lo`` (eight words or so: a prompt of
        one or two words would be a near-duplicate of another, which the plan drops)."""
        median, sigma, cap = spec
        if median <= 0:
            return 0
        return int(min(cap, max(lo, math.exp(self.rng.gauss(math.log(median), sigma)))))

    def prose(self, chars: int) -> str:
        if chars <= 0:
            return ""
        words = self.rng.choices(WORDS, k=max(1, chars // 6))
        out: list[str] = []
        for i in range(0, len(words), 14):
            sentence = " ".join(words[i : i + 14])
            out.append(sentence[:1].upper() + sentence[1:] + ".")
        return " ".join(out)

    def code(self, chars: int) -> str:
        return " ".join(self.rng.choices(CODE, k=max(1, chars // 4)))

    def ident(self, n: int = 7) -> str:
        return "".join(self.rng.choices(string.ascii_letters + string.digits, k=n))

    def hexid(self, n: int = 32) -> str:
        return f"{self.rng.getrandbits(4 * n):0{n}x}"

    def weighted(self, choices: tuple[tuple[int, float], ...]) -> int:
        values, weights = zip(*choices, strict=True)
        return self.rng.choices(values, weights=weights, k=1)[0]


def original_size(text: Text, spec: tuple[float, float, int], user_text: str) -> int:
    """An original answer's characters: lognormal, sharing :data:`PROMPT_SHARE` of its log
    variance with the simulator's draw for ``user_text`` (manifest seed null)."""
    median, sigma, cap = spec
    if median <= 0:
        return 0
    z = math.sqrt(PROMPT_SHARE) * prompt_z(None, user_text)
    z += math.sqrt(1.0 - PROMPT_SHARE) * text.rng.gauss(0.0, 1.0)
    return int(min(cap, max(8, median * math.exp(sigma * z))))


# -- the sources ------------------------------------------------------------------------------


@dataclass(slots=True)
class Good:
    """One good row and the requests it makes (its regenerated turns)."""

    row: dict[str, Any]
    requests: int


def _sharegpt(t: Text, i: int) -> Good:
    p = PROFILES["sharegpt"]
    conv: list[dict[str, str]] = []
    if t.rng.random() < 0.05:
        conv.append({"from": "system", "value": t.prose(t.size((200, 0.8, 2000)))})
    turns = t.weighted(p.turns)
    for k in range(turns):
        user = f"{t.prose(t.size(p.user))}"
        if k == 0 and t.rng.random() < 0.15:  # pasted code
            user += "\n```\n" + t.code(t.size((900, 0.9, 6000))) + "\n```"
        conv.append({"from": "human", "value": user})
        who = t.rng.choice(("gpt", "gpt", "gpt", "chatgpt", "bing", "bard"))
        conv.append({"from": who, "value": t.prose(original_size(t, p.answer, user))})
    if t.rng.random() < 0.08:  # a chunk that ends on the user's turn
        conv.append({"from": "human", "value": t.prose(t.size(p.user))})
    return Good({"id": f"{t.ident()}_{t.rng.randint(0, 12)}", "conversations": conv}, turns)


def _sharegpt_gpt_first(t: Text) -> dict[str, Any]:
    g = _sharegpt(t, 0).row
    g["conversations"] = [{"from": "gpt", "value": t.prose(t.size((900, 0.8, 6000)))}]
    g["conversations"] += [c for c in _sharegpt(t, 0).row["conversations"] if c["from"] != "system"]
    return g


def _ultrachat(t: Text, i: int) -> Good:
    p = PROFILES["ultrachat"]
    turns = t.weighted(p.turns)
    msgs: list[dict[str, str]] = []
    first = ""
    for k in range(turns):
        user = t.prose(t.size(p.user if k else (320, 0.9, 4000)))
        first = first or user
        msgs.append({"role": "user", "content": user})
        msgs.append({"role": "assistant", "content": t.prose(original_size(t, p.answer, user))})
    pid = hashlib.sha256(first.encode()).hexdigest()
    return Good({"prompt": first, "prompt_id": pid, "messages": msgs}, turns)


OPENTHOUGHTS_SYSTEM = (
    "Your role as an assistant involves thoroughly exploring questions through a systematic "
    "long thinking process before providing the final precise and accurate solutions. This "
    "requires engaging in a comprehensive cycle of analysis, summarizing, exploration, "
    "reassessment, reflection, backtracing, and iteration to develop well-considered thinking "
    "process. Please structure your response into two main sections: Thought and Solution. In "
    "the Thought section, detail your reasoning process using the specified format: "
    "<|begin_of_thought|> {thought with steps separated with '\\n\\n'} <|end_of_thought|> Each "
    "step should include detailed considerations such as analisying questions, summarizing "
    "relevant findings, brainstorming new ideas, verifying the accuracy of the current steps, "
    "refining any errors, and revisiting previous steps. In the Solution section, based on "
    "various attempts, explorations, and reflections from the Thought section, systematically "
    "present the final solution that you deem correct. The solution should remain a logical, "
    "accurate, concise expression style and detail necessary step needed to reach the "
    "conclusion, formatted as follows: <|begin_of_solution|> {final formatted, precise, and "
    "clear solution} <|end_of_solution|> Now, try to solve the following question through the "
    "above guidelines:"
)


def _openthoughts(t: Text, i: int) -> Good:
    p = PROFILES["openthoughts"]
    user = t.prose(t.size(p.user))
    assert p.reasoning is not None
    answer = (
        f"<|begin_of_thought|>\n\n{t.prose(original_size(t, p.reasoning, user))}\n\n"
        f"<|end_of_thought|>\n\n<|begin_of_solution|>\n\n{t.prose(t.size(p.answer))}\n\n"
        "<|end_of_solution|>"
    )
    conv = [{"from": "user", "value": user}, {"from": "assistant", "value": answer}]
    return Good({"system": OPENTHOUGHTS_SYSTEM, "conversations": conv}, 1)


PB_SOURCES = ("slimorca", "metamath", "code_feedback", "magicoder", "orca_math",
              "airoboros", "openhermes", "capybara", "ultrainteract", "tulu_v2")  # fmt: skip


def _perfectblend(t: Text, i: int) -> Good:
    p = PROFILES["perfectblend"]
    conv: list[dict[str, str]] = []
    if t.rng.random() < 0.1:
        conv.append({"from": "system", "value": t.prose(t.size((150, 0.7, 1500)))})
    turns = t.weighted(p.turns)
    for _ in range(turns):
        user = t.prose(t.size(p.user))
        conv.append({"from": "human", "value": user})
        conv.append({"from": "gpt", "value": t.prose(original_size(t, p.answer, user))})
    return Good({"conversations": conv, "source": t.rng.choice(PB_SOURCES)}, turns)


OCR_DIFFICULTY = ("interview", "introductory", "competition", "EASY", "MEDIUM", "MEDIUM_HARD",
                  "HARD", "VERY_HARD", "2", "5", "7", "UNKNOWN_DIFFICULTY")  # fmt: skip


def _opencodereasoning(t: Text, i: int) -> Good:
    p = PROFILES["opencodereasoning"]
    assert p.reasoning is not None
    problem = t.prose(t.size(p.user))
    problem += "\n\nInput\n\n" + t.prose(200) + "\n\nOutput\n\n" + t.prose(120)
    code = t.code(t.size(p.answer))
    output = f"<think>\n{t.prose(original_size(t, p.reasoning, problem))}\n</think>\n\n"
    output += f"```python\n{code}\n```"
    row = {
        "id": t.hexid(),
        "input": problem,
        "output": output,
        "source": t.rng.choice(("codeforces", "atcoder", "codechef", "hackerrank", "aizu")),
        "license": t.rng.choice(("cc-by-4.0", "apache-2.0", "mit")),
        "dataset": t.rng.choice(("code_contests", "taco", "apps")),
        "split": "train",
        "difficulty": t.rng.choice(OCR_DIFFICULTY),
        "solution": code,
    }
    return Good(row, 1)


XLAM_TYPES = ("str", "int", "float", "bool", "List[int]", "List[str]", "str, optional",
              "int, optional", "Dict[str, Any]", "float, optional")  # fmt: skip


def _xlam_tool(t: Text) -> dict[str, Any]:
    params = {}
    for _ in range(t.rng.randint(1, 4)):
        kind = t.rng.choice(XLAM_TYPES)
        spec: dict[str, Any] = {"description": t.prose(t.size((60, 0.5, 200))), "type": kind}
        if "optional" in kind or t.rng.random() < 0.3:
            spec["default"] = "" if t.rng.random() < 0.5 else t.rng.randint(1, 50)
        params[f"{t.rng.choice(WORDS)}_{t.rng.choice(WORDS)}"] = spec
    name = "_".join(t.rng.choices(WORDS, k=2))
    return {"name": name, "description": t.prose(t.size((90, 0.5, 300))), "parameters": params}


def _xlam(t: Text, i: int) -> Good:
    tools = [_xlam_tool(t) for _ in range(t.weighted(((1, 45), (2, 25), (3, 18), (4, 12))))]
    answers = []
    for _ in range(t.weighted(((1, 60), (2, 30), (3, 10)))):
        tool = t.rng.choice(tools)
        args = {k: (t.rng.randint(0, 100) if "int" in v["type"] else t.rng.choice(WORDS))
                for k, v in tool["parameters"].items() if "optional" not in v["type"]}  # fmt: skip
        answers.append({"name": tool["name"], "arguments": args})
    row = {"id": i, "query": t.prose(t.size(PROFILES["xlam"].user)),
           "answers": json.dumps(answers), "tools": json.dumps(tools)}  # fmt: skip
    return Good(row, 1)


def _glaive(t: Text, i: int) -> Good:
    p = PROFILES["glaive"]
    with_fns = t.rng.random() < 0.6
    sep = "\n\n\n" if with_fns else "\n\n"
    fns: list[dict[str, Any]] = []
    if with_fns:
        for _ in range(t.weighted(((1, 70), (2, 30)))):
            props = {f"{t.rng.choice(WORDS)}": {"type": t.rng.choice(("string", "number")),
                                                "description": t.prose(40)}
                     for _ in range(t.rng.randint(1, 3))}  # fmt: skip
            fns.append({"name": "_".join(t.rng.choices(WORDS, k=2)),
                        "description": t.prose(t.size((60, 0.5, 200))),
                        "parameters": {"type": "object", "properties": props,
                                       "required": list(props)[:1]}})  # fmt: skip
        system = ("SYSTEM: You are a helpful assistant with access to the following functions. "
                  "Use them if required -\n"
                  + "\n".join(json.dumps(f, indent=4) for f in fns) + "\n\n")  # fmt: skip
    else:
        system = "SYSTEM: You are a helpful assistant, with no access to external functions.\n\n"
    parts: list[str] = []
    requests = 0
    for _ in range(t.weighted(p.turns)):
        user = t.prose(t.size(p.user))
        parts.append(f"USER: {user}")
        if fns and t.rng.random() < 0.7:
            fn = t.rng.choice(fns)
            args = {k: t.rng.choice(WORDS) for k in fn["parameters"]["properties"]}
            call = json.dumps({"name": fn["name"], "arguments": "@@"})
            call = call.replace('"@@"', "'" + json.dumps(args) + "'")  # Glaive's quoted args
            parts.append(f"ASSISTANT: <functioncall> {call} <|endoftext|>")
            result = {t.rng.choice(WORDS): t.rng.choice(WORDS), "value": t.rng.randint(1, 999)}
            parts.append(f"FUNCTION RESPONSE: {json.dumps(result)}")
            requests += 1
        answer = t.prose(original_size(t, p.answer, user))
        parts.append(f"ASSISTANT: {answer} <|endoftext|>")
        requests += 1
    if t.rng.random() < 0.014:  # ends on the user's turn
        parts.append(f"USER: {t.prose(t.size(p.user))}")
    return Good({"system": system, "chat": sep.join(parts) + sep}, requests)


SWE_TOOLS = [
    {"type": "function", "function": {
        "name": "execute_bash",
        "description": "Execute a bash command in the terminal.\n* Long running commands: "
                       "For commands that may run indefinitely, run them in the background.",
        "parameters": {"type": "object", "properties": {"command": {
            "type": "string", "description": "The bash command to execute."}},
            "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "str_replace_editor",
        "description": "Custom editing tool for viewing, creating and editing files\n* State "
                       "is persistent across command calls and discussions with the user",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "enum": ["view", "create", "str_replace",
                                                   "insert", "undo_edit"]},
            "path": {"type": "string", "description": "Absolute path to file or directory."},
            "old_str": {"type": "string"}, "new_str": {"type": "string"},
            "view_range": {"type": "array", "items": {"type": "integer"}}},
            "required": ["command", "path"]}}},
    {"type": "function", "function": {
        "name": "finish", "description": "Finish the interaction when the task is complete.",
        "parameters": {"type": "object", "properties": {}}}},
]  # fmt: skip
SWE_SYSTEM_CHARS = 3600


def _swe_message(role: str, content: str | None, **extra: Any) -> dict[str, Any]:
    msg = {"content": content, "function_call": None, "name": None, "role": role,
           "tool_call_id": None, "tool_calls": None}  # fmt: skip
    msg.update(extra)
    return msg


def _swe_gym(t: Text, i: int) -> Good:
    repo = t.rng.choice(("getmoto__moto", "pandas-dev__pandas", "python__mypy", "dask__dask",
                         "iterative__dvc", "conan-io__conan", "pydantic__pydantic"))  # fmt: skip
    task = t.prose(t.size(PROFILES["swe_gym"].user))
    msgs = [
        _swe_message("system", "You are OpenHands agent, a helpful AI assistant that can "
                     "interact with a computer to solve tasks.\n" + t.prose(SWE_SYSTEM_CHARS)),
        _swe_message("user", f"<uploaded_files>\n/workspace/{repo}\n</uploaded_files>\n{task}"),
    ]  # fmt: skip
    steps = int(min(50, max(4, math.exp(t.rng.gauss(math.log(14), 0.5)))))
    n = 0
    for _ in range(steps):
        calls = []
        for _ in range(2 if t.rng.random() < 0.12 else 1):
            name = t.rng.choice(("execute_bash", "execute_bash", "str_replace_editor"))
            if name == "execute_bash":
                args = {"command": t.code(t.size((80, 0.6, 600)))}
            else:
                args = {"command": t.rng.choice(("view", "str_replace")),
                        "path": f"/workspace/{repo}/{t.rng.choice(WORDS)}.py"}  # fmt: skip
                if args["command"] == "str_replace":
                    args["old_str"] = t.code(t.size((200, 0.6, 2000)))
                    args["new_str"] = t.code(t.size((220, 0.6, 2000)))
            calls.append({"id": f"toolu_{i:05d}{n:03d}", "type": "function",
                          "function": {"name": name, "arguments": json.dumps(args)}})  # fmt: skip
            n += 1
        msgs.append(_swe_message("assistant", t.prose(t.size(PROFILES["swe_gym"].answer)),
                                 tool_calls=calls))  # fmt: skip
        for c in calls:  # back to back when there are two
            out = t.code(t.size((550, 1.0, 30000)))
            msgs.append(_swe_message("tool", out, tool_call_id=c["id"],
                                     name=c["function"]["name"]))  # fmt: skip
    msgs.append(_swe_message("assistant", t.prose(original_size(t, (600, 0.6, 4000), task))))
    row = {"instance_id": f"{repo}-{t.rng.randint(1000, 9999)}", "run_id": t.hexid(12),
           "resolved": t.rng.random() < 0.4, "messages": msgs, "tools": SWE_TOOLS,
           "test_result": {"exit_code": t.rng.choice((0, 1))}}  # fmt: skip
    return Good(row, 1)


def _magicoder(t: Text, i: int) -> Good:
    p = PROFILES["magicoder"]
    instruction = t.prose(t.size(p.user))
    if t.rng.random() < 0.4:
        instruction += "\n```python\n" + t.code(t.size((400, 0.7, 3000))) + "\n```"
    response = t.prose(original_size(t, p.answer, instruction) // 2)
    response += "\n```python\n" + t.code(t.size((700, 0.6, 4000))) + "\n```"
    return Good({"instruction": instruction, "response": response}, 1)


GENERATORS: dict[str, Callable[[Text, int], Good]] = {
    "sharegpt": _sharegpt,
    "ultrachat": _ultrachat,
    "openthoughts": _openthoughts,
    "perfectblend": _perfectblend,
    "opencodereasoning": _opencodereasoning,
    "xlam": _xlam,
    "glaive": _glaive,
    "swe_gym": _swe_gym,
    "magicoder": _magicoder,
}


# -- Kimi-native rows -------------------------------------------------------------------------


def _native_rows(t: Text, n: int) -> Iterator[dict[str, Any]]:
    """Rows already in the (demo tokenizer's) Kimi format: system + user prefix (mask 0),
    the assistant's ``<think>...</think>answer<|im_end|>`` (mask 1)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    for i in range(n):
        user = t.prose(t.size((400, 0.9, 6000)))
        prefix = ("<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by "
                  f"Moonshot AI.<|im_end|><|im_user|>user<|im_middle|>{user}<|im_end|>"
                  "<|im_assistant|>assistant<|im_middle|>")  # fmt: skip
        body = (f"<think>{t.prose(t.size((1500, 0.8, 12000)))}</think>"
                f"{t.prose(t.size((1200, 0.7, 8000)))}<|im_end|>")  # fmt: skip
        head = tok.encode(prefix, add_special_tokens=False)
        tail = tok.encode(body, add_special_tokens=False)
        yield {"id": f"native-{i:06d}", "input_ids": head + tail,
               "loss_mask": [0] * len(head) + [1] * len(tail)}  # fmt: skip


# -- writing ----------------------------------------------------------------------------------


@dataclass(slots=True)
class SourceCounts:
    good: int = 0  #: rows the plan keeps (the manifest's limit)
    rejected: int = 0  #: extra rows an adapter rejects
    duplicates: int = 0  #: extra exact duplicates of good rows
    requests: int = 0  #: regenerated turns of the good rows
    bytes: int = 0


@dataclass(slots=True)
class Data:
    """What was written: per-source counts, the manifest and the output scale."""

    counts: dict[str, SourceCounts] = field(default_factory=dict)
    manifest: Path = Path()
    scale: int = 16

    @property
    def samples(self) -> int:
        return sum(c.good for c in self.counts.values())

    @property
    def requests(self) -> int:
        return sum(c.requests for c in self.counts.values())

    def to_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "requests": self.requests, "output_scale": self.scale,
                "sources": {k: asdict(v) for k, v in self.counts.items()}}  # fmt: skip


def scaled_counts(samples: int) -> dict[str, int]:
    """The ten sources' counts scaled to ``samples`` in all (each at least 1)."""
    if samples >= FULL_TOTAL:
        return dict(FULL_COUNTS)
    out = {k: max(1, round(v * samples / FULL_TOTAL)) for k, v in FULL_COUNTS.items()}
    return out


def write_sources(data_dir: Path, counts: dict[str, int], seed: int = 0) -> dict[str, SourceCounts]:
    """The ten source files; returns what each holds."""
    data_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, SourceCounts] = {}
    for name, gen in GENERATORS.items():
        t = Text(random.Random(f"{seed}:{name}"))
        c = out[name] = SourceCounts(good=counts[name])
        dup_rate = DUPLICATES.get(name, 0.0)
        path = data_dir / f"{name}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for i in range(counts[name]):
                if name == "sharegpt" and t.rng.random() < SHAREGPT_GPT_FIRST / (
                    1 + SHAREGPT_GPT_FIRST
                ):
                    f.write(json.dumps(_sharegpt_gpt_first(t), ensure_ascii=False) + "\n")
                    c.rejected += 1
                g = gen(t, i)
                line = json.dumps(g.row, ensure_ascii=False) + "\n"
                f.write(line)
                c.requests += g.requests
                if dup_rate and t.rng.random() < dup_rate:
                    f.write(line)
                    c.duplicates += 1
        c.bytes = path.stat().st_size
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = Text(random.Random(f"{seed}:kimi_native"))
    rows = list(_native_rows(t, counts["kimi_native"]))
    table = pa.table({
        "id": pa.array([r["id"] for r in rows], pa.string()),
        "input_ids": pa.array([r["input_ids"] for r in rows], pa.list_(pa.int32())),
        "loss_mask": pa.array([r["loss_mask"] for r in rows], pa.list_(pa.int8())),
    })  # fmt: skip
    path = data_dir / "kimi_native.parquet"
    pq.write_table(table, path)
    out["kimi_native"] = SourceCounts(good=len(rows), bytes=path.stat().st_size)
    return out


def stall_settings() -> dict[str, Any]:
    """The engine's stall-detection fields, where this regen has them (issue 32, part 1)."""
    from regen.manifest import Engine

    fields = Engine.model_fields
    return {"stall_timeout_s": None, "stall_min_s": 30.0} if "stall_min_s" in fields else {}


def write_manifest(
    work: Path,
    data_dir: Path,
    counts: dict[str, int],
    *,
    scale: int,
    engine: dict[str, Any] | None = None,
    name: str = "rehearsal",
) -> Path:
    """Production's manifest with local sources at ``counts``, the demo's tiny Kimi tokenizer
    as the target's, output lengths ÷ ``scale`` and ``engine`` overrides."""
    m = yaml.safe_load(PRODUCTION.read_text(encoding="utf-8"))
    m["name"] = name
    m["target"] = {"model": MODEL, "tokenizer": str(TOKENIZER), "template": "kimi-k2.5",
                   "trust_remote_code": False}  # fmt: skip
    m["sampling"]["max_tokens"] = PRODUCTION_MAX_TOKENS // scale
    m["endpoints"] = []
    m["engine"] = {**m["engine"], **stall_settings(), **(engine or {})}
    for s in m["sources"]:
        s.pop("hub", None)
        s["path"] = str(data_dir / (f"{s['name']}.parquet" if s["name"] == "kimi_native"
                                    else f"{s['name']}.jsonl"))  # fmt: skip
        s["limit"] = counts[s["name"]]
        if "output_tokens" in s:
            s["output_tokens"] = [max(1, v // scale) for v in s["output_tokens"]]
    path = work / "manifest.yaml"
    path.write_text(yaml.safe_dump(m, sort_keys=False), encoding="utf-8")
    return path


def make_data(
    work: Path, samples: int, *, scale: int, seed: int = 0, engine: dict[str, Any] | None = None
) -> Data:
    """Sources for ``samples`` (all ten, proportional) and the manifest, under ``work``."""
    counts = scaled_counts(samples)
    data_dir = work / "data"
    written = write_sources(data_dir, counts, seed)
    manifest = write_manifest(work, data_dir, counts, scale=scale, engine=engine)
    data = Data(written, manifest, scale)
    (data_dir / "counts.json").write_text(json.dumps(data.to_dict(), indent=1))
    return data
