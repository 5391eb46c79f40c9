"""train.yaml: the strict, documented description of one draft-training job.

One YAML file says which target the draft serves, the draft's shape, the SpecForge training
hyperparameters, where the trainer runs (Ray GPUs, capture servers, Mooncake), and how the
trained draft is served. Every model rejects unknown keys. Relative paths are kept as written
(they are resolved on the cluster, where the job runs).

Numbers are facts about the target: for Kimi-K2.5 61 layers, hidden 7168, vocab 163840, and
the language model sits under ``language_model.`` in the checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from regen.core.errors import ConfigError
from regen.export.settings import ExportSettings
from regen.manifest import Export, read_yaml_file
from regen.targets import Family, valid_name
from regen.targets.decide import decide_family


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TargetSpec(Strict):
    """The target model the draft is trained against."""

    #: checkpoint directory of the target (as seen from the cluster)
    path: str = Field(min_length=1)
    #: number of decoder layers of the target's language model
    num_layers: int = Field(gt=0)
    #: hidden size of the target's language model
    hidden_size: int = Field(gt=0)
    #: vocabulary size of the target's embedding / lm head
    vocab_size: int = Field(gt=0)
    #: tokenizer size (len(tokenizer)) when known; checked against vocab_size
    tokenizer_size: int | None = Field(default=None, gt=0)
    #: checkpoint key of the embedding (Kimi-K2.5 wraps the language model)
    embedding_key: str = "language_model.model.embed_tokens.weight"
    #: checkpoint key of the lm head
    lm_head_key: str = "language_model.lm_head.weight"
    #: allow the target's own Python code (Kimi needs it)
    trust_remote_code: bool = True
    #: weight dtype the trainer loads
    torch_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    #: the target's model family (docs/targets.md: its special tokens, parser flags and how
    #: SGLang numbers its aux layers); unset: recognised from the target's tokenizer where it is
    #: readable here, else by vocab_size when one family alone publishes that size, else
    #: unknown (the checks that need it then hold to the safe side)
    family: str | None = None

    _family = field_validator("family")(valid_name)

    def model_family(self) -> Family | None:
        """The target's family (regen.targets.decide): the one its tokenizer is, which
        :attr:`family` must not contradict, else :attr:`family`, else the one family whose
        published vocabulary has :attr:`vocab_size` ids (None: unknown)."""
        return decide_family(self.family, self.path, vocab_size=self.vocab_size)


class DraftSpec(Strict):
    """The EAGLE-3 draft (SpecForge ``LlamaForCausalLMEagle3``)."""

    #: draft algorithm; regen trains EAGLE-3 drafts only
    algorithm: str = "EAGLE3"
    #: hidden size of the draft; must equal the target's
    hidden_size: int = Field(gt=0)
    #: decoder layers of the draft (EAGLE-3: one)
    num_layers: Literal[1] = 1
    #: full vocabulary of the draft's embedding; must equal the target's
    vocab_size: int = Field(gt=0)
    #: reduced vocabulary of the draft's lm head
    draft_vocab_size: int = Field(default=32000, gt=0)
    #: target layers whose hidden states feed the draft's fc (numbered as layer_numbering says)
    aux_layer_ids: list[int] = Field(min_length=1)
    #: numbering of aux_layer_ids: "specforge" (output of layer i) or "sglang" (SpecForge + 1)
    layer_numbering: Literal["specforge", "sglang"] = "specforge"
    #: input width of the draft's fc when set explicitly; must be len(aux) x target hidden
    fc_input_size: int | None = Field(default=None, gt=0)
    #: MLP width of the draft's decoder layer
    intermediate_size: int = Field(default=18432, gt=0)
    #: attention heads of the draft's decoder layer
    num_attention_heads: int = Field(default=64, gt=0)
    #: key/value heads of the draft's decoder layer
    num_key_value_heads: int = Field(default=64, gt=0)
    #: per-head width (None: hidden_size / num_attention_heads)
    head_dim: int | None = Field(default=None, gt=0)
    #: longest position the draft supports
    max_position_embeddings: int = Field(default=131072, gt=0)
    #: RoPE base
    rope_theta: float = Field(default=50000.0, gt=0)
    #: RMSNorm epsilon
    rms_norm_eps: float = Field(default=1e-6, gt=0)
    #: padding token id written into the draft config
    pad_token_id: int = Field(default=163839, ge=0)


class TrainingSpec(Strict):
    """SpecForge ``training`` section (strategy eagle3)."""

    #: passes over the data
    epochs: int = Field(default=1, gt=0)
    #: stop after this many optimizer steps (None: run all epochs)
    max_steps: int | None = Field(default=None, gt=0)
    #: per-rank batch size
    batch_size: int = Field(default=1, gt=0)
    #: peak learning rate
    lr: float = Field(default=1e-4, gt=0)
    #: gradient clipping norm
    max_grad_norm: float = Field(default=0.5, gt=0)
    #: test-time-training unroll length (EAGLE-3: 7)
    ttt_length: int = Field(default=7, gt=0)
    #: draft attention kernel
    attention_backend: Literal["sdpa", "flex_attention", "fa"] = "flex_attention"
    #: trainer tensor parallelism (online disaggregated SpecForge requires 1)
    tp_size: int = Field(default=1, gt=0)
    #: save a checkpoint every N steps (0: only at the end)
    save_interval: int = Field(default=0, ge=0)
    #: log every N steps
    log_interval: int = Field(default=50, gt=0)
    #: torch.distributed timeout in minutes
    dist_timeout: int = Field(default=10, gt=0)
    #: random seed
    seed: int = 42
    #: longest training row in tokens (longer rows are cut)
    max_length: int = Field(default=32768, gt=0)


class MooncakeSpec(Strict):
    """Where the Mooncake transfer engine runs (online capture)."""

    #: Mooncake metadata server URL (e.g. http://host:8080/metadata)
    metadata_server: str = Field(min_length=1)
    #: Mooncake master address host:port
    master_server_addr: str = Field(min_length=1)
    #: transport protocol
    protocol: Literal["tcp", "rdma"] = "tcp"


class CaptureSpec(Strict):
    """The SGLang servers that capture the target's hidden states for online training."""

    #: algorithm the capture servers run; exactly EAGLE3 (checked on their /server_info)
    speculative_algorithm: str = "EAGLE3"
    #: base URLs of the capture servers
    server_urls: list[str] = Field(default_factory=list)
    #: Mooncake endpoints the capture servers and the trainer share
    mooncake: MooncakeSpec | None = None


