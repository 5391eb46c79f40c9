"""The commands the docs show are the commands the code takes: every flag of the README's
command table exists, each command's required arguments are shown, the command lines in the
manifests' comments parse, the exit codes are the ones the entrypoints return, and what the
README says the local Ray listens on is what it listens on."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from regen.cli import main as cli_main
from regen.cli.main import build_parser
from regen.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
ROW = re.compile(r"^\| `regen ([a-z-]+)([^`]*)` \|", re.M)


def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def table_rows() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in ROW.finditer(README)]


def test_the_readme_table_has_every_command() -> None:
    assert {cmd for cmd, _ in table_rows()} == set(subparsers())


@pytest.mark.parametrize(("cmd", "usage"), table_rows(), ids=[c for c, _ in table_rows()])
def test_every_flag_the_readme_shows_exists(cmd: str, usage: str) -> None:
    known = {s for a in subparsers()[cmd]._actions for s in a.option_strings}
    shown = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", usage))
    assert shown - known == set(), f"regen {cmd}: the README shows flags the command lacks"


@pytest.mark.parametrize(("cmd", "usage"), table_rows(), ids=[c for c, _ in table_rows()])
def test_every_required_option_is_shown_outside_brackets(cmd: str, usage: str) -> None:
    required = [a.option_strings[0] for a in subparsers()[cmd]._actions
                if a.required and a.option_strings]  # fmt: skip
    outside = re.sub(r"\[[^\]]*\]", "", usage)
    assert [r for r in required if r not in outside] == []


def test_serve_command_shows_the_target_it_cannot_do_without(tmp_path: Path) -> None:
    """`regen serve-command DRAFT_DIR` alone is refused (it needs --config or --target); the
    README's usage says so."""
    args = build_parser().parse_args(["serve-command", str(tmp_path)])
    with pytest.raises(ConfigError) as e:
        args._run(args)
    assert "--target" in str(e.value) and "--config" in str(e.value)
    (usage,) = [u for c, u in table_rows() if c == "serve-command"]
    assert re.match(r" DRAFT_DIR \(--config [^|)]+\\\| --target [^)]+\)", usage), usage


def comment_commands() -> list[tuple[str, str]]:
    """Indented ``#   regen CMD ...`` lines of the manifests' comments (up to the first wide
    gap, where the prose begins; a line with ``...`` elides arguments and is left out)."""
    names = "|".join(re.escape(c) for c in subparsers())
    command = re.compile(rf"#\s{{2,}}(regen\s+(?:{names})\s.*?)(?:\s{{2,}}|$)")
    out = []
    for path in sorted((REPO / "manifests").glob("*.yaml")):
        for line in path.read_text(encoding="utf-8").splitlines():
            m = command.match(line)
            if m and "..." not in m.group(1):
                out.append((path.name, m.group(1)))
    return out


@pytest.mark.parametrize(("name", "line"), comment_commands())
def test_the_manifests_comment_commands_parse(name: str, line: str) -> None:
    argv = shlex.split(line)[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"{name}: `{line}` is not a command regen takes")


def test_the_production_manifest_shows_its_run_command() -> None:
    assert any(line.startswith("regen run manifests/kimi-k25-eagle3.yaml --out ")
               for name, line in comment_commands() if name == "kimi-k25-eagle3.yaml")  # fmt: skip


def test_the_readme_lists_the_exit_codes_the_entrypoints_return() -> None:
    table = README.split("**Exit codes**", 1)[1].split("\n\n", 2)[1]
    codes = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert codes == {cli_main.EXIT_DONE, cli_main.EXIT_FAILED, cli_main.EXIT_CONFIG,
                     cli_main.EXIT_LEFT, cli_main.EXIT_INTERRUPTED}  # fmt: skip


LISTENING = """
import json, sys, psutil, ray
from regen.engine.driver import connect_ray
connect_ray(None)
tree = [psutil.Process()] + psutil.Process().children(recursive=True)
addrs = set()
for p in tree:
    try:
        conns = p.net_connections(kind="tcp")
    except psutil.Error:
        continue
    addrs |= {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN}
node = ray.nodes()[0]["NodeManagerAddress"]
ray.shutdown()
print(json.dumps({"node": node, "listen": sorted(addrs)}))
"""


@pytest.mark.ray
def test_the_readme_says_what_the_local_ray_listens_on(tmp_path: Path, ray_env) -> None:
    env = {**ray_env, "HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", LISTENING], env=env, capture_output=True,
                       text=True, timeout=180, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    loopback_only = all(a.startswith("127.") or a == "::1" for a in seen["listen"])
    section = README.split("### The local Ray and its ports", 1)[1].split("\n## ", 1)[0]
    if loopback_only and seen["node"].startswith("127."):
        assert "listen on 127.0.0.1" in section
    else:  # what Ray 2.60 does: the README must not promise loopback
        assert "listen on all" in " ".join(section.split())
        assert "cannot be bound to 127.0.0.1" in " ".join(section.split())
        assert "all on 127.0.0.1" not in " ".join(README.split())


def runbook_commands() -> list[str]:
    """The ``regen ...`` command lines of docs/runbook.md's code blocks (continuations joined,
    comments cut, ``[...]`` optional parts kept as given; a line eliding with ``...`` is left
    out)."""
    text = (REPO / "docs" / "runbook.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines = " ".join(blocks).replace("\\\n", " ").splitlines()
    out = []
    for line in lines:
        line = line.split(" #", 1)[0].strip()
        if line.startswith("regen ") and "..." not in line:
            out.append(re.sub(r"\[([^\]]*)\]", r"\1", line))
    return out


def test_the_runbook_shows_every_production_step() -> None:
    steps = {shlex.split(line)[1] for line in runbook_commands()}
    assert {"plan", "run", "train", "serve-command", "verify-server", "bench"} <= steps


@pytest.mark.parametrize("line", runbook_commands())
def test_the_runbooks_commands_parse(line: str) -> None:
    try:
        build_parser().parse_args(shlex.split(line)[1:])
    except SystemExit:
        pytest.fail(f"docs/runbook.md: `{line}` is not a command regen takes")
