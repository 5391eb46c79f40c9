"""VllmServer's command line: the target family's vLLM parsers, the engine core forked (no server
is started)."""

from __future__ import annotations

from regen.devkit.servers.vllm import (
    ENGINE_CORE_FORK,
    ENTRY,
    KIMI_PARSER_ARGS,
    VllmServer,
    parser_args,
)
from regen.targets.family import Parsers
from regen.targets.kimi import KIMI


def _tail(srv: VllmServer) -> list[str]:
    argv = srv.command()
    return argv[argv.index("--max-num-batched-tokens") + 2 :]


def test_kimi_parsers_by_default() -> None:
    assert KIMI_PARSER_ARGS == ("--enable-auto-tool-choice", "--tool-call-parser", "kimi_k2",
                                "--reasoning-parser", "kimi_k2")  # fmt: skip
    assert _tail(VllmServer("python", "model", port=1)) == list(KIMI_PARSER_ARGS)
    assert _tail(VllmServer("python", "model", port=1, kimi_parsers=False)) == []


def test_a_familys_parsers_and_those_it_has_not() -> None:
    srv = VllmServer("python", "model", port=1, parsers=Parsers(tool="hermes", reasoning="qwen3"))
    assert _tail(srv) == ["--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                          "--reasoning-parser", "qwen3"]  # fmt: skip
    assert parser_args(Parsers(tool=None, reasoning="deepseek_v3")) == [
        "--reasoning-parser", "deepseek_v3"
    ]  # fmt: skip
    assert parser_args(Parsers(tool="llama3_json", reasoning=None)) == [
        "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"
    ]  # fmt: skip
    assert parser_args(KIMI.vllm) == list(KIMI_PARSER_ARGS)
    assert parser_args(None) == []


def test_the_engine_core_is_forked_unless_told_not_to() -> None:
    code = VllmServer("python", "model", port=1).command()[1:3]
    assert code == ["-c", ENGINE_CORE_FORK + ENTRY]
    # the setup runs in the interpreter before the entry point: it compiles, and puts fork back
    # after the CPU platform's own check
    compile(ENGINE_CORE_FORK, "<setup>", "exec")
    assert '"VLLM_WORKER_MULTIPROC_METHOD"] = "fork"' in ENGINE_CORE_FORK
    plain = VllmServer("python", "model", port=1, fork_engine_core=False)
    assert plain.command()[1:3] == ["-c", ENTRY] and plain.setup == ""
