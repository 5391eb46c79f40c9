"""Launch draft training as a Ray job: export, write and validate the run config, submit, follow.

``launch_training(rd, train_yaml, LaunchOptions(...))`` (``rd`` from
:func:`regen.train.data.open_local`, opened once by the entry point and passed on) is the one path
used by ``regen train``, ``pipelines/train_draft.py`` and ``regen run --then-train``. The Ray job's
entrypoint is ``python -m regen.train.preflight --run-dir RUN_DIR``: on the cluster it re-checks
everything and then executes the exact argv ``specforge train --config RUN_DIR/train/run.yaml``
(prefixed by a launcher wrapper only when one is configured: ``--launcher-cmd`` or
``$REGEN_TRAIN_LAUNCHER``, for tests and dry runs on machines without SpecForge's GPU stack).
Files written are listed in :mod:`regen.train.data`.
"""

from __future__ import annotations

import logging
import os
import shlex
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from regen.core.errors import ConfigError, EndpointError
from regen.manifest import Manifest
from regen.store import RunDir
from regen.store import layout as store_layout
from regen.store.verify import refuse_damaged
from regen.train import data
from regen.train.checks import check_target_files, check_train_config, turn_open_ids
from regen.train.config import TrainConfig, load_train_config
from regen.train.specforge_config import (
    check_run_config_shape,
    draft_config,
    plan_with_specforge,
    run_config,
    specforge_available,
    write_yaml,
)
from regen.train.target import (
    check_run_against_target,
    check_same_family,
    run_manifest,
    run_tokenizer,
    target_tokenizer,
)
from regen.train.traps import PromptScan, check_loss_masks, check_vocab, scan_prompts
from regen.train.vocab import write_vocab_mapping

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

log = logging.getLogger(__name__)

#: wrapper put in front of the specforge argv on the cluster (shell-split), e.g. "echo"
LAUNCHER_ENV = "REGEN_TRAIN_LAUNCHER"
#: python the job's entrypoint runs on the cluster (default: "python")
PYTHON_ENV = "REGEN_TRAIN_PYTHON"
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
#: submissions tried before giving up (0.5 s, 1 s, 2 s, 4 s, then 5 s apart)
SUBMIT_ATTEMPTS = 8
#: consecutive failed status polls before follow_job gives up (the job is not touched)
FOLLOW_FAILURES = 10


@dataclass(slots=True)
class TrainPlan:
    """Everything prepared for one submission."""

    rd: RunDir  #: the run directory (a local or shared path)
    config: TrainConfig
    run_yaml: Path
    draft_config: Path
    prompts_path: Path
    argv: list[str]
    exec_argv: list[str]
    entrypoint: str
    gpus: int
    scan: PromptScan
    export: data.TrainExport
    vocab: store_layout.VocabMappingRecord
    #: SpecForge's own launch plan of run.yaml (None: SpecForge is not importable here)
    specforge_plan: store_layout.SpecForgePlanRecord | None
    #: the run's tokenizer facts, checked against the target (None: not loadable here)
    tokenizer: store_layout.TokenizerRecord | None
    #: Ray runtime_env of the job (e.g. {"working_dir": "."} to ship regen's code)
    runtime_env: dict[str, object] | None = None

    @property
    def run_dir(self) -> str:
        """The run directory's path (what the cluster reads)."""
        return self.rd.root


@dataclass(slots=True, frozen=True)
class LaunchOptions:
    """How a training job is prepared, submitted and followed: everything but the run
    directory and its train.yaml (``regen train``'s flags)."""

    #: Ray's dashboard address (None: RAY_ADDRESS, else a local Ray)
    address: str | None = None
    #: GPUs of the job (None: the config's nproc_per_node)
    gpus: int | None = None
    #: prepare and check everything, submit nothing
    dry_run: bool = False
    #: the command put before ``specforge train`` (None: $REGEN_TRAIN_LAUNCHER)
    launcher: str | None = None
    #: the Python the job's preflight runs with (None: the cluster's ``python``)
    python: str | None = None
    #: Ray runtime_env working_dir that ships regen's code with the job
    working_dir: str | None = None
    #: train even when the export drops more than ``export.max_drop_share``
    allow_drops: bool = False
    #: follow the job to its end (False: return once it is submitted)
    follow: bool = True
    poll_s: float = 5.0
    #: stop following after this long (None: never)
    timeout_s: float | None = None
    #: told every new job state while following
    on_state: Callable[[str], None] | None = None


