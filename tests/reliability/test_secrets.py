"""Secrets and unsafe calls: the API key never sits in a manifest nor lands in a run directory,
a log or the exported data; launch commands are argv lists; YAML is loaded safely.

The env-var route (``api_key_env``) through run_job is in tests/engine/test_failures_interrupt.py;
here the file route (``api_key_file``) runs through `regen run` and `regen export` against a
simulator that refuses requests without the key.
"""

from __future__ import annotations

import ast
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from _reliability import REPO, chaos

from regen.core.errors import ConfigError
from regen.manifest import load_manifest

#: made at run time, so no copy of this file (e.g. a Ray working_dir upload) holds it
SECRET = "sk-regen-" + secrets.token_hex(12)
PACKAGES = ("regen", "pipelines", "monitor")
#: calls that run a command line through a shell
SHELL_CALLS = frozenset(
    {
        "os.system",
        "os.popen",
        "subprocess.getoutput",
        "subprocess.getstatusoutput",
        "asyncio.create_subprocess_shell",
    }
)


def files_holding(root: Path, needle: bytes) -> list[str]:
    """Every file under ``root`` whose bytes contain ``needle``."""
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.parametrize(
    "where",
    [
        {"endpoints": [{"url": "http://127.0.0.1:1/v1", "api_key": SECRET}]},
        {"api_key": SECRET},
        {"target": {"model": "m", "tokenizer": "t", "api_key": SECRET}},
    ],
    ids=["endpoint", "top-level", "target"],
)
def test_a_key_in_the_manifest_is_refused_without_echoing_it(tmp_path, where) -> None:
    src = chaos.write_sharegpt(tmp_path / "s.jsonl", 1)
    path = chaos.write_manifest(tmp_path / "m.yaml", src)
    data = {**yaml.safe_load(path.read_text()), **where}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_manifest(path)
    assert "api_key: unknown key" in str(e.value)
    assert SECRET not in str(e.value)


#: one Ray actor per run: what a key or a URL reaches does not depend on how many there are
ONE_WORKER = {"workers": 1}


def regen_run(manifest: Path, out: Path, address: str) -> list[str]:
    return [str(chaos.VENV_BIN / "regen"), "--log-level", "DEBUG", "run", str(manifest),
            "--out", str(out), "--address", address, "--no-view"]  # fmt: skip


