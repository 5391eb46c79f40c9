"""regen.devkit.loop.servers: a draft vLLM would serve wrong is refused before any server process
starts.

The drafts are SpecForge's own EAGLE-3 class saved as its exporter saves one
(tests/engines/_models.py), and the vLLM copy is written by `regen serve-command`'s own code.
The "python" the servers would start is a script that leaves a mark when it runs: a refused
draft leaves none; the accepted one runs it (and, not being vLLM, fails to become ready).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engines"))

from _models import build_eagle1_draft, build_eagle3_draft, build_scripted_target

from regen.core.errors import EndpointError, TrapError
from regen.devkit.loop.servers import speculative_server, vllm_python
from regen.serve.vllm import write_vllm_draft


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loop-serve")
    target = build_scripted_target(root / "target")
    draft = build_eagle3_draft(root / "draft", target, [1, 2, 3])
    return {"target": target, "draft": draft, "copy": write_vllm_draft(draft),
            "eagle1": build_eagle1_draft(root / "eagle1", target)}  # fmt: skip


@pytest.fixture
def marking_python(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for vLLM's Python that writes a mark and exits 3."""
    mark = tmp_path / "started"
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\necho started > {mark}\nexit 3\n")
    py.chmod(0o755)
    return py, mark


def _serve(models: dict[str, Path], py: Path, draft: Path, tmp: Path, **kw):
    return speculative_server(py, models["target"], draft, served_name="t",
                              num_speculative_tokens=3, log_path=tmp / "v.log", family=None,
                              **kw)  # fmt: skip


def test_the_specforge_export_as_is_is_refused_before_it_serves(
    models, marking_python, tmp_path
) -> None:
    py, mark = marking_python
    with pytest.raises(TrapError) as e:
        _serve(models, py, models["draft"], tmp_path)
    assert e.value.trap == "aux-layer-numbering"
    # the layers vLLM would have captured, and the ones the draft was trained on
    assert "[0, 1, 2]" in str(e.value) and "[1, 2, 3]" in str(e.value)
    assert not mark.exists()


def test_a_copy_edited_since_serve_command_wrote_it_is_refused(
    models, marking_python, tmp_path
) -> None:
    py, mark = marking_python
    edited = tmp_path / "edited"
    edited.mkdir()
    cfg = json.loads((models["copy"] / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]  # back to SpecForge's
    (edited / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TrapError) as e:
        _serve(models, py, edited, tmp_path)
    assert e.value.trap == "aux-layer-numbering" and "[2, 3, 4]" in str(e.value)
    assert not mark.exists()


def test_an_eagle_method_or_draft_is_refused_before_it_serves(
    models, marking_python, tmp_path
) -> None:
    py, mark = marking_python
    with pytest.raises(TrapError) as e:
        _serve(models, py, models["copy"], tmp_path, method="eagle")
    assert e.value.trap == "eagle-vs-eagle3" and "'eagle'" in str(e.value)
    # an EAGLE-1 draft named as vLLM would load it under "eagle" is no EAGLE-3 draft either
    cfg = json.loads((models["eagle1"] / "config.json").read_text())
    cfg["architectures"] = ["EagleLlamaForCausalLM"]
    named = tmp_path / "eagle1"
    named.mkdir()
    (named / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TrapError) as e:
        _serve(models, py, named, tmp_path)
    assert e.value.trap == "eagle-vs-eagle3"
    assert not mark.exists()


def test_the_vllm_copy_is_served(models, marking_python, tmp_path) -> None:
    py, mark = marking_python
    srv = _serve(models, py, models["copy"], tmp_path)
    spec = json.loads(srv.command()[srv.command().index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": str(models["copy"]), "num_speculative_tokens": 3}
    with pytest.raises(EndpointError, match="exited with code 3"):
        srv.start()
    assert mark.exists()


def test_no_vllm_environment_is_one_clear_error(tmp_path) -> None:
    from regen.core.errors import ConfigError

    with pytest.raises(ConfigError, match="run `bash scripts/vllm-env` first"):
        vllm_python(tmp_path / "none")
    (tmp_path / "failed").mkdir()
    (tmp_path / "failed" / ".install-failed").write_text("uv: no wheel for this platform\n")
    with pytest.raises(ConfigError, match="failed to install: uv: no wheel"):
        vllm_python(tmp_path / "failed")
