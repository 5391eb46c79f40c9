"""`regen train` on a REAL demo run (the demo target served by transformers serve, regen run
through Ray): SpecForge's own CLI plans what regen writes, the export is `regen export`'s row
for row, a run against the wrong target is refused, and SpecForge's own loop trains on CPU.

One demo run per session (``demo_run``); each test works on its own copy.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from train_fixtures import PRODUCTION_TRAIN, REPO, demo_train_config

from regen.cli.main import main as regen_main
from regen.store import layout as L

pytestmark = [pytest.mark.ray, pytest.mark.server, pytest.mark.timeout(1500)]

SPECFORGE = Path(sys.executable).parent / "specforge"
#: steps of the CPU training test (the issue asks for at least 20)
CPU_STEPS = 24


@pytest.fixture
def run_copy(demo_run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(demo_run, out)
    return out


@pytest.fixture
def demo_yaml(tmp_path: Path, demo_target: Path):
    def write(**over) -> Path:
        p = tmp_path / "demo-train.yaml"
        p.write_text(yaml.safe_dump(demo_train_config(demo_target, **over)))
        return p

    return write


def _specforge_plan(run_yaml: Path) -> dict:
    """SpecForge 0.2.0's own CLI: ``specforge train --config RUN_YAML --plan``."""
    proc = subprocess.run([str(SPECFORGE), "train", "--config", str(run_yaml), "--plan"],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _lines(export: Path) -> list[str]:
    return [
        line
        for shard in sorted(export.glob("shard-*.jsonl"))
        for line in shard.read_text().splitlines()
    ]


def test_the_demo_targets_answers_finish_like_a_real_targets(demo_run: Path) -> None:
    """Of the regenerated answers of a real demo run: at least 80 % end with <|im_end|> (not
    max_tokens) and close their reasoning (content or a tool call after </think>, as the
    server's parser split them). Of the turns the target was taught to answer with a tool call
    (the build's own turns, matched by prompt ids), at least 80 % call one in Kimi's section
    format that the server parsed, and at least a quarter of those calls fit the declared tools.

    Later turns of a tool conversation are not matched: their history holds the tool-call ids
    transformers serve made up (``REQUEST_tool_call_N``, where Kimi's parser gives
    ``functions.NAME:N``), a prompt the demo target never saw."""
    from regen.devkit.demo_target import training_turns
    from regen.manifest import load_manifest

    rows = [r for p in sorted((demo_run / L.PARTS_DIR).glob("*.parquet"))
            for r in pq.read_table(p).to_pylist() if r["token_source"] != "native"]  # fmt: skip
    assert len(rows) > 60

    def calls(r: dict) -> list:
        return json.loads(r["tool_calls"]) if r["tool_calls"] else []

    def prompt(r: dict) -> tuple[int, ...]:
        return tuple(r["input_ids"][: r["loss_mask"].index(1)])

    finished = [r for r in rows if r["finish_reason"] != "length" and not r["truncated"]]
    closed = [r for r in rows if (r["content"] or "").strip() or calls(r)]
    assert min(len(finished), len(closed)) >= 0.8 * len(rows), (len(finished), len(closed))
    turns = training_turns(load_manifest(REPO / "manifests" / "demo.yaml"))
    taught = {tuple(t.prompt_ids) for t in turns if t.calls_tools}
    tool_turns = [r for r in rows if prompt(r) in taught]
    called = [r for r in tool_turns if calls(r)]
    fit = [r for r in called if "bad_tool_call" not in r["quality_flags"]]
    assert len(tool_turns) >= 8
    assert len(called) >= 0.8 * len(tool_turns), (len(called), len(tool_turns))
    # a share, not most: the tiny target's arguments are its weakest skill, and its greedy
    # answers change with the batch they run in under continuous batching (4 of 11 to 8 of 10
    # calls fitted the declared tools across CI runs); a target that never fits fails here
    assert len(fit) >= 0.25 * len(called), (len(fit), len(called))


def test_specforge_cli_plans_the_demo_runs_dry_run(run_copy: Path, demo_yaml, capsys) -> None:
    assert regen_main(["train", str(run_copy), "--config", str(demo_yaml()), "--dry-run"]) == 0
    out = capsys.readouterr().out
    run_yaml = run_copy / L.RUN_YAML
    assert "vocab mapping: 256 of 1,024 ids" in out and "SpecForge's planner" in out
    plan = _specforge_plan(run_yaml)
    assert (plan["kind"], plan["role"]) == ("supervisor", "both")
    assert [c["label"] for c in plan["commands"]] == ["producer", "consumer"]
    run = yaml.safe_load(run_yaml.read_text())
    assert run["model"]["vocab_mapping_path"] == str(run_copy / L.VOCAB_MAPPING)
    vocab = json.loads((run_copy / L.VOCAB_MAPPING_RECORD).read_text())
    stats = json.loads((run_copy / L.EXPORT_DIR / L.EXPORT_STATS).read_text())
    assert vocab["rows"] == stats["rows_written"] and vocab["loss_tokens"] == stats["loss_tokens"]
    assert vocab["draft_vocab_size"] == 256 and 0.9 < vocab["coverage"] <= 1.0
    recorded = json.loads((run_copy / L.SPECFORGE_PLAN).read_text())
    assert recorded["where"] == "submit" and recorded["plan"]["commands"] == plan["commands"]
    tokenizer = json.loads((run_copy / L.TOKENIZER_RECORD).read_text())
    assert tokenizer["vocab_size"] == 1024 and tokenizer["probe_ids"]


def test_train_exports_exactly_what_regen_export_keeps(
    run_copy: Path, demo_yaml, tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the per-source table unabridged
    manifest = yaml.safe_load((run_copy / L.MANIFEST).read_text())
    assert manifest["export"]["drop_flags"] and manifest["export"]["drop_truncated"]
    assert regen_main(["train", str(run_copy), "--config", str(demo_yaml()), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    train_stats = json.loads((run_copy / L.EXPORT_DIR / L.EXPORT_STATS).read_text())
    # regen export with the same settings: the manifest's, and training.max_length
    max_length = str(train_stats["max_length"])
    assert regen_main(["export", str(run_copy), "--out", str(tmp_path / "x"),
                       "--max-length", max_length]) == 0  # fmt: skip
    export_stats = json.loads((tmp_path / "x" / L.EXPORT_STATS).read_text())
    assert _lines(run_copy / L.EXPORT_DIR) == _lines(tmp_path / "x")  # row by row, in order
    for key in ("rows_read", "rows_written", "dropped", "drop_flags", "sources"):
        assert train_stats[key] == export_stats[key], key
    assert train_stats["rows_written"] > 40
    for name, src in train_stats["sources"].items():  # what it dropped, per source and reason
        dropped = ", ".join(f"{k} {v}" for k, v in sorted(src["dropped"].items())) or "-"
        assert any(name in line and dropped in line for line in printed.splitlines()), name
    assert "exported now: there is no export yet" in printed
    # an export made with other row-deciding settings is redone, not trained on
    assert regen_main(["export", str(run_copy), "--out", str(run_copy / L.EXPORT_DIR),
                       "--drop-flags", "none", "--keep-truncated"]) == 0  # fmt: skip
    assert regen_main(["train", str(run_copy), "--config", str(demo_yaml()), "--dry-run"]) == 0
    assert "the export's settings differ (drop_truncated was False, now True)" in (
        capsys.readouterr().out
    )
    assert _lines(run_copy / L.EXPORT_DIR) == _lines(tmp_path / "x")


def test_an_export_dropping_too_much_is_refused_in_one_line(
    run_copy: Path, demo_yaml, capsys
) -> None:
    lengths = sorted(
        n for p in (run_copy / L.PARTS_DIR).glob("*.parquet")
        for n in pq.read_table(p, columns=["num_tokens"]).column("num_tokens").to_pylist()
    )  # fmt: skip
    cut = lengths[len(lengths) // 3]  # rows longer than this: about two thirds of them
    cfg = demo_yaml(export={"max_length": cut})
    assert regen_main(["train", str(run_copy), "--config", str(cfg), "--dry-run"]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "too_long" in errors[0] and "--allow-drops" in errors[0]
    assert not (run_copy / L.EXPORT_DIR).exists()  # refused before anything was written
    argv = ["train", str(run_copy), "--config", str(cfg), "--dry-run", "--allow-drops"]
    assert regen_main(argv) == 0
    stats = json.loads((run_copy / L.EXPORT_DIR / L.EXPORT_STATS).read_text())
    assert stats["dropped"]["too_long"] > stats["rows_written"]


def test_a_demo_run_against_the_kimi_k25_config_is_refused_naming_the_vocab_size(
    run_copy: Path, capsys
) -> None:
    argv = ["train", str(run_copy), "--config", str(PRODUCTION_TRAIN), "--dry-run"]
    assert regen_main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert "[run-vs-target-tokenizer] tokenizer vocab size" in errors[0]
    assert "1,024 tokens" in errors[0] and "163,840" in errors[0]
    assert not (run_copy / L.RUN_YAML).exists()


def test_the_target_tokenizer_is_held_against_the_run_field_by_field(
    run_copy: Path, demo_target: Path, tmp_path: Path, capsys
) -> None:
    """A target whose tokenizer moved one special token, then one whose template differs."""
    other = tmp_path / "target"
    shutil.copytree(demo_target, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    by_name = {t["content"]: t for t in tok["added_tokens"]}
    end, pad = by_name["<|im_end|>"], by_name["[PAD]"]
    end["id"], pad["id"] = pad["id"], end["id"]
    tok["added_tokens"].sort(key=lambda t: t["id"])  # tokenizers numbers them in list order
    (other / "tokenizer.json").write_text(json.dumps(tok))
    cfg = tmp_path / "t.yaml"
    cfg.write_text(yaml.safe_dump(demo_train_config(other)))
    assert regen_main(["train", str(run_copy), "--config", str(cfg), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "special token id <|im_end|>: the run was regenerated with 1011" in err
    shutil.copy2(demo_target / "tokenizer.json", other / "tokenizer.json")
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["chat_template"] = config["chat_template"].replace("tool_declare", "tools")
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    assert regen_main(["train", str(run_copy), "--config", str(cfg), "--dry-run"]) == 2
    assert "chat template rendering of the probe conversation" in capsys.readouterr().err


def test_specforge_cli_plans_the_production_config(
    run_dir: Path, tmp_path: Path, write_train_yaml
) -> None:
    """The production config (manifests/train-kimi-k25-eagle3.yaml, 8 GPUs, disaggregated) on
    Kimi-framed rows, against a stand-in target directory with Kimi-K2.5's config.json shape
    and no weights: what regen's shape check reads (SpecForge's planner reads only run.yaml)."""
    standin = tmp_path / "Kimi-K2.5"
    standin.mkdir()
    (standin / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": {"model_type": "deepseek_v3", "num_hidden_layers": 61,
                        "hidden_size": 7168, "vocab_size": 163840},
    }))  # fmt: skip
    prod = yaml.safe_load(PRODUCTION_TRAIN.read_text())
    prod["target"]["path"] = str(standin)
    cfg = write_train_yaml(prod, name="prod.yaml")
    assert regen_main(["train", str(run_dir), "--config", str(cfg), "--dry-run"]) == 0
    plan = _specforge_plan(run_dir / L.RUN_YAML)
    consumer = plan["commands"][1]
    assert consumer["label"] == "consumer" and "--nproc_per_node" in consumer["argv"]
    assert consumer["argv"][consumer["argv"].index("--nproc_per_node") + 1] == "8"
    producer = plan["commands"][0]
    assert producer["label"] == "producer" and producer["argv"][-2:] == ["--role", "producer"]
    # the producer reads the capture servers from run.yaml, Mooncake's endpoints from its env
    run = yaml.safe_load((run_dir / L.RUN_YAML).read_text())
    assert run["deployment"]["disaggregated"]["server_urls"] == [
        "http://capture-0:30000",
        "http://capture-1:30000",
    ]
    assert producer["env"]["MOONCAKE_MASTER_SERVER_ADDR"] == "mooncake-master:50051"
    mapping = json.loads((run_dir / L.VOCAB_MAPPING_RECORD).read_text())
    assert (mapping["vocab_size"], mapping["draft_vocab_size"]) == (163840, 32000)


def test_specforge_trains_the_draft_on_cpu_and_the_held_out_loss_falls(
    run_copy: Path, demo_target: Path
) -> None:
    from regen.devkit.cpu_train import train_on_cpu

    result = train_on_cpu(
        run_copy, REPO / "manifests" / "demo-train.yaml", steps=CPU_STEPS,
        target_path=str(demo_target),
    )  # fmt: skip
    curve = result.curve
    assert [s for s, _ in curve.train] == list(range(1, CPU_STEPS + 1))
    (s0, first), (s_end, last) = curve.held_out[0], curve.held_out[-1]
    assert (s0, s_end) == (0, CPU_STEPS)
    assert last < 0.95 * first, curve.held_out
    # SpecForge's expected acceptance, at the same held-out evaluations
    assert [s for s, _ in curve.held_out_acceptance] == [s for s, _ in curve.held_out]
    assert curve.checkpoint and any(Path(curve.checkpoint).iterdir())
    # regen's own draft config, run.yaml model section and vocab mapping were trained on
    regen_run = yaml.safe_load((run_copy / L.RUN_YAML).read_text())
    cpu_run = yaml.safe_load(result.run_yaml.read_text())
    assert cpu_run["model"] == regen_run["model"]
    assert cpu_run["model"]["draft_model_config"] == str(run_copy / L.DRAFT_CONFIG)
    assert cpu_run["model"]["vocab_mapping_path"] == str(run_copy / L.VOCAB_MAPPING)
    assert json.loads((run_copy / L.CPU_CURVE).read_text())["held_out"][0][0] == 0
