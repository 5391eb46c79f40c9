"""`regen COMMAND` builds only that command's arguments (regen.cli.main.build_parser's
``only``): the others are listed by name and help, and `regen simulate`'s generated flags are
not built for any other command."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from regen.cli.main import build_parser, command_in


def choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings} - {"-h", "--help"}


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["status", "runs/x"], "status"),
        (["--log-level", "WARNING", "run", "m.yaml"], "run"),
        (["--log-level=DEBUG", "simulate", "--port", "1"], "simulate"),
        (["--version"], None),
        ([], None),
    ],
)
def test_the_command_word(argv: list[str], want: str | None) -> None:
    assert command_in(argv) == want


def test_only_the_named_command_is_built_and_every_command_is_listed() -> None:
    whole, one = choices(build_parser()), choices(build_parser("status"))
    assert set(one) == set(whole)
    assert flags(one["status"]) == flags(whole["status"]) != set()
    assert flags(one["simulate"]) == set() and "--instant" in flags(whole["simulate"])
    # an unknown word builds everything, so argparse names the choices
    assert flags(choices(build_parser("nosuch"))["simulate"]) == flags(whole["simulate"])


def test_another_command_never_builds_the_simulators_flags() -> None:
    code = (
        "import json, sys\nfrom regen.cli.main import main\n"
        "try:\n    main(['status', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(json.dumps('regen.devkit.simulate.flags' in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    assert json.loads(out.stdout.splitlines()[-1]) is False