@dataclass(slots=True)
class LaunchResult:
    """What launch_training did."""

    plan: TrainPlan
    submission_id: str | None = None
    state: str | None = None
    message: str | None = None
    states: list[str] = field(default_factory=list)


def specforge_argv(run_yaml: Path) -> list[str]:
    """The exact command that trains the draft."""
    return ["specforge", "train", "--config", str(run_yaml)]


def _launcher(launcher: str | None) -> list[str]:
    text = launcher if launcher is not None else os.environ.get(LAUNCHER_ENV, "")
    return shlex.split(text)


def prepare_training(
    rd: RunDir, config_path: str | Path, options: LaunchOptions | None = None
) -> TrainPlan:
    """Check the config and the run against the target, export if needed, scan the data,
    write the vocab mapping and run.yaml, and plan the run with SpecForge's own planner
    (``options``: gpus, launcher, python, working_dir, allow_drops)."""
    o = options if options is not None else LaunchOptions()
    cfg = load_train_config(config_path)
    refuse_damaged(rd, "training")  # once: the export below does not check again
    aux = check_train_config(cfg)
    check_target_files(cfg)
    manifest = run_manifest(rd)
    tokenizer = run_tokenizer(manifest)
    check_run_against_target(tokenizer, target_tokenizer(cfg), cfg)
    check_same_family(cfg, manifest)
    export, prompts, scan = _training_data(rd, cfg, manifest, allow_drops=o.allow_drops)
    files = _write_run_files(rd, cfg, aux, tokenizer, prompts)
    command = _write_command(
        rd, files.run_yaml, prompts, o.gpus if o.gpus is not None else cfg.gpus, o
    )
    return TrainPlan(
        rd=rd,
        config=cfg,
        run_yaml=files.run_yaml,
        draft_config=files.draft_config,
        prompts_path=prompts,
        argv=command.argv,
        exec_argv=command.exec_argv,
        entrypoint=command.entrypoint,
        gpus=command.gpus,
        scan=scan,
        export=export,
        vocab=files.vocab,
        specforge_plan=files.specforge_plan,
        tokenizer=tokenizer,
        runtime_env={"working_dir": o.working_dir} if o.working_dir else None,
    )


def _training_data(
    rd: RunDir, cfg: TrainConfig, manifest: Manifest | None, *, allow_drops: bool
) -> tuple[data.TrainExport, Path, PromptScan]:
    """The export (made when needed), the one prompts file SpecForge reads, and its scan,
    checked: every row has loss tokens, every id fits the target's and the draft's vocab."""
    export = data.ensure_export(rd, cfg, manifest, allow_drops=allow_drops)
    prompts = data.prompts_file(rd, export.shards)
    scan = scan_prompts([prompts], turn_open_ids(cfg))
    check_loss_masks(scan)
    check_vocab(
        target_vocab=cfg.target.vocab_size,
        draft_vocab=cfg.draft.vocab_size,
        draft_vocab_size=cfg.draft.draft_vocab_size,
        max_token_id=scan.max_token_id,
    )
    return export, prompts, scan


@dataclass(slots=True, frozen=True)
class _RunFiles:
    """What :func:`_write_run_files` wrote under train/."""

    draft_config: Path
    run_yaml: Path
    vocab: store_layout.VocabMappingRecord
    specforge_plan: store_layout.SpecForgePlanRecord | None


