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
from regen.plan import build_plan, limits_band

REPO = Path(__file__).resolve().parents[1]
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


# (read, rejected by reason, filtered by filter, duplicates, kept, regenerate turns)
DEMO_COUNTS: dict[str, tuple[int, dict[str, int], dict[str, int], int, int, int]] = {
    "sharegpt": (
        14,
        {"assistant_first": 1, "invalid_utf8": 1, "malformed_json": 1, "unknown_role": 1},
        {},
        1,
        9,
        12,
    ),
    "ultrachat": (11, {"empty_turn": 1, "no_user_turn": 1}, {}, 1, 8, 10),
    "openthoughts": (9, {"missing_field": 1}, {"max_prompt_chars": 1}, 0, 7, 7),
    "perfectblend": (10, {"wrong_type": 1}, {}, 1, 8, 9),
    "opencodereasoning": (9, {"empty_prompt": 1, "missing_field": 1}, {}, 0, 7, 7),
    "xlam": (9, {"bad_tool_json": 2}, {}, 0, 7, 7),
    "glaive": (9, {"bad_tool_json": 1, "malformed_chat": 1}, {}, 0, 7, 14),
    "swe_gym": (8, {"bad_tool_json": 1, "no_user_turn": 1}, {}, 0, 6, 6),
    "magicoder": (10, {"empty_prompt": 1}, {}, 1, 8, 8),
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
        4,
        0,
    ),
}


def test_demo_plan_counts_exact(demo_plan: dict[str, Any]) -> None:
    keys = ("read", "rejected", "filtered", "duplicates", "kept", "regenerate_turns")
    got = {name: tuple(s[k] for k in keys) for name, s in demo_plan["sources"].items()}
    assert got == DEMO_COUNTS
    assert list(demo_plan["sources"]) == list(DEMO_COUNTS)  # manifest order


def test_demo_plan_totals_tokens_and_band(demo_plan: dict[str, Any]) -> None:
    total = demo_plan["total"]
    assert total["kept_regenerate"] == 67 >= 60  # the engine's e2e test needs >= 60
    assert total["kept_native"] == 4
    assert total["duplicates"] == 5 and total["rejected"] == 22 and total["filtered"] == 1
    assert demo_plan["token_estimate"] == "tokenizer"  # demo/tokenizer exists
    assert all(
        s["prompt_tokens"] > 0 for s in demo_plan["sources"].values() if s["mode"] == "regenerate"
    )
    assert demo_plan["sources"]["sharegpt"]["output_tokens"] == [12 * 24, 12 * 48]
    assert demo_plan["sources"]["kimi_native"]["output_tokens"] == [0, 0]
    lo, hi = total["output_tokens"]
    assert demo_plan["hours"] == [round(lo / 830 / 3600, 2), round(hi / 830 / 3600, 2)]
    assert demo_plan["sources"]["kimi_native"]["native_tokens"] > 0


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
