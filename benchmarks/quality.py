"""Benchmark: false flags of regen.quality on normal answers, and what it catches of degenerate
ones.

Normal answers (each checked as one regenerated turn with ``finish_reason`` stop or tool_calls):

- ``demo``: every assistant turn of the demo sources (manifests/demo), the sources' own answers;
- ``simulator``: regen.devkit.simulate's answer (called as a function) to every turn of the 1,500
  conversations of benchmarks/_workload.py and of the demo, thinking on, max_tokens 4,096;
  answers cut at max_tokens are reported apart (they are truncated, not normal);
- ``docs``: the Markdown descriptions of the installed packages (``*.dist-info/METADATA``),
  answers in prose with code, lists and tables (up to 12,000 characters each);
- ``code``: Python modules of the standard library and the installed packages as answers
  (up to 12,000 characters each);
- ``languages`` (where the machine has them): the translations in ``/usr/share/locale``
  (``.mo`` catalogs) of 14 languages in 11 scripts, the messages written mostly in the
  language's script: a prompt and an answer in the same language.

Degenerate answers made from the normal ones (the kinds the issue names): a sentence repeated
to max_tokens, a paragraph repeated to max_tokens, a loop with a counter that changes, an answer
that turns into a loop half-way, empty content after reasoning, reasoning cut at max_tokens, an
answer in another script (languages), a refusal, tool calls with broken or undeclared arguments.

The simulator's own degenerate answers (``--degenerate-rate 0.1``, regen.devkit.simulate.answer)
over the same workload and demo turns, each kind counted apart, normal ones for false flags.

Run: ``.venv/bin/python benchmarks/quality.py`` (~1-2 min). ``--examples N`` prints the first N
false flags of each kind.
"""

from __future__ import annotations

import argparse
import gettext
import random
import sys
import sysconfig
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import make_rows

from regen.devkit.simulate.answer import AnswerConfig, answer
from regen.manifest import load_manifest
from regen.quality import FLAGS, check_turn
from regen.quality.script import FAMILY, dominant, letters
from regen.sources import read_samples, source_set

REPO = Path(__file__).resolve().parents[1]
MAX_CHARS = 12_000
#: language → (locale folder, script)
LANGUAGES = {
    "zh_CN": "han",
    "zh_TW": "han",
    "ja": "kana",
    "ko": "hangul",
    "ru": "cyrillic",
    "uk": "cyrillic",
    "el": "greek",
    "he": "hebrew",
    "ar": "arabic",
    "hi": "devanagari",
    "th": "thai",
    "ka": "georgian",
    "fr": "latin",
    "de": "latin",
}

Item = tuple[str, dict[str, Any]]  # (id, check_turn keyword arguments)
REFUSALS = [
    "I'm sorry, but I can't help with that.",
    "I can’t assist with that request.",
    "I cannot help with this. However, here is some general information.",
]
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string"}},
            "required": ["q"],
        },
    },
}


def demo_items() -> Iterator[Item]:
    manifest = load_manifest(REPO / "manifests" / "demo.yaml")
    for s in read_samples(source_set(manifest)):
        if s.mode != "regenerate":
            continue
        for i, m in enumerate(s.messages):
            if m.role != "assistant":
                continue
            calls = [c.to_openai() for c in m.tool_calls]
            yield (
                f"{s.id}#{i}",
                {
                    "messages": [x.to_openai() for x in s.messages[:i]],
                    "reasoning": m.reasoning,
                    "content": m.content,
                    "tool_calls": calls,
                    "tools": s.tools,
                    "finish_reason": "tool_calls" if calls else "stop",
                },
            )