class DeploymentSpec(Strict):
    """Trainer topology on the Ray cluster."""

    #: trainer nodes
    nnodes: int = Field(default=1, gt=0)
    #: trainer processes (GPUs) per node
    nproc_per_node: int = Field(default=8, gt=0)
    #: SpecForge deployment mode (pre-tokenized prompts train online: disaggregated)
    mode: Literal["disaggregated", "local_colocated"] = "disaggregated"
    #: rendezvous host of trainer node 0 (required when nnodes > 1)
    master_addr: str | None = None
    #: shared control directory of the run (None: RUN_DIR/train/control)
    control_dir: str | None = None
    #: node-local consumer state directory (required by SpecForge when nnodes > 1)
    consumer_state_dir: str | None = None


#: the export settings train.yaml's ``export:`` may set: the run manifest's ``export:`` section
#: and the drop-share limit
TRAIN_EXPORT_SETTINGS = (*Export.model_fields, "max_drop_share")
#: ``export.max_drop_share`` of a train.yaml that does not say
TRAIN_MAX_DROP_SHARE = 0.5


def _optional(model: type[BaseModel], names: Iterable[str], **defaults: object) -> dict[str, Any]:
    """``create_model`` field definitions of ``model``'s fields ``names``, each optional: None
    (the default, unless ``defaults`` gives another) is not set. A value given is checked as
    ``model`` checks it (type, bounds, validators)."""
    fields = {name: model.model_fields[name] for name in names}
    return {name: (_or_none(info), defaults.get(name)) for name, info in fields.items()}


def _or_none(info: FieldInfo) -> object:
    """The type of the field ``info`` (with its bounds and validators), or None."""
    kind = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    return Optional[kind]  # noqa: UP045 (a type built at runtime: `kind | None` is no type to mypy)


#: :data:`TRAIN_EXPORT_SETTINGS` of regen.export.ExportSettings, each optional
ExportOverrides = create_model(
    "ExportOverrides",
    __base__=Strict,
    __doc__="Export settings a train.yaml sets (None: the run's own).",
    **_optional(ExportSettings, TRAIN_EXPORT_SETTINGS, max_drop_share=TRAIN_MAX_DROP_SHARE),
)


