"""Arguments several commands share (not a command: its name starts with an underscore)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TypedDict

from regen.core.errors import ConfigError


def add_override_argument(p: argparse.ArgumentParser) -> None:
    """``-o key.sub=value`` or ``-o FILE.yaml`` (repeatable): dotted manifest overrides or an
    overlay file, validated like the manifest itself."""
    p.add_argument(
        "-o",
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE|FILE",
        help="dotted manifest override, e.g. -o sources.sharegpt.limit=3, or an overlay YAML "
        "file such as regen plan --reweight writes (repeatable)",
    )


def add_api_key_arguments(p: argparse.ArgumentParser, what: str = "the server") -> None:
    """``--api-key-env NAME`` / ``--api-key-file PATH``: the key of a server started with
    SGLang's ``--api-key``, by the manifest's rules: never the key itself on the command line,
    never logged (it goes only into ``Authorization: Bearer``)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--api-key-env",
        metavar="NAME",
        help=f"environment variable holding the API key of {what} (never the key itself)",
    )
    g.add_argument(
        "--api-key-file",
        metavar="PATH",
        help=f"file holding the API key of {what} (never the key itself)",
    )


class ApiKeyFields(TypedDict, total=False):
    """Where an endpoint's key comes from (:class:`regen.manifest.Endpoint`'s fields)."""

    api_key_env: str
    api_key_file: str


def api_key_fields(args: argparse.Namespace) -> ApiKeyFields:
    """``api_key_env`` / ``api_key_file`` for :class:`regen.manifest.Endpoint` from the flags
    (a relative file is made absolute against the current directory)."""
    if getattr(args, "api_key_env", None):
        return {"api_key_env": args.api_key_env}
    if getattr(args, "api_key_file", None):
        return {"api_key_file": str(Path(args.api_key_file).expanduser().resolve())}
    return {}


#: what Ray sets in the environment of a submitted job's entrypoint (its runtime_env inside)
RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
#: the folder under which Ray unpacks a job's ``--working-dir`` (deleted when Ray is done)
RAY_WORKING_DIR_FILES = "working_dir_files"


def ray_job_working_dir() -> Path | None:
    """The temporary directory Ray unpacked this job's ``--working-dir`` into (the entrypoint
    runs in it), or None outside such a job."""

    cwd = Path.cwd()
    if RAY_WORKING_DIR_FILES in cwd.parts:
        return cwd
    try:
        config = json.loads(os.environ.get(RAY_JOB_CONFIG_ENV) or "{}")
    except ValueError:  # not Ray's: then this is no Ray job we know of
        return None
    runtime_env = config.get("runtime_env") if isinstance(config, dict) else None
    working_dir = runtime_env.get("working_dir") if isinstance(runtime_env, dict) else None
    if not working_dir or str(working_dir).startswith("local://"):
        return None
    return cwd


def absolute_run_dir(out: str, flag: str = "--out") -> str:
    """``out`` as the absolute path regen uses (a URI unchanged); under a Ray job, a path that
    resolves inside the job's temporary working directory is refused (Ray deletes it)."""
    if "://" in out:
        return out
    path = Path(out).expanduser().absolute()
    job_dir = ray_job_working_dir()
    if job_dir is not None and path.resolve().is_relative_to(job_dir.resolve()):
        raise ConfigError(
            f"{flag} {out}: under this Ray job it is {path}, inside the job's temporary "
            "working directory, which Ray deletes; give an absolute path on storage every "
            "node sees (e.g. --out /shared/runs/NAME)",
            field=flag,
        )
    return str(path)