def simulator_items(degenerate_rate: float = 0.0) -> Iterator[tuple[str | None, Item]]:
    """(the simulator's degenerate kind or None, the turn) of every workload and demo turn."""
    requests: list[tuple[str, list[dict[str, Any]], Any]] = []
    for row in make_rows(1500):
        msgs: list[dict[str, Any]] = []
        for t in row["conversations"]:
            role = "user" if t["from"] == "human" else "assistant"
            if role == "assistant":
                requests.append((f"{row['id']}#{len(msgs)}", list(msgs), None))
            msgs.append({"role": role, "content": t["value"]})
    for sid, item in demo_items():
        requests.append((sid, item["messages"], item["tools"]))
    for sid, msgs, tools in requests:
        body = {"messages": msgs, "tools": tools, "max_tokens": 4096, "seed": 0,
                "chat_template_kwargs": {"thinking": True}}  # fmt: skip
        a = answer(body, AnswerConfig(degenerate_rate=degenerate_rate))
        yield (
            a.degenerate,
            (
                f"sim:{sid}",
                {
                    "messages": msgs,
                    "reasoning": a.reasoning,
                    "content": a.content,
                    "tool_calls": [c.as_openai(i) for i, c in enumerate(a.tool_calls)],
                    "tools": tools,
                    "finish_reason": a.finish_reason,
                },
            ),
        )


def _files(pattern_dirs: list[Path], glob: str, limit: int) -> list[Path]:
    out: list[Path] = []
    for d in pattern_dirs:
        out.extend(sorted(d.glob(glob)))
    random.Random(0).shuffle(out)
    return out[:limit]


