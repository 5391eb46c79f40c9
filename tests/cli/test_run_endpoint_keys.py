"""`regen run --endpoint URL --api-key-env NAME / --api-key-file PATH`: a CLI endpoint with a
key, by the manifest's rules (never the key itself on the command line)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from regen.cli.main import build_parser
from regen.cli.run import options_from_args
from regen.client import check_endpoints
from regen.core.errors import ConfigError
from regen.devkit.simulate.testing import simulator_in_thread
from regen.engine.driver import session_manifest
from regen.manifest import Endpoint, parse_manifest

MODEL = "keyed-target"


def manifest():
    return parse_manifest({
        "name": "t",
        "target": {"model": MODEL, "tokenizer": "tok"},
        "sources": [{"name": "s", "adapter": "sharegpt", "path": "x.jsonl"}],
    })  # fmt: skip


def args(*argv: str):
    return build_parser().parse_args(["run", "m.yaml", "--out", "o", *argv])


def test_endpoint_keys_reach_the_start_check(tmp_path: Path, monkeypatch) -> None:
    key = "k-run-55"
    (tmp_path / "key").write_text(key)
    monkeypatch.setenv("REGEN_RUN_KEY", key)
    monkeypatch.chdir(tmp_path)
    with simulator_in_thread(instant=True, model_name=MODEL, api_key=key) as sim:
        for flags in (["--api-key-env", "REGEN_RUN_KEY"], ["--api-key-file", "key"]):
            m = session_manifest(manifest(), options_from_args(args("--endpoint", sim.url, *flags)))
            (ep,) = m.endpoints
            assert ep.url == sim.url and key not in repr(ep)
            assert ep.api_key_file in (None, str(tmp_path / "key"))  # made absolute
            (info,) = asyncio.run(check_endpoints(m.endpoints, MODEL))
            assert info.server_info
    plain = session_manifest(manifest(), options_from_args(args("--endpoint", "http://h:1/v1")))
    assert plain.endpoints == [Endpoint(url="http://h:1/v1")]


def test_key_flags_need_an_endpoint_and_only_one_source() -> None:
    with pytest.raises(ConfigError, match="go with --endpoint"):
        options_from_args(args("--api-key-env", "X"))
    with pytest.raises(SystemExit):
        args("--endpoint", "http://h:1/v1", "--api-key-env", "X", "--api-key-file", "f")