class ExportSpec(ExportOverrides):  # type: ignore[misc,valid-type]  # a model built at runtime
    """How the run is exported before training: exactly ``regen export RUN_DIR``'s settings
    (the run manifest's ``export:`` section), then every one this section sets: the fields of
    regen.manifest.Export (``seed``, ``drop_truncated``, ``drop_flags``, ``shard_rows``,
    ``max_length``, ``holdout``, ``keep_unproven``; None or left out: the run's own), and
    ``max_drop_share`` (default 0.5): refuse to train when the export drops more than this share
    of the rows it could train on (flagged, truncated, too long, no loss tokens; ``regen train
    --allow-drops`` overrides). A ``holdout`` left out holds out as many as the export being
    replaced did, so a re-export never trains on the bench's prompts (without one, the run
    manifest's); a ``max_length`` left out and not in the run manifest is
    ``training.max_length`` (:meth:`TrainConfig.export_max_length`)."""

    #: export directory (None: RUN_DIR/export)
    dir: str | None = None
    #: re-export even when the export directory holds an up-to-date export
    force: bool = False

    def given(self) -> dict[str, object]:
        """The export settings this section sets (left out or None: not set)."""
        return self.model_dump(include=set(TRAIN_EXPORT_SETTINGS), exclude_none=True)


class ServingSpec(Strict):
    """How the trained draft is served (regen serve-command / verify-server)."""

    #: SGLang speculative algorithm; must be exactly EAGLE3
    speculative_algorithm: str = "EAGLE3"
    #: --speculative-num-steps
    num_steps: int | None = Field(default=3, gt=0)
    #: --speculative-eagle-topk
    eagle_topk: int | None = Field(default=1, gt=0)
    #: --speculative-num-draft-tokens
    num_draft_tokens: int | None = Field(default=4, gt=0)
    #: tensor parallel size of the serving target
    tp: int = Field(default=8, gt=0)

    @model_validator(mode="after")
    def _all_or_none(self) -> ServingSpec:
        tuned = [self.num_steps, self.eagle_topk, self.num_draft_tokens]
        if any(v is None for v in tuned) and not all(v is None for v in tuned):
            raise ValueError("set all three of num_steps, eagle_topk, num_draft_tokens or none")
        return self


class TrainConfig(Strict):
    """One draft-training job."""

    #: name of the SpecForge run (None: the run directory's name)
    run_id: str | None = None
    #: where SpecForge writes checkpoints (as seen from the cluster)
    output_dir: str = Field(min_length=1)
    #: the target model
    target: TargetSpec
    #: the draft model
    draft: DraftSpec
    #: training hyperparameters
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    #: trainer topology
    deployment: DeploymentSpec = Field(default_factory=DeploymentSpec)
    #: hidden-state capture servers (online training)
    capture: CaptureSpec = Field(default_factory=CaptureSpec)
    #: export of the run
    export: ExportSpec = Field(default_factory=ExportSpec)
    #: serving side of the trained draft
    serving: ServingSpec = Field(default_factory=ServingSpec)

    def export_max_length(self, run: int | None) -> int:
        """The one rule for the longest row the export a training reads keeps: this config's
        ``export.max_length``, else the run manifest's (``run``), else ``training.max_length``,
        the trainer's own limit (a longer row would be cut, and its loss mask with it)."""
        return self.export.max_length or run or self.training.max_length

    @property
    def gpus(self) -> int:
        """GPUs the trainer asks Ray for on its node (one per trainer process)."""
        return self.deployment.nproc_per_node

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


#: top-level keys of a run manifest (regen.manifest) that no train config has
RUN_MANIFEST_KEYS = frozenset({"sources", "sampling", "endpoints", "engine", "dedup"})


def parse_train_config(raw: object, *, source: str = "train config") -> TrainConfig:
    """Validate a mapping; ConfigError names the first offending field."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    if RUN_MANIFEST_KEYS & raw.keys() and "output_dir" not in raw:
        raise ConfigError(
            f"{source} is a run manifest (regen run's: it has "
            f"{', '.join(sorted(RUN_MANIFEST_KEYS & raw.keys()))}), not a train config; give "
            "--config a train config (output_dir, target, draft; e.g. "
            "manifests/demo-train.yaml, docs/runbook.md)",
            field="config",
        )
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"{source}: {field}: {err['msg']}", field=field) from None


def load_train_config(path: str | Path) -> TrainConfig:
    """Read and validate a train.yaml."""
    p = Path(path)
    return parse_train_config(read_yaml_file(p, "train config"), source=str(p))