def _write_run_files(
    rd: RunDir,
    cfg: TrainConfig,
    aux: list[int],
    tokenizer: store_layout.TokenizerRecord | None,
    prompts: Path,
) -> _RunFiles:
    """train/: the config as checked, the run's tokenizer facts (an earlier launch's removed
    when there are none), the draft config, the vocab mapping and SpecForge's run.yaml, planned
    by SpecForge where it is importable."""
    rd.makedirs(store_layout.TRAIN_DIR)
    rd.write_text_atomic(store_layout.TRAIN_YAML, cfg.to_yaml())
    if tokenizer is not None:
        store_layout.TOKENIZER_FILE.write(rd, tokenizer)
    elif store_layout.TOKENIZER_FILE.exists(rd):  # an earlier launch's: not this run's facts
        rd.delete(store_layout.TOKENIZER_RECORD)
    draft_path = Path(rd.path(store_layout.DRAFT_CONFIG))
    rd.write_json_atomic(store_layout.DRAFT_CONFIG, draft_config(cfg, aux))
    vocab = write_vocab_mapping(
        rd, prompts, draft_vocab_size=cfg.draft.draft_vocab_size, vocab_size=cfg.draft.vocab_size
    )
    run_yaml = Path(rd.path(store_layout.RUN_YAML))
    run = run_config(
        cfg,
        aux_ids_specforge=aux,
        draft_config_path=str(draft_path),
        prompts_path=str(prompts),
        run_id=cfg.run_id or Path(rd.root).name,
        control_dir=cfg.deployment.control_dir or data.control_dir(rd),
        vocab_mapping_path=vocab.path,
    )
    check_run_config_shape(run)
    write_yaml(run_yaml, run)
    plan: store_layout.SpecForgePlanRecord | None = None
    if specforge_available():
        plan = plan_with_specforge(run_yaml, where="submit")
        store_layout.SPECFORGE_PLAN_FILE.write(rd, plan)
    else:
        log.warning("SpecForge is not importable here; %s is planned on the cluster", run_yaml)
    return _RunFiles(draft_path, run_yaml, vocab, plan)


def _write_command(
    rd: RunDir, run_yaml: Path, prompts: Path, gpus: int, o: LaunchOptions
) -> store_layout.CommandRecord:
    """train/command.json: the trainer's argv, the same behind the launcher, and the Ray job's
    entrypoint (the preflight, run with ``o.python``)."""
    argv = specforge_argv(run_yaml)
    py = o.python or os.environ.get(PYTHON_ENV, "python")
    command = store_layout.CommandRecord(
        argv=argv,
        exec_argv=[*_launcher(o.launcher), *argv],
        entrypoint=shlex.join([py, "-m", "regen.train.preflight", "--run-dir", rd.root]),
        gpus=gpus,
        run_yaml=str(run_yaml),
        prompts_path=str(prompts),
    )
    store_layout.COMMAND_FILE.write(rd, command)
    return command


def resolve_address(address: str | None) -> str:
    """The Ray job API address: the argument, else $RAY_ADDRESS, else the local dashboard."""
    return address or os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS


def _client(address: str | None) -> JobSubmissionClient:
    from ray.job_submission import JobSubmissionClient

    addr = resolve_address(address)
    try:
        return JobSubmissionClient(addr)
    except Exception as e:  # ray raises ConnectionError/RuntimeError/ValueError here
        raise ConfigError(f"cannot reach the Ray cluster at {addr}: {e}") from None


def _record_state(rd: RunDir, state: str, message: str | None = None) -> store_layout.JobRecord:
    job = store_layout.JOB_FILE.read(rd) or store_layout.JobRecord()
    now = time.time()
    job.state = state
    job.message = message
    job.updated_at = now
    job.history.append(store_layout.JobState(state=state, at=now))
    store_layout.JOB_FILE.write(rd, job)
    return job


