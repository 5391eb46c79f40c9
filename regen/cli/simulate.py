"""`regen simulate`: run a simulated SGLang server (see docs/simulate.md)."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

NAME = "simulate"
HELP = "Run a simulated SGLang server (deterministic answers, capacity model, faults)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    g.add_argument("--port", type=int, default=0, help="port; 0 picks a free one (default)")
    g.add_argument("--ready-file", type=Path, help="write the base URL here once listening")
    g.add_argument("--request-log", type=Path, help="JSONL line per finished request")
    g.add_argument("--model-name", default="moonshotai/Kimi-K2.5", help="served model id")
    g.add_argument("--model-path", help="reported model path (default: the model name)")
    g.add_argument("--tokenizer", type=Path, help="tokenizer dir: enables token ids in answers")
    g.add_argument("--context-length", type=int, default=262144)
    g.add_argument(
        "--api-key",
        help="require 'Authorization: Bearer KEY' on /v1/* and /server_info (as SGLang)",
    )
    g.add_argument(
        "--usage-shape",
        choices=["sglang", "finish"],
        default="sglang",
        help="streaming usage: last chunk with choices [] (sglang) or on the "
        "finish_reason chunk (finish, transformers-serve shape)",
    )
    g.add_argument(
        "--token-ids-field",
        choices=["token_ids", "response_token_ids"],
        default="token_ids",
        help="name of the output ids in choices[0]",
    )
    c = p.add_argument_group("capacity model")
    c.add_argument("--max-running-requests", type=int, default=64, help="R batch slots")
    c.add_argument("--step-ms", type=float, default=3.2, help="one decode step (ms)")
    c.add_argument("--tokens-per-step", type=int, default=1, help="K tokens per slot per step")
    c.add_argument("--instant", action="store_true", help="answer at once (no capacity model)")
    a = p.add_argument_group("answers")
    a.add_argument("--mean-tokens", type=float, default=256.0, help="mean answer length")
    a.add_argument("--length-scale", type=float, default=1.0, help="multiplies --mean-tokens")
    a.add_argument("--length-sigma", type=float, default=1.0, help="lognormal sigma")
    a.add_argument(
        "--tool-call-rate",
        type=float,
        default=0.5,
        help="share of requests with tools that call one",
    )
    a.add_argument(
        "--prompt-share",
        type=float,
        default=0.0,
        help="share of the variance of log answer length fixed by the prompt (seed + last "
        "user message), 0-1; 0 (default) keeps today's answers",
    )
    f = p.add_argument_group("faults")
    f.add_argument("--fail-rate", type=float, default=0.0, help="HTTP 500 rate")
    f.add_argument("--rate-limit-rate", type=float, default=0.0, help="HTTP 429 rate")
    f.add_argument("--retry-after", type=float, default=1.0, help="Retry-After of a 429 (s)")
    f.add_argument("--disconnect-rate", type=float, default=0.0, help="stream cut rate")
    f.add_argument("--stall-rate", type=float, default=0.0, help="mid-answer pause rate")
    f.add_argument("--stall-s", type=float, default=5.0, help="length of a pause (s)")
    f.add_argument("--fault-seed", type=int, default=0)
    f.add_argument(
        "--faulty-attempts",
        type=int,
        default=3,
        help="attempts of one request that may fault (-1: all)",
    )
    f.add_argument(
        "--fault-sequence",
        default="",
        help="fixed faults per attempt, e.g. 429,500,disconnect,stall,ok",
    )
    s = p.add_argument_group("speculative decoding (reported in /server_info)")
    s.add_argument("--speculative-algorithm", help="EAGLE, EAGLE3, NEXTN, ...")
    s.add_argument("--speculative-draft-model-path")
    s.add_argument("--speculative-num-steps", type=int)
    s.add_argument("--speculative-eagle-topk", type=int)
    s.add_argument("--speculative-num-draft-tokens", type=int)
    s.add_argument(
        "--spec-accept-length",
        type=float,
        help="reported avg_spec_accept_length (default 2.1 EAGLE3, 1.0 EAGLE)",
    )


def build_config(args: argparse.Namespace):  # -> SimConfig
    from pydantic import ValidationError

    from regen.errors import ConfigError
    from regen.simulate.answer import AnswerConfig
    from regen.simulate.config import SimConfig
    from regen.simulate.faults import FaultConfig, parse_sequence

    try:
        return SimConfig(
            host=args.host,
            port=args.port,
            model_name=args.model_name,
            model_path=args.model_path,
            tokenizer=args.tokenizer,
            context_length=args.context_length,
            max_running_requests=args.max_running_requests,
            step_ms=args.step_ms,
            tokens_per_step=args.tokens_per_step,
            instant=args.instant,
            usage_shape=args.usage_shape,
            token_ids_field=args.token_ids_field,
            answer=AnswerConfig(
                mean_tokens=args.mean_tokens * args.length_scale,
                length_sigma=args.length_sigma,
                tool_call_rate=args.tool_call_rate,
                prompt_share=args.prompt_share,
            ),
            faults=FaultConfig(
                fail_rate=args.fail_rate,
                rate_limit_rate=args.rate_limit_rate,
                disconnect_rate=args.disconnect_rate,
                stall_rate=args.stall_rate,
                stall_s=args.stall_s,
                retry_after=args.retry_after,
                fault_seed=args.fault_seed,
                faulty_attempts=args.faulty_attempts,
                sequence=parse_sequence(args.fault_sequence),
            ),
            speculative_algorithm=args.speculative_algorithm,
            speculative_draft_model_path=args.speculative_draft_model_path,
            speculative_num_steps=args.speculative_num_steps,
            speculative_eagle_topk=args.speculative_eagle_topk,
            speculative_num_draft_tokens=args.speculative_num_draft_tokens,
            spec_accept_length=args.spec_accept_length,
            request_log=args.request_log,
            ready_file=args.ready_file,
            api_key=args.api_key,
        )
    except (ValidationError, ValueError) as e:
        raise ConfigError(f"regen simulate: {e}") from None


def run(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from rich.console import Console

    from regen.simulate.server import serve

    config = build_config(args)
    console = Console()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[str] = loop.create_future()
        task = asyncio.ensure_future(serve(config, ready=ready))
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if ready.done():
            console.print(f"simulated SGLang server: {ready.result()}/v1", highlight=False)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
    except OSError as e:
        from regen.errors import ConfigError

        raise ConfigError(f"cannot listen on {config.host}:{config.port}: {e}") from None
    return 0
