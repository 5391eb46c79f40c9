"""The family registry: recognition from a tokenizer folder, target.family, the fingerprint of
a Kimi run from before families, a target of no known family, and the train and serving
commands per family."""

from __future__ import annotations

import itertools
import json
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from regen.cli.main import main as regen_main
from regen.core.errors import ConfigError, TemplateError, TrapError
from regen.core.result import TurnResult
from regen.core.sample import Message, Sample, stable_hash
from regen.engine.failfast import check_family
from regen.engine.rows import build_turn_row
from regen.manifest import load_manifest, parse_manifest
from regen.targets import FAMILIES, UNKNOWN, family_named, recognise_dir
from regen.template.render import Renderer
from regen.template.tokenizer import load_tokenizer
from regen.train.checks import check_train_config
from regen.train.config import load_train_config

REPO = Path(__file__).resolve().parents[2]
KIMI_TOKENIZER = REPO / "manifests" / "demo" / "tokenizer"
#: the committed tiny tokenizer of each family that has one, and the family it is
TINY = {
    "kimi": KIMI_TOKENIZER,
    "qwen3": REPO / "manifests" / "demo-qwen3" / "tokenizer",
    "deepseek_v3": REPO / "manifests" / "demo-deepseek" / "tokenizer",
}
QWEN_TRAIN = REPO / "manifests" / "train-qwen3-235b-eagle3.yaml"
KIMI_TRAIN = REPO / "manifests" / "train-kimi-k25-eagle3.yaml"
DSV32_TRAIN = REPO / "manifests" / "train-deepseek-v32-eagle3.yaml"


@pytest.mark.parametrize("name", sorted(TINY))
def test_each_tiny_tokenizer_is_recognised_as_its_family_and_no_other(name: str) -> None:
    found = recognise_dir(TINY[name])
    assert found is not None and found.name == name
    from regen.targets import read_facts

    facts = read_facts(str(TINY[name]))
    assert [f.name for f in FAMILIES.values() if f.recognises(facts)] == [name]


def test_a_folder_without_a_tokenizer_is_of_no_known_family(tmp_path: Path) -> None:
    assert recognise_dir(tmp_path) is None


