"""`regen plan`: exact demo counts through the real CLI, the production band, offline failure."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from regen.cli.main import main
from regen.manifest import load_manifest, parse_manifest
from regen.plan.report import build_plan, limits_band
from regen.sources import read_samples, source_set

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "manifests" / "demo.yaml"
PROD = REPO / "manifests" / "kimi-k25-eagle3.yaml"


def regen_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "regen", *args],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "400", **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def demo_plan() -> dict[str, Any]:
    out = regen_cli("plan", str(DEMO), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# (read, rejected by reason, filtered by filter, duplicates, near-duplicates, kept,
#  regenerate turns)
DEMO_COUNTS: dict[str, tuple[int, dict[str, int], dict[str, int], int, int, int, int]] = {
    "sharegpt": (
        14,
        {"assistant_first": 1, "invalid_utf8": 1, "malformed_json": 1, "unknown_role": 1},
        {},
        1,
        0,
        9,
        12,
    ),
    "ultrachat": (16, {"empty_turn": 1, "no_user_turn": 1}, {}, 1, 4, 9, 11),
    "openthoughts": (9, {"missing_field": 1}, {"max_prompt_chars": 1}, 0, 0, 7, 7),
    "perfectblend": (10, {"wrong_type": 1}, {}, 1, 0, 8, 9),
    "opencodereasoning": (12, {"empty_prompt": 1, "missing_field": 1}, {}, 0, 2, 8, 8),
    "xlam": (9, {"bad_tool_json": 2}, {}, 0, 0, 7, 7),
    "glaive": (9, {"bad_tool_json": 1, "malformed_chat": 1}, {}, 0, 0, 7, 14),
    "swe_gym": (8, {"bad_tool_json": 1, "no_user_turn": 1}, {}, 0, 0, 6, 6),
    "magicoder": (10, {"empty_prompt": 1}, {}, 1, 0, 8, 8),
    "kimi_native": (
        10,
        {
            "id_out_of_vocab": 1,
            "length_mismatch": 1,
            "mask_all_zero": 1,
            "mask_value": 1,
            "no_turn_tokens": 1,
        },
        {},
        1,
        0,
        4,
        0,
    ),
}

# The planted near-duplicates (manifests/demo.yaml): (dropped id, id of the prompt it repeats)
DEMO_NEAR = {
    ("ultrachat", "sharegpt"): [
        ("ultrachat:uc0012#98933ee7", "sharegpt:sg_0005#bc0b6501"),  # whitespace
        ("ultrachat:uc0013#d24a03d4", "sharegpt:sg_0008#e68060db"),  # casing
        ("ultrachat:uc0014#8c6adbd6", "sharegpt:sg_0003#933c2d0a"),  # another system prompt
        ("ultrachat:uc0015#02f9fea6", "sharegpt:sg_0002#77376296"),  # a trailing "Thanks!"
    ],
    ("opencodereasoning", "openthoughts"): [
        ("opencodereasoning:ocr010#49cbf9dc", "openthoughts:h318b837c818c5260"),
        ("opencodereasoning:ocr011#b27af4c0", "openthoughts:h95b355d113a66f33"),
    ],
}


def test_demo_plan_counts_exact(demo_plan: dict[str, Any]) -> None:
    keys = ("read", "rejected", "filtered", "duplicates", "near_duplicates", "kept")
    keys += ("regenerate_turns",)
    got = {name: tuple(s[k] for k in keys) for name, s in demo_plan["sources"].items()}
    assert got == DEMO_COUNTS
    assert list(demo_plan["sources"]) == list(DEMO_COUNTS)  # manifest order


def test_demo_plan_totals_tokens_and_band(demo_plan: dict[str, Any]) -> None:
    total = demo_plan["total"]
    assert total["kept_regenerate"] == 69 >= 60  # the engine's e2e test needs >= 60
    assert total["kept_native"] == 4
    assert total["duplicates"] == 5 and total["rejected"] == 22 and total["filtered"] == 1
    assert total["near_duplicates"] == 6
    assert demo_plan["token_estimate"] == "tokenizer"  # demo/tokenizer exists
    assert all(
        s["prompt_tokens"] > 0 for s in demo_plan["sources"].values() if s["mode"] == "regenerate"
    )
    assert demo_plan["sources"]["sharegpt"]["output_tokens"] == [12 * 24, 12 * 48]
    assert demo_plan["sources"]["kimi_native"]["output_tokens"] == [0, 0]
    lo, hi = total["output_tokens"]
    assert demo_plan["hours"] == [round(lo / 830 / 3600, 2), round(hi / 830 / 3600, 2)]
    assert demo_plan["sources"]["kimi_native"]["native_tokens"] > 0


def test_demo_plan_reports_the_planted_near_duplicates_exactly(demo_plan: dict[str, Any]) -> None:
    near = demo_plan["near_duplicates"]
    assert (near["near"], near["threshold"], near["shingle"], near["num_perm"]) == (
        True,
        0.85,
        5,
        128,
    )
    assert (near["bands"], near["rows"], near["total"]) == (14, 9, 6)
    got = {
        (p["source"], p["duplicate_of"]): (
            p["count"],
            [(e["id"], e["duplicate_of"]) for e in p["examples"]],
        )
        for p in near["pairs"]
    }
    assert got == {pair: (len(ids), ids[:3]) for pair, ids in DEMO_NEAR.items()}
    assert [(p["source"], p["duplicate_of"]) for p in near["pairs"]] == list(DEMO_NEAR)
    examples = [e for p in near["pairs"] for e in p["examples"]]
    assert all(0.85 <= e["similarity"] <= 1.0 for e in examples)
    assert examples[1]["prompt"] == "HOW DO I UNDO THE LAST GIT COMMIT BUT KEEP MY CHANGES?"


def test_demo_near_duplicates_dropped_are_the_planted_ones_and_ids_stay() -> None:
    on = {s.id for s in read_samples(source_set(load_manifest(DEMO)))}
    off = {s.id for s in read_samples(source_set(load_manifest(DEMO, ["dedup.near=false"])))}
    planted = {dropped for ids in DEMO_NEAR.values() for dropped, _ in ids}
    assert off - on == planted and on <= off  # the others keep their ids
    kept_originals = {orig for ids in DEMO_NEAR.values() for _, orig in ids}
    assert kept_originals <= on
    near_misses = {"ultrachat:uc0016#07bde64f", "opencodereasoning:ocr012#8013c537"}
    assert near_misses <= on


def test_cli_near_off_counts_no_near_duplicates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(DEMO), "--json", "-o", "dedup.near=false"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["total"]["near_duplicates"] == 0 and plan["near_duplicates"]["pairs"] == []
    assert plan["total"]["kept"] == 73 + 6
    assert main(["plan", str(DEMO), "-o", "dedup.near=false"]) == 0
    assert "near-duplicates: not checked" in capsys.readouterr().out


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_production_plan_offline_fails_on_sharegpt_in_one_line(tmp_path: Path) -> None:
    env = {
        "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}",  # unreachable, even with internet
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "0",
    }
    out = regen_cli("plan", str(PROD), env=env)
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: source 'sharegpt': sources.0.hub: hub dataset")
    assert "Traceback" not in out.stderr


def test_production_limits_band_is_the_seeds_24_to_55_hours() -> None:
    m = load_manifest(PROD)
    regen_prompts = sum(s.limit or 0 for s in m.sources if s.mode == "regenerate")
    assert regen_prompts == 83288
    lo, hi = limits_band(m, 830)
    assert round(lo) == 24 and round(hi) == 55


def test_cli_overrides_limit_and_sampling(capsys: pytest.CaptureFixture[str]) -> None:
    overrides = ["-o", "sources.sharegpt.limit=3", "-o", "sampling.temperature=0"]
    rc = main(["plan", str(DEMO), "--json", *overrides])
    assert rc == 0
    plan = json.loads(capsys.readouterr().out)
    sg = plan["sources"]["sharegpt"]
    assert (sg["kept"], sg["limit"], sg["limit_reached"], sg["read"]) == (3, 3, True, 3)


def test_cli_bad_override_exits_2_naming_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(DEMO), "-o", "sampling.temperature=hot"]) == 2
    err = capsys.readouterr().err
    assert "sampling.temperature" in err and "valid number" in err


def test_cli_table_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(DEMO), "--tok-per-s", "10"]) == 0
    out = capsys.readouterr().out
    assert "plan: demo" in out and "sharegpt" in out and "time band at 10 tok/s" in out
    assert "malformed_json" in out
    assert "near-duplicates dropped: 6" in out
    matrix = out[out.index("near-duplicates dropped") :]
    head = next(line for line in matrix.splitlines() if "duplicate of" in line)
    assert head.split("┃")[2:4] == [" sharegpt ", " openthoughts "]
    cells = {line.split("│")[1].strip(): line.split("│")[2:4] for line in matrix.splitlines()
             if line.startswith("│")}  # fmt: skip
    assert [c.strip() for c in cells["ultrachat"]] == ["4", "·"]
    assert [c.strip() for c in cells["opencodereasoning"]] == ["·", "2"]


def test_chars_estimate_without_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"instruction": "x" * 10, "response": "y"})
        + "\n"
        + json.dumps({"instruction": "z" * 4})
        + "\n"
    )
    m = parse_manifest(
        {
            "name": "t",
            "target": {"model": "m", "tokenizer": "missing-dir"},
            "sources": [
                {"name": "a", "adapter": "magicoder", "path": "a.jsonl", "output_tokens": [10, 30]}
            ],
        },
        base_dir=tmp_path,
    )
    plan = build_plan(m, tok_per_s=1.0)
    assert plan.token_estimate == "chars/4"
    assert plan.sources[0].prompt_tokens == 3 + 1  # ceil(10/4) + ceil(4/4)
    assert plan.output_tokens == (20, 60)
    assert plan.hours == (20 / 3600, 60 / 3600)
