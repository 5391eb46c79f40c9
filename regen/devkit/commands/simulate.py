"""`regen simulate`: run a simulated SGLang server (see docs/simulate.md).

The flags are generated from :class:`regen.devkit.simulate.config.SimConfig`
(regen.devkit.simulate.flags).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

NAME = "simulate"
HELP = "Run a simulated SGLang server (deterministic answers, capacity model, faults)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    from regen.devkit.simulate.flags import add_flags

    add_flags(p)


def build_config(args: argparse.Namespace):  # -> SimConfig
    from regen.devkit.simulate.flags import config_from_args

    return config_from_args(args)


def run(args: argparse.Namespace) -> int:

    from monitor.render import make_console
    from regen.devkit.simulate.server import serve

    config = build_config(args)
    console = make_console()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[str] = loop.create_future()
        task = asyncio.ensure_future(serve(config, ready=ready))
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        await asyncio.wait((task, ready), return_when=asyncio.FIRST_COMPLETED)
        if ready.done():
            console.print(f"simulated SGLang server: {ready.result()}/v1", highlight=False)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
    except OSError as e:
        from regen.core.errors import ConfigError

        raise ConfigError(f"cannot listen on {config.host}:{config.port}: {e}") from None
    return 0