def _job_exists(client: JobSubmissionClient, submission_id: str) -> bool:
    try:
        client.get_job_info(submission_id)
    except Exception:  # the client raises RuntimeError for an unknown id
        return False
    return True


def submit_training(
    plan: TrainPlan,
    *,
    address: str | None = None,
    attempts: int = SUBMIT_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Submit the plan as a Ray job asking for its GPUs; record it in train/job.json.

    A refused submission is retried with the same submission id (a head whose job agent is
    still starting answers 500); one that did land is recognised by looking the id up.
    """
    client = _client(address)
    rd = plan.rd
    submission_id = f"regen-train-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    delay = 0.5
    for attempt in range(1, attempts + 1):
        try:
            client.submit_job(
                entrypoint=plan.entrypoint,
                submission_id=submission_id,
                entrypoint_num_gpus=plan.gpus,
                runtime_env=plan.runtime_env,
                metadata={"regen_run_dir": plan.run_dir, "regen_gpus": str(plan.gpus)},
            )
            break
        except Exception as e:  # the client raises RuntimeError with the server's reason
            if _job_exists(client, submission_id):
                break
            if attempt == attempts:
                raise ConfigError(
                    f"Ray refused the training job after {attempts} attempts: {e}"
                ) from None
            log.warning("job submission refused (%s); retrying in %.1f s", e, delay)
            sleep(delay)
            delay = min(delay * 2, 5.0)
    store_layout.JOB_FILE.write(
        rd,
        store_layout.JobRecord(
            submission_id=submission_id,
            address=resolve_address(address),
            entrypoint=plan.entrypoint,
            entrypoint_num_gpus=plan.gpus,
            submitted_at=time.time(),
        ),
    )
    _record_state(rd, "PENDING")
    log.info("submitted %s asking for %d GPUs", submission_id, plan.gpus)
    return submission_id


def follow_job(
    rd: RunDir,
    submission_id: str,
    *,
    address: str | None = None,
    poll_s: float = 5.0,
    timeout_s: float | None = None,
    on_state: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[str, str | None, list[str]]:
    """Poll the job until it ends (or timeout_s); every state change lands in job.json."""
    client = _client(address)
    seen: list[str] = []
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    job = store_layout.JOB_FILE.read(rd)
    recorded = job.state if job is not None else None
    message: str | None = None
    failures = 0
    while True:
        try:
            state = str(client.get_job_status(submission_id).value)
            failures = 0
        except Exception as e:  # connection trouble: the job itself keeps running
            failures += 1
            if failures >= FOLLOW_FAILURES:
                raise EndpointError(
                    f"lost the Ray job API at {resolve_address(address)} ({e}); job "
                    f"{submission_id} keeps running: `ray job logs {submission_id} --follow`"
                ) from None
            log.warning("job status unavailable (%s); retrying", e)
            sleep(poll_s)
            continue
        if not seen or seen[-1] != state:
            seen.append(state)
            if state in TERMINAL_STATES:
                message = client.get_job_info(submission_id).message
            if state != recorded:
                _record_state(rd, state, message)
                recorded = state
            if on_state is not None:
                on_state(state)
        if state in TERMINAL_STATES:
            return state, message, seen
        if deadline is not None and time.monotonic() >= deadline:
            return state, message, seen
        sleep(poll_s)


def launch_training(
    rd: RunDir, config_path: str | Path, options: LaunchOptions | None = None
) -> LaunchResult:
    """Prepare, then (unless ``options.dry_run``) submit the training job and follow it."""
    o = options if options is not None else LaunchOptions()
    plan = prepare_training(rd, config_path, o)
    result = LaunchResult(plan=plan)
    if o.dry_run:
        return result
    result.submission_id = submit_training(plan, address=o.address)
    result.state = "PENDING"
    if o.follow:
        result.state, result.message, result.states = follow_job(
            plan.rd,
            result.submission_id,
            address=o.address,
            poll_s=o.poll_s,
            timeout_s=o.timeout_s,
            on_state=o.on_state,
        )
    return result