@pytest.mark.ray
def test_key_from_a_file_reaches_the_server_and_nowhere_else(tmp_path, ray_head, ray_env) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "sim.key").write_text(SECRET + "\n")
    src = chaos.write_sharegpt(tmp_path / "s.jsonl", 10)
    out, export = tmp_path / "run", tmp_path / "export"
    with chaos_sim() as sim:
        # without the key the server refuses: this test can fail
        nokey = chaos.write_manifest(tmp_path / "nokey.yaml", src, engine=ONE_WORKER,
                                     endpoints=[{"url": sim.url}])  # fmt: skip
        r0 = subprocess.run(regen_run(nokey, tmp_path / "run0", ray_head.address), env=ray_env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
        assert r0.returncode == 2 and "answered HTTP 401" in r0.stderr

        eps = [{"url": sim.url, "api_key_file": str(keys / "sim.key")}]
        path = chaos.write_manifest(tmp_path / "m.yaml", src, engine=ONE_WORKER, endpoints=eps)
        r1 = subprocess.run(regen_run(path, out, ray_head.address), env=ray_env,
                            capture_output=True, text=True, timeout=180)  # fmt: skip
        assert r1.returncode == 0, r1.stderr[-3000:]
        assert "10/10 samples done" in r1.stdout
    r2 = subprocess.run([str(chaos.VENV_BIN / "regen"), "export", str(out), "--out", str(export)],
                        env=ray_env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert any(p.is_file() for p in export.rglob("*"))
    for text in (r0.stdout, r0.stderr, r1.stdout, r1.stderr, r2.stdout, r2.stderr):
        assert SECRET not in text
    assert files_holding(out, SECRET.encode()) == []
    assert files_holding(export, SECRET.encode()) == []
    assert "api_key_file" in (out / "manifest.yaml").read_text()  # names the file only
    # the actors' own logs, where Ray writes them (the head forwards none to the driver)
    actor_logs = list(ray_head.temp_dir.rglob("worker-*"))
    assert actor_logs, f"no actor logs under {ray_head.temp_dir}"
    assert files_holding(ray_head.temp_dir, SECRET.encode()) == []


def chaos_sim(**options: Any):
    from regen.devkit.simulate.testing import running_simulator

    opts = {"model_name": chaos.MODEL, "instant": True, "mean_tokens": 16, "api_key": SECRET}
    return running_simulator(**{**opts, **options})


def python_sources() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]


def calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def test_no_shell_anywhere_in_the_package() -> None:
    found = []
    for p in python_sources():
        for c in calls(ast.parse(p.read_text(), str(p))):
            name = dotted(c.func)
            shell = any(k.arg == "shell" and not (isinstance(k.value, ast.Constant)
                                                   and k.value.value is False)
                        for k in c.keywords)  # fmt: skip
            if shell or name in SHELL_CALLS:
                found.append(f"{p.relative_to(REPO)}:{c.lineno} {name}")
    assert found == []
    assert len(python_sources()) > 50  # the scan saw the package


def test_yaml_is_only_loaded_safely() -> None:
    unsafe = []
    for p in python_sources():
        for c in calls(ast.parse(p.read_text(), str(p))):
            name = dotted(c.func)
            if name in ("yaml.unsafe_load", "yaml.full_load", "yaml.load_all"):
                unsafe.append(f"{p.relative_to(REPO)}:{c.lineno} {name}")
            elif name == "yaml.load":
                loader = next((dotted(k.value) for k in c.keywords if k.arg == "Loader"), "")
                if len(c.args) > 1:
                    loader = dotted(c.args[1])
                if loader not in ("yaml.SafeLoader", "yaml.CSafeLoader"):
                    unsafe.append(f"{p.relative_to(REPO)}:{c.lineno} yaml.load({loader})")
    assert unsafe == []


def test_a_python_tag_in_a_manifest_is_refused_not_run(tmp_path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "m.yaml"
    path.write_text(f"name: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_manifest(path)
    assert not marker.exists()


@pytest.fixture(scope="module")
def userinfo_run(tmp_path_factory, ray_head, ray_env) -> dict[str, Any]:
    """A run whose --endpoint URL carries user:password (a proxy's basic auth)."""
    work = tmp_path_factory.mktemp("userinfo")
    src = chaos.write_sharegpt(work / "s.jsonl", 6)
    path = chaos.write_manifest(work / "m.yaml", src, engine=ONE_WORKER)
    out = work / "run"
    with chaos_sim(api_key=None, fault_sequence="500,ok", faulty_attempts=1) as sim:
        url = sim.url.replace("http://", f"http://regen:{SECRET}@")
        cmd = [*regen_run(path, out, ray_head.address), "--endpoint", url]
        r = subprocess.run(cmd, env=ray_env, capture_output=True, text=True, timeout=180)
    return {"r": r, "out": out, "ray_logs": ray_head.temp_dir}


@pytest.mark.ray
def test_userinfo_of_an_endpoint_url_is_not_in_manifest_yaml_or_run_json(userinfo_run) -> None:
    r, out = userinfo_run["r"], userinfo_run["out"]
    assert r.returncode == 0, r.stderr[-3000:]
    for name in ("manifest.yaml", "run.json"):
        assert SECRET not in (out / name).read_text(), name


@pytest.mark.ray
def test_userinfo_of_an_endpoint_url_is_nowhere_in_the_run_dir_or_logs(userinfo_run) -> None:
    r, out = userinfo_run["r"], userinfo_run["out"]
    assert r.returncode == 0
    assert SECRET not in r.stdout + r.stderr
    assert files_holding(out, SECRET.encode()) == []
    assert files_holding(userinfo_run["ray_logs"], SECRET.encode()) == []  # the actors' logs
