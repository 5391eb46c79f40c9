"""`regen serve-command DRAFT_DIR`: print the SGLang and the vLLM command that serve the trained
draft (``--engine`` picks one). The vLLM command serves a copy of the draft whose aux-layer ids
are in vLLM's numbering (regen.serve.vllm.write_vllm_draft), written by this command
next to the draft (or to ``--vllm-draft-dir``)."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from regen.core.errors import ConfigError

if TYPE_CHECKING:
    from regen.targets import Family
    from regen.train.config import ServingSpec, TrainConfig

NAME = "serve-command"
HELP = "print the SGLang and vLLM commands serving the target with the trained EAGLE-3 draft"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("draft_dir", metavar="DRAFT_DIR", help="the trained draft (HF/SGLang dir)")
    parser.add_argument("--target", default=None, help="target model path (default: --config's)")
    parser.add_argument("--config", default=None, help="train.yaml (serving, target defaults)")
    parser.add_argument("--tp", type=int, default=None, help="tensor parallel size (default 8)")
    parser.add_argument("--num-steps", type=int, default=None, help="--speculative-num-steps")
    parser.add_argument("--eagle-topk", type=int, default=None, help="--speculative-eagle-topk")
    parser.add_argument(
        "--num-draft-tokens", type=int, default=None, help="--speculative-num-draft-tokens"
    )
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument(
        "--family",
        default=None,
        help="the target's model family (docs/targets.md; default: --config's target.family, "
        "else recognised from the target's tokenizer; unknown: no parser flags)",
    )
    parser.add_argument(
        "--no-parser-flags", action="store_true", help="leave out the family's parser flags"
    )
    parser.add_argument(
        "--engine",
        choices=("all", "sglang", "vllm"),
        default="all",
        help="which command to print (default both; vllm also writes the draft's vLLM copy)",
    )
    parser.add_argument(
        "--vllm-draft-dir",
        default=None,
        metavar="DIR",
        help="where the vLLM copy of the draft goes (default DRAFT_DIR-vllm)",
    )
    parser.add_argument(
        "--vllm-port", type=int, default=8000, help="the vLLM server's port (default 8000)"
    )


@dataclass(frozen=True, slots=True)
class _Served:
    """What both commands serve: the target, its serving settings, family and whether its
    own code runs."""

    target: str
    serving: ServingSpec
    family: Family | None
    remote: bool


def run(args: argparse.Namespace) -> int:
    from monitor.render import make_console
    from regen.serve.sglang import check_draft_dir
    from regen.train.config import ServingSpec, load_train_config

    _require_draft(args.draft_dir)
    cfg = load_train_config(args.config) if args.config else None
    serving = ServingSpec.model_validate({**(cfg.serving if cfg else ServingSpec()).model_dump(),
                                          **_serving_flags(args)})  # fmt: skip
    target = args.target or (cfg.target.path if cfg else None)
    if not target:
        raise ConfigError("--target (or --config with target.path) is required", field="target")
    check_draft_dir(
        args.draft_dir,
        target_hidden=cfg.target.hidden_size if cfg else None,
        num_layers=cfg.target.num_layers if cfg else None,
    )
    family = _family(args, cfg, target)
    remote = cfg.target.trust_remote_code if cfg else bool(family and family.remote_code)
    served = _Served(target, serving, family, remote)
    out = make_console()
    no_sglang = _no_sglang_draft(family)
    if no_sglang and args.engine == "sglang":
        raise ConfigError(f"{no_sglang}: use --engine vllm", field="--engine")
    if no_sglang and args.engine == "all":
        Console(stderr=True).print(f"# SGLang: no command: {no_sglang}", highlight=False)
    if args.engine in ("all", "sglang") and not no_sglang:
        _print_sglang(out, args, served)
    if args.engine in ("all", "vllm"):
        _print_vllm(out, args, served)
    return 0


def _serving_flags(args: argparse.Namespace) -> dict[str, int]:
    """The serving settings given as flags (they override the config's serving section)."""
    given = {
        "tp": args.tp,
        "num_steps": args.num_steps,
        "eagle_topk": args.eagle_topk,
        "num_draft_tokens": args.num_draft_tokens,
    }
    return {k: v for k, v in given.items() if v is not None}


def _print_sglang(out: Console, args: argparse.Namespace, served: _Served) -> None:
    from regen.serve.sglang import serve_argv

    argv = serve_argv(
        args.draft_dir, target=served.target, serving=served.serving, host=args.host,
        port=args.port, family=served.family, trust_remote_code=served.remote,
    )  # fmt: skip
    if args.engine == "all":
        out.print("# SGLang", highlight=False)
    out.print(escape(shlex.join(argv)), highlight=False, soft_wrap=True)


def _print_vllm(out: Console, args: argparse.Namespace, served: _Served) -> None:
    """The vLLM command, after writing the draft's copy in vLLM's aux-layer numbering; with
    ``--engine all`` a copy that cannot be written is said on stderr (the SGLang command
    stands; a vLLM one without the copy would serve the trap)."""
    from regen.serve import vllm as vllm_serving

    try:
        copy = vllm_serving.write_vllm_draft(args.draft_dir, args.vllm_draft_dir)
    except ConfigError as e:
        if args.engine == "vllm":
            raise
        Console(stderr=True).print(
            f"# vLLM: no command: {escape(str(e))}", highlight=False, soft_wrap=True
        )
        return
    argv = vllm_serving.serve_argv(
        str(copy), target=served.target, tp=served.serving.tp,
        num_speculative_tokens=served.serving.num_steps or 3, host=args.host,
        port=args.vllm_port, family=served.family, trust_remote_code=served.remote,
    )  # fmt: skip
    if args.engine == "all":
        out.print(f"# vLLM (the draft's copy in vLLM's aux-layer numbering: {copy})",
                  highlight=False, soft_wrap=True)  # fmt: skip
    out.print(escape(shlex.join(argv)), highlight=False, soft_wrap=True)


def _no_sglang_draft(family: Family | None) -> str:
    """Why SGLang cannot serve an EAGLE-3 draft for ``family`` ('' where it can): its loader
    captures no aux hidden states (``Family.aux_shift`` unsupported: Kimi K3, DeepSeek-V4)."""
    if family is None or family.aux_shift != "unsupported":
        return ""
    return (f"SGLang 0.5.23 serves no EAGLE-3 draft for {family.title} (its loader captures no "
            "aux hidden states)")  # fmt: skip


def _require_draft(draft_dir: str) -> None:
    """DRAFT_DIR is a directory here: a command for a draft that does not exist is refused
    (run serve-command where the checkpoint is; the vLLM command needs it to write its copy)."""

    path = Path(draft_dir).expanduser()
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise ConfigError(
            f"DRAFT_DIR {path.absolute()} {what}: give the trained draft's checkpoint directory "
            "(regen train writes it; run serve-command where it is)",
            field="DRAFT_DIR",
        )


def _family(args: argparse.Namespace, cfg: TrainConfig | None, target: str) -> Family | None:
    """The family whose parser flags the commands carry (regen.targets.decide): the one the
    target's tokenizer is, which ``--family`` and the config's ``target.family`` must not
    contradict, nor each other; else the one they name; else, with a config, the one family of
    its ``target.vocab_size``. None (said on stderr) when unknown or ``--no-parser-flags``."""
    from regen.targets.decide import agree, decide_family

    if args.no_parser_flags:
        return None
    spec = cfg.target if cfg is not None else None
    configured = (
        decide_family(spec.family, target, vocab_size=spec.vocab_size) if spec is not None else None
    )
    if args.family is None:
        family = configured if spec is not None else decide_family(None, target)
    else:
        family = decide_family(args.family, target)
        agree(("--family", family), ("the config's target", configured))
    if family is None:
        Console(stderr=True).print(
            "# the target's model family is unknown: no parser flags (give --family or the "
            "config's target.family; docs/targets.md)",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
    return family