def text_items(kind: str, limit: int) -> Iterator[Item]:
    purelib = Path(sysconfig.get_paths()["purelib"])
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    if kind == "docs":
        files = _files([purelib], "*.dist-info/METADATA", limit)
    else:
        files = _files([stdlib, purelib], "*/*.py", limit) + _files([stdlib], "*.py", limit // 4)
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if kind == "docs":
            text = text.split("\n\n", 1)[-1]  # the description, after the headers
        text = text[:MAX_CHARS].strip()
        if len(text) < 200:
            continue
        topic = f.parent.name if kind == "docs" else f.stem
        prompt = (
            f"Explain what the {topic} package does and how to use it."
            if kind == "docs"
            else f"Show me the source of {topic} and explain it briefly."
        )
        yield (
            f"{kind}:{f.parent.name}/{f.name}",
            {
                "messages": [{"role": "user", "content": prompt}],
                "reasoning": None,
                "content": text,
            },
        )


def catalog(lang: str) -> list[str]:
    """Translated messages of ``lang`` from the machine's ``.mo`` catalogs, those written
    mostly in the language's script (catalogs hold untranslated English too)."""
    family = FAMILY.get(LANGUAGES[lang], frozenset({LANGUAGES[lang]}))
    base = Path("/usr/share/locale") / lang / "LC_MESSAGES"
    texts: list[str] = []
    for mo in sorted(base.glob("*.mo")) if base.is_dir() else []:
        try:
            with mo.open("rb") as f:
                cat = gettext.GNUTranslations(f)
        except (OSError, UnicodeDecodeError):
            continue
        for key, value in cat._catalog.items():  # type: ignore[attr-defined]
            if isinstance(key, str) and key and isinstance(value, str) and len(value) > 30:
                counts = letters(value)
                if dominant(counts, 10) in family:
                    texts.append(value)
    return texts


def language_items(per_lang: int) -> tuple[list[Item], dict[str, list[str]]]:
    items: list[Item] = []
    answers: dict[str, list[str]] = {}
    for lang in LANGUAGES:
        texts = catalog(lang)
        if len(texts) < 50:
            continue
        rng = random.Random(lang)
        rng.shuffle(texts)
        answers[lang] = []
        for i in range(per_lang):
            prompt = " ".join(texts[3 * i : 3 * i + 2])
            content = "\n".join(rng.sample(texts, 12))
            answers[lang].append(content)
            items.append((f"lang:{lang}:{i}", {
                "messages": [{"role": "user", "content": prompt}],
                "reasoning": None,
                "content": content,
            }))  # fmt: skip
    return items, answers


def degenerate(
    normal: list[Item], answers: dict[str, list[str]]
) -> Iterator[tuple[str, str, Item]]:
    """``(kind, expected flag, item)`` made from normal answers."""
    rng = random.Random(1)
    texts = [it for it in normal if len((it[1]["content"] or "").split()) >= 40]
    rng.shuffle(texts)
    for n, (sid, kw) in enumerate(texts[:1200]):
        words = kw["content"].split()
        kind = n % 8
        start = rng.randrange(0, max(1, len(words) - 40))
        if kind == 0:  # one sentence to max_tokens
            unit = " ".join(words[start : start + rng.randint(4, 25)])
            content = " ".join([unit] * 400)[: rng.randint(6000, 16000)]
            yield (
                "loop: sentence",
                "repetition",
                (sid, {**kw, "content": content, "finish_reason": "length"}),
            )
        elif kind == 1:  # a paragraph to max_tokens
            unit = " ".join(words[start : start + rng.randint(40, 120)])
            content = "\n\n".join([unit] * 60)[:16000]
            yield (
                "loop: paragraph",
                "repetition",
                (sid, {**kw, "content": content, "finish_reason": "length"}),
            )
        elif kind == 2:  # a loop whose counter changes
            unit = " ".join(words[start : start + rng.randint(6, 20)])
            content = " ".join(f"Step {k}: {unit}." for k in range(300))[:16000]
            yield (
                "loop: with a counter",
                "repetition",
                (sid, {**kw, "content": content, "finish_reason": "length"}),
            )
        elif kind == 3:  # good half, then a loop
            unit = " ".join(words[start : start + rng.randint(5, 15)])
            content = kw["content"][:4000] + " " + " ".join([unit] * 300)
            yield (
                "loop: after a good start",
                "repetition",
                (sid, {**kw, "content": content[:16000], "finish_reason": "length"}),
            )
        elif kind == 4:
            yield (
                "empty content after reasoning",
                "empty_content",
                (sid, {**kw, "reasoning": kw["content"], "content": "", "finish_reason": "stop"}),
            )
        elif kind == 5:
            yield (
                "reasoning cut at max_tokens",
                "reasoning_unclosed",
                (sid, {**kw, "reasoning": kw["content"], "content": "", "finish_reason": "length"}),
            )
        elif kind == 6:
            phrase = rng.choice(REFUSALS)
            yield (
                "refusal",
                "refusal",
                (sid, {**kw, "content": phrase + " " + " ".join(words[:30])}),
            )
        else:
            tools = [SEARCH_TOOL]
            bad = rng.choice(['{"q": "x"', '{"query": "x"}', '["x"]', '{"q": 3}'])
            call = {
                "id": "functions.search:0",
                "type": "function",
                "function": {"name": "search", "arguments": bad},
            }
            yield (
                "bad tool call",
                "bad_tool_call",
                (sid, {**kw, "tools": tools, "tool_calls": [call], "finish_reason": "tool_calls"}),
            )
    langs = sorted(answers)
    cjk = {"han", "kana"}
    for lang in langs:  # a prompt in one script answered in another
        for other in langs:
            a, b = LANGUAGES[lang], LANGUAGES[other]
            if a == b or {a, b} <= cjk:
                continue
            for i, content in enumerate(answers[other][:3]):
                prompt = answers[lang][i][:300]
                yield "another script", "language_mismatch", (f"{lang}->{other}:{i}", {
                    "messages": [{"role": "user", "content": prompt}], "reasoning": None,
                    "content": content})  # fmt: skip
    scripts = [lang for lang in langs if LANGUAGES[lang] != "latin"]
    for i, (sid, kw) in enumerate(texts[:300] if scripts else []):  # English prompt, other script
        other = scripts[i % len(scripts)]
        content = answers[other][i % len(answers[other])]
        yield "another script", "language_mismatch", (f"{sid}->{other}", {**kw, "content": content})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--examples", type=int, default=0, help="false flags shown per flag")
    ap.add_argument("--files", type=int, default=600, help="docs and code files each")
    args = ap.parse_args()

    lang_items, answers = language_items(40)
    corpora: dict[str, list[Item]] = {
        "demo": list(demo_items()),
        "simulator": [item for _, item in simulator_items()],
        "docs": list(text_items("docs", args.files)),
        "code": list(text_items("code", args.files)),
        "languages": lang_items,
    }
    print(f"{'normal answers':<34} {'turns':>6} {'flagged':>8} {'rate':>7}  by flag")
    total = flagged_total = 0
    examples: dict[str, list[str]] = defaultdict(list)
    for name, items in corpora.items():
        flags: Counter[str] = Counter()
        flagged = cut = 0
        for sid, kw in items:
            q = check_turn(**{"tools": None, "tool_calls": [], "finish_reason": "stop", **kw})
            if kw.get("finish_reason") == "length":
                cut += 1
                continue
            flags.update(q.flags)
            flagged += bool(q.flags)
            for f in q.flags:
                examples[f].append(f"{name} {sid}: {q}")
        n = len(items) - cut
        total += n
        flagged_total += flagged
        by = ", ".join(f"{f} {flags[f]}" for f in FLAGS if flags[f]) or "-"
        extra = f" (+{cut} cut at max_tokens, not counted)" if cut else ""
        print(f"{name:<34} {n:>6} {flagged:>8} {flagged / max(n, 1):>7.2%}  {by}{extra}")
    print(f"{'all':<34} {total:>6} {flagged_total:>8} {flagged_total / max(total, 1):>7.2%}")

    normal = [it for name in ("demo", "docs", "code") for it in corpora[name]]
    print(f"\n{'degenerate answers':<34} {'turns':>6} {'caught':>8} {'rate':>7}  other flags")
    caught_by: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    others: dict[str, Counter[str]] = defaultdict(Counter)
    for kind, want, (sid, kw) in degenerate(normal, answers):
        q = check_turn(**{"tools": None, "tool_calls": [], "finish_reason": "stop", **kw})
        caught_by[kind][0] += 1
        caught_by[kind][1] += want in q.flags
        others[kind].update(f for f in q.flags if f != want)
        if want not in q.flags:
            examples[f"missed {kind}"].append(f"{sid}: {q}")
    all_n = all_c = 0
    for kind, (n, c) in caught_by.items():
        all_n += n
        all_c += c
        print(f"{kind:<34} {n:>6} {c:>8} {c / n:>7.2%}  {dict(others[kind]) or '-'}")
    print(f"{'all':<34} {all_n:>6} {all_c:>8} {all_c / max(all_n, 1):>7.2%}")
    head = "simulator --degenerate-rate 0.1"
    print(f"\n{head:<34} {'turns':>6} {'flagged':>8} {'rate':>7}  by flag")
    sim: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    sim_flags: dict[str, Counter[str]] = defaultdict(Counter)
    for kind, (sid, kw) in simulator_items(0.1):
        q = check_turn(**kw)
        key = kind or "normal"
        sim[key][0] += 1
        sim[key][1] += bool(q.flags)
        sim_flags[key].update(q.flags)
        if bool(q.flags) != (kind is not None):
            examples[f"simulator {key}"].append(f"{sid}: {q}")
    for key in ("normal", "loop", "empty", "language"):
        n, c = sim[key]
        print(f"{key:<34} {n:>6} {c:>8} {c / max(n, 1):>7.2%}  {dict(sim_flags[key]) or '-'}")
    deg_n = sum(sim[k][0] for k in sim if k != "normal")
    deg_c = sum(sim[k][1] for k in sim if k != "normal")
    print(f"{'degenerate, all kinds':<34} {deg_n:>6} {deg_c:>8} {deg_c / max(deg_n, 1):>7.2%}")
    if args.examples:
        for key, lines in sorted(examples.items()):
            print(f"\n{key}:")
            for line in lines[: args.examples]:
                print("  " + line[:400])


if __name__ == "__main__":
    main()