@pytest.mark.parametrize("case", ["model_type", "no_template", "dsml_template"])
def test_a_deepseek_v32_tokenizer_is_not_taken_for_v31(case: str, tmp_path: Path) -> None:
    """V3.2 holds V3.1's special tokens but writes DSML calls and has no chat template: it is
    recognised as V3.2 (regen.targets.deepseek_v32), never assembled in V3.1's call format."""
    folder = tmp_path / "tok"
    shutil.copytree(TINY["deepseek_v3"], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    if case == "model_type":
        (folder / "config.json").write_text(json.dumps({"model_type": "deepseek_v32"}))
    elif case == "no_template":
        config.pop("chat_template", None)
        (folder / "chat_template.jinja").unlink(missing_ok=True)
    else:
        config["chat_template"] = "{{ '<｜DSML｜function_calls>' }}"
        (folder / "chat_template.jinja").unlink(missing_ok=True)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    found = recognise_dir(folder)
    assert found is not None and found.name == "deepseek_v32"


def test_target_family_names_a_known_family_or_unknown(tmp_path: Path) -> None:
    base = {"name": "t", "target": {"model": "m", "tokenizer": str(KIMI_TOKENIZER)},
            "sources": [{"name": "s", "adapter": "sharegpt", "path": "x.jsonl"}]}  # fmt: skip
    with pytest.raises(ConfigError) as e:
        parse_manifest({**base, "target": {**base["target"], "family": "qwen9"}})
    assert "target.family" in str(e.value) and "qwen3" in str(e.value) and UNKNOWN in str(e.value)
    told = parse_manifest({**base, "target": {**base["target"], "family": UNKNOWN}})
    assert told.family() is None  # what the manifest says wins over the tokenizer
    recognised = parse_manifest(base)
    assert recognised.family() is family_named("kimi")
    assert recognised.with_family().target.family == "kimi"


def test_a_kimi_target_keeps_the_fingerprint_it_had_before_families() -> None:
    m = load_manifest(REPO / "manifests" / "demo.yaml")
    before = {"target": m.target.model_dump(mode="json"),
              "sampling": m.sampling.model_dump(mode="json")}  # fmt: skip
    del before["target"]["family"], before["target"]["chat_template"]  # fields added since
    assert m.settings_id() == stable_hash(before, n=8)
    assert m.with_family().fingerprint() == m.fingerprint()
    assert m.template_kwargs() == {"thinking": True}


def test_another_family_is_part_of_the_fingerprint_and_sends_its_own_switch() -> None:
    m = load_manifest(REPO / "manifests" / "demo-qwen3.yaml")
    assert m.family() is family_named("qwen3")
    assert m.template_kwargs() == {"enable_thinking": True}
    as_unknown = load_manifest(REPO / "manifests" / "demo-qwen3.yaml", ["target.family=unknown"])
    assert as_unknown.fingerprint() != m.fingerprint()
    assert as_unknown.settings_id() != m.settings_id()
    assert as_unknown.template_kwargs() == {}  # no switch is guessed


def test_an_unknown_family_needing_the_local_render_is_refused_in_one_line() -> None:
    m = load_manifest(REPO / "manifests" / "demo.yaml",
                      ["target.family=unknown", "sampling.token_ids=local"])  # fmt: skip
    with pytest.raises(ConfigError) as e:
        check_family(m)
    assert "\n" not in str(e.value) and "unknown" in str(e.value)
    check_family(m.model_copy(update={"sampling": m.sampling.model_copy(
        update={"token_ids": "stream"})}))  # fmt: skip


def test_an_unknown_family_renders_prompts_and_keeps_the_servers_ids() -> None:
    renderer = Renderer(load_tokenizer(KIMI_TOKENIZER), {}, None)
    msgs = [Message("user", "Hi?")]
    assert renderer.render_prompt(msgs).startswith("<|im_system|>")
    with pytest.raises(TemplateError, match="family is unknown"):
        renderer.render_text(msgs, None, reasoning=None, content="Hello.")
    eos = renderer.tokenizer.eos_token_id
    res = TurnResult(content="Hello.", reasoning=None, tool_calls=(), finish_reason="stop",
                     prompt_token_ids=[1, 2, 3], output_token_ids=[4, 5],
                     completion_tokens=2, prompt_tokens=3, model="m",
                     endpoint="http://127.0.0.1:9/v1")  # fmt: skip
    sample = Sample(id="s:1", source="s", messages=(*msgs, Message("assistant", "x")))
    row = build_turn_row(sample, 0, msgs, res, renderer)
    assert row["token_source"] == "server" and row["token_check"] == "server_only"
    assert row["input_ids"] == [1, 2, 3, 4, 5, eos] and row["family"] == UNKNOWN


def test_the_qwen3_production_config_passes_the_checks_without_the_kimi_aux_trap() -> None:
    cfg = load_train_config(QWEN_TRAIN)
    assert cfg.target.model_family() is family_named("qwen3")
    assert check_train_config(cfg) == [1, 46, 90]
    # SGLang's Qwen3 loader always adds 1: a list not starting at 1 is fine there, and
    # refused for Kimi, whose loader adds 1 only when the first id is 1
    shifted = yaml.safe_load(QWEN_TRAIN.read_text())
    shifted["draft"]["aux_layer_ids"] = [2, 46, 90]
    from regen.train.config import parse_train_config

    assert check_train_config(parse_train_config(shifted)) == [2, 46, 90]
    kimi = yaml.safe_load(KIMI_TRAIN.read_text())
    kimi["draft"]["aux_layer_ids"] = [2, 29, 57]
    with pytest.raises(TrapError) as e:
        check_train_config(parse_train_config(kimi))
    assert e.value.trap == "aux-layer-shift"


@pytest.mark.parametrize(
    ("config", "sglang", "vllm", "remote"),
    [
        (KIMI_TRAIN, ("kimi_k2", "kimi_k2"), ("kimi_k2", "kimi_k2"), True),
        (QWEN_TRAIN, ("qwen25", "qwen3"), ("hermes", "qwen3"), False),
        (DSV32_TRAIN, ("deepseekv32", "deepseek-v3"), ("deepseek_v32", "deepseek_v3"), False),
    ],
)
def test_serve_command_prints_the_familys_parser_flags(
    config: Path, sglang: tuple, vllm: tuple, remote: bool, tmp_path: Path, capsys
) -> None:
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    assert regen_main(["serve-command", str(draft), "--config", str(config)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("#")]
    sg, vl = (shlex.split(ln) for ln in lines)
    for argv, (tool, reasoning) in ((sg, sglang), (vl, vllm)):
        pairs = dict(itertools.pairwise(argv))
        assert (pairs["--tool-call-parser"], pairs["--reasoning-parser"]) == (tool, reasoning)
        assert ("--trust-remote-code" in argv) is remote
    assert "--enable-auto-tool-choice" in vl
    if config == DSV32_TRAIN:  # vLLM encodes V3.2's prompts in Python: its tokenizer mode
        assert dict(itertools.pairwise(vl))["--tokenizer-mode"] == "deepseek_v32"


def test_serve_command_without_a_family_prints_no_parser_flags(tmp_path: Path, capsys) -> None:
    assert regen_main(["serve-command", str(tmp_path), "--target", str(tmp_path / "absent"),
                       "--engine", "sglang"]) == 0  # fmt: skip
    out = capsys.readouterr()
    assert "--tool-call-parser" not in out.out and "family is unknown" in out.err


def test_a_family_that_reads_a_top_level_switch_gets_it_in_every_request(tmp_path: Path) -> None:
    """GPT-OSS: vLLM renders harmony itself from the request's top-level reasoning_effort."""
    from _families import family_tokenizer
    from _worker_config import client_for

    tok = family_tokenizer(FAMILIES["gpt_oss"], tmp_path)
    m = load_manifest(REPO / "manifests" / "demo.yaml",
                      [f"target.tokenizer={tok}", "sampling.thinking=false"])  # fmt: skip
    assert m.family() is FAMILIES["gpt_oss"]
    assert m.template_kwargs() == {"reasoning_effort": "low"}
    assert m.request_fields() == {"reasoning_effort": "low"}
    body = client_for(m).request_body([{"role": "user", "content": "Hi"}], None)
    assert body["reasoning_effort"] == "low"
    assert body["chat_template_kwargs"] == {"reasoning_effort": "low"}
    kimi = load_manifest(REPO / "manifests" / "demo.yaml")
    assert kimi.request_fields() == {}
    high = load_manifest(REPO / "manifests" / "demo.yaml",
                         [f"target.tokenizer={tok}", "sampling.thinking=high"])  # fmt: skip
    assert high.request_fields() == {"reasoning_effort": "high"}
    with pytest.raises(ConfigError, match=r"sampling\.thinking: 'max' is not a thinking effort"):
        load_manifest(
            REPO / "manifests" / "demo.yaml", [f"target.tokenizer={tok}", "sampling.thinking=max"]
        ).template_kwargs()


def test_a_family_that_contradicts_the_tokenizer_is_refused_in_one_line() -> None:
    m = load_manifest(REPO / "manifests" / "demo.yaml", ["target.family=qwen3"])
    with pytest.raises(ConfigError) as e:
        m.family()
    assert "'qwen3' contradicts the tokenizer" in str(e.value) and "('kimi')" in str(e.value)
    assert "\n" not in str(e.value)
    told = load_manifest(REPO / "manifests" / "demo.yaml", ["target.family=unknown"])
    assert told.family() is None  # asking for none is never a contradiction


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_serve_command_prints_each_familys_own_parsers(name: str, tmp_path: Path, capsys) -> None:
    family = FAMILIES[name]
    if family.aux_shift == "unsupported":  # SGLang 0.5.23 has no EAGLE-3 for it: vLLM's only
        assert regen_main(["serve-command", str(tmp_path), "--target", "/models/t", "--family",
                           name, "--engine", "sglang"]) == 2  # fmt: skip
        assert "use --engine vllm" in capsys.readouterr().err
        draft = {"architectures": ["LlamaForCausalLMEagle3"],
                 "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps(draft))
        assert regen_main(["serve-command", str(tmp_path), "--target", "/models/t", "--family",
                           name, "--engine", "vllm", "--vllm-draft-dir",
                           str(tmp_path / "vllm")]) == 0  # fmt: skip
        argv = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])
        assert argv[argv.index("--tokenizer-mode") + 1] == family.vllm_tokenizer_mode
        return
    assert regen_main(["serve-command", str(tmp_path), "--target", "/models/t", "--family",
                       name, "--engine", "sglang"]) == 0  # fmt: skip
    argv = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])
    pairs = dict(itertools.pairwise(argv))
    assert pairs.get("--tool-call-parser") == family.sglang.tool
    assert pairs.get("--reasoning-parser") == family.sglang.reasoning
    assert ("--trust-remote-code" in argv) is family.remote_code
