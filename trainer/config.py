"""The trainer's YAML config: schema with defaults, `--set` overrides, and validation before JAX starts.

Everything that can be checked from the file alone is checked in `load_config` (unknown keys, types, ranges,
impossible combinations); what needs the process and device counts is checked by `check_topology`, which the
train loop calls right after `jax.distributed.initialize()` and before anything compiles. Both raise
`ConfigError` with one line per problem naming the key and the fix.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import netrc
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainer.mesh_shape import MeshError, resolve_mesh_shape

REWARD_NAMES = ("correct", "format", "tag_count", "digits")  # digits: the toy reward of the demo
_MESH_RE = re.compile(r"^\s*-?\d+\s*,\s*-?\d+\s*,\s*-?\d+\s*$")


class ConfigError(ValueError):
    """A config the trainer refuses to run; the message names the key(s) and the fix."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bools_for_numbers(cls, data: Any) -> Any:
        # Pydantic's lax mode reads `true` as 1; a boolean where a number belongs is always a typo.
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                if isinstance(data.get(name), bool) and field.annotation in (int, float, int | None):
                    raise ValueError(f"{name}: expected a number, got {data[name]!r}")
        return data


class DataConfig(_Section):
    path: str = Field("openai/gsm8k", description="Hugging Face hub id, or a local .jsonl/.json file")
    name: str | None = Field("main", description="hub dataset config name (ignored for local files)")
    split: str = "train"
    eval_split: str = "test"
    shuffle: bool = True

    @property
    def is_local(self) -> bool:
        return is_local_path(self.path)


class RolloutConfig(_Section):
    batch_size: int = Field(16, ge=1, description="prompts per step, over all processes")
    n: int = Field(8, ge=1, description="samples per prompt (the GRPO group size)")
    global_length: int = Field(512, ge=8, description="prompt length in tokens (left-padded / truncated)")
    max_length_sample: int = Field(1024, ge=1, description="maximum new tokens per completion")
    temperature: float = Field(1.0, gt=0)
    top_k: int = Field(0, ge=0, description="0 = no top-k filtering")
    top_p: float = Field(1.0, gt=0, le=1)
    weight_layout: Literal["auto", "fsdp", "megatron", "head_groups"] = Field(
        "auto", description="bf16 weights during rollout, the rows split over every device: fsdp = "
        "sharded as in training; megatron = split over every chip, the MLP by its intermediate columns and "
        "the vocabulary sampled where it lies, explicit collectives (four a layer); head_groups = attention "
        "split by KV head, the residual whole on every chip of a copy of the weights (weight_copies; two "
        "collectives a layer inside a copy, more attention weights read per chip); auto = head_groups on "
        "TPU with mesh_shape auto where a copy's chips divide the KV heads, the model's dims and vocabulary "
        "(each slice its own copies on several slices), megatron on one slice where the KV heads do not "
        "divide the chips, fsdp otherwise. The layout chosen is in the run's start event and `tpu-console "
        "runs show`; the planner compares them: docs/plan.md")
    weight_copies: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto", description="head_groups only: copies of the bf16 weights decode reads, each split over its "
        "own chips (whole hosts) and decoding its own rows; more copies put fewer chips in each of decode's "
        "collectives (fewer hops, less latency a token) and more weight bytes on each chip. auto = one copy "
        "per 8 chips (v6e-16: 2), one a slice on a smaller slice, and each slice its own on several slices; "
        "1 = one copy over every chip. The planner prices them: docs/plan.md")


class TrainConfig(_Section):
    micro_batch_size_per_device: int = Field(1, ge=1)
    ppo_epochs: int = Field(1, ge=1)
    beta: float = Field(0.0, ge=0,
                        description="KL coefficient against the frozen reference; 0 = no reference")
    epsilon_low: float = Field(0.2, ge=0, lt=1)
    epsilon_high: float = Field(0.28, ge=0)
    optimizer: Literal["adamw", "lion"] = "adamw"
    learning_rate: float = Field(1e-6, gt=0)
    lr_schedule: Literal["constant", "warmup_cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0, description="optimizer updates of linear warmup (warmup_cosine)")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final lr / peak lr for warmup_cosine")
    clip_norm: float = Field(1.0, ge=0, description="global gradient norm clip; 0 = off")
    weight_decay: float = Field(0.0, ge=0)
    b1: float = Field(0.9, ge=0, lt=1)
    b2: float = Field(0.999, ge=0, lt=1)
    compute_dtype: Literal["bfloat16", "float32"] = Field("bfloat16",
                                                          description="activations; params stay fp32")
    remat: bool = Field(True,
                        description="recompute each block in the backward pass (saves activation memory)")
    scan_layers: bool = Field(False, description="keep the blocks' weights stacked [layers, ...] and run the "
                              "training forward as one scan over them (MaxText's scan_layers): the update "
                              "compiles as one block, in minutes and GBs less; the rollout's prefill and "
                              "decode scan over the same stacked weights (cast to bf16 once a step)")
    logprob_chunk: int = Field(128, ge=0, description="completion positions whose vocabulary logits exist at "
                               "once when computing log-probs (recomputed in the backward pass); 0 = all")


class CheckpointConfig(_Section):
    dir: str | None = Field(None, description="orbax checkpoint folder (shared storage on multi-host pods)")
    every_steps: int = Field(0, ge=0, description="0 = no periodic checkpoints")
    max_to_keep: int = Field(2, ge=1)
    resume: bool = Field(True, description="resume from the latest checkpoint in dir when there is one")


class TrainerConfig(_Section):
    model_path: str = Field(..., description="local model folder (HF layout) or hub id")
    steps: int = Field(..., ge=1)
    seed: int = 0
    mesh_shape: str = Field("auto", description="auto | host_local | dp,fsdp,tp (one -1 allowed)")
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    reward_weights: dict[str, float] = Field(default_factory=lambda: {"correct": 1.0, "format": 0.5,
                                                                     "tag_count": 0.5})
    eval_every_steps: int = Field(0, ge=0, description="0 = no eval")
    eval_samples: int = Field(64, ge=1)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    require_process_count: int | None = Field(None, ge=1, description="TRAINER_REQUIRE_PROCESS_COUNT wins")
    wandb_project: str | None = None
    wandb_name: str | None = None
    wandb_mode: Literal["online", "offline", "disabled"] = "disabled"

    @field_validator("mesh_shape")
    @classmethod
    def _mesh_shape(cls, value: str) -> str:
        value = value.strip()
        if value in ("auto", "host_local"):
            return value
        if not _MESH_RE.match(value):
            raise ValueError(f"'{value}' is not auto, host_local or three integers dp,fsdp,tp (e.g. 1,-1,1)")
        sizes = [int(x) for x in value.split(",")]
        if sizes.count(-1) > 1:
            raise ValueError(f"'{value}' has more than one -1; "
                             "at most one axis can take the remaining devices")
        if any(s == 0 or s < -1 for s in sizes):
            raise ValueError(f"'{value}' has an axis size that is not positive (only -1 is allowed)")
        return ",".join(str(s) for s in sizes)

    @field_validator("reward_weights")
    @classmethod
    def _reward_weights(cls, value: dict[str, float]) -> dict[str, float]:
        for name in value:
            if name not in REWARD_NAMES:
                raise ValueError(f"unknown reward '{name}'{_did_you_mean(name, REWARD_NAMES)}; "
                                 f"known rewards: {', '.join(REWARD_NAMES)}")
        if not any(w != 0 for w in value.values()):
            raise ValueError("every reward weight is 0; give at least one reward a non-zero weight")
        return value

    @model_validator(mode="after")
    def _combinations(self) -> TrainerConfig:
        problems = []
        t, c = self.train, self.checkpoint
        if t.lr_schedule == "warmup_cosine" and t.warmup_steps >= self.steps * t.ppo_epochs:
            problems.append(f"train.warmup_steps: {t.warmup_steps} warmup updates leave nothing to decay in "
                            f"{self.steps * t.ppo_epochs} updates (steps x ppo_epochs); lower it")
        if t.lr_schedule == "constant" and t.warmup_steps:
            problems.append("train.warmup_steps: only used with train.lr_schedule=warmup_cosine; "
                            "set it to 0 or use warmup_cosine")
        if c.every_steps and not c.dir:
            problems.append("checkpoint.every_steps: checkpoints need checkpoint.dir; set a folder or "
                            "set every_steps to 0")
        if self.wandb_mode != "disabled" and not self.wandb_project:
            problems.append(f"wandb_project: required when wandb_mode={self.wandb_mode}; set it or use "
                            "wandb_mode=disabled")
        if self.rollout.n == 1:
            problems.append("rollout.n: GRPO needs at least 2 samples per prompt (advantages are relative "
                            "to the group); set n >= 2")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def digest(self) -> str:
        """sha256 of the canonical config (sorted-key JSON), so runs can be compared across workers."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


# --------------------------------------------------------------------------------------------------------
# Loading


def is_local_path(text: str) -> bool:
    """A model/data reference that names a file or folder rather than a hub id."""
    return (text.startswith(("/", "~", "./", "../")) or text.endswith((".jsonl", ".json"))
            or Path(text).expanduser().exists())


def parse_set(assignment: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (["a", "b"], value) with the value typed as YAML types it
    (3, 0.5, true, null, [1,2])."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE, e.g. --set rollout.n=8")
    key, raw = assignment.split("=", 1)
    path = [p for p in key.strip().split(".")]
    if not all(path):
        raise ConfigError(f"--set {assignment!r}: empty part in key {key!r}; use dotted keys like train.beta")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return path, value


def apply_overrides(raw: dict, assignments: list[str]) -> dict:
    for assignment in assignments:
        path, value = parse_set(assignment)
        node = raw
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(path[: i + 1])
                raise ConfigError(f"--set {assignment!r}: {where} is a value, not a section; "
                                  f"set {where}=VALUE instead")
            node = child
        node[path[-1]] = value
    return raw


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                raw: dict | None = None) -> TrainerConfig:
    """Read YAML (or take `raw`), apply `--set` overrides, validate. Raises ConfigError."""
    if raw is None:
        if path is None:
            raise ConfigError("no config given; pass --config FILE.yaml")
        file = Path(path).expanduser()
        if not file.is_file():
            raise ConfigError(f"config file {file} does not exist; pass --config with an existing YAML file")
        try:
            raw = yaml.safe_load(file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {file} is not valid YAML: {str(exc).splitlines()[0]}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {file} must hold a mapping of keys, not {type(raw).__name__}")
    raw = apply_overrides(dict(raw), overrides or [])
    try:
        return TrainerConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


# Keys and values the trainer no longer takes, each with what to write instead: a config that names one
# gets this as its line of the error. Measured before they went: docs/plan.md.
RETIRED = {
    "rollout.sharding_style": "retired: the rollout's rows are split over every device; delete the key",
    "rollout.weight_layout=tensor": "retired (head_groups, with a copy of the weights a host, is faster at "
                                    "both ends of the planner's range); use auto, or head_groups",
    "rollout.weight_layout=replicated": "retired (a full bf16 copy per chip; head_groups is faster at both "
                                        "ends of the planner's range); use auto, or head_groups",
}


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        retired = RETIRED.get(key) or RETIRED.get(f"{key}={err.get('input')}")
        if retired and err["type"] in ("extra_forbidden", "literal_error"):
            lines.append(f"{key}: {err.get('input')!r}: {retired}" if err["type"] == "literal_error"
                         else f"{key}: {retired}")
        elif err["type"] == "extra_forbidden":
            lines.append(_unknown_key_message(err["loc"]))
        elif err["type"] == "missing":
            lines.append(f"{key}: required key is missing; add `{key}: ...` to the config")
        elif not key:  # model-level validator: the message already names the keys
            lines.append(err["msg"].removeprefix("Value error, "))
        elif err["type"] == "value_error" and re.match(r"^Value error, \w+: ", err["msg"]):
            # a section-level validator naming one of its fields: "train" + "beta: ..." -> "train.beta: ..."
            lines.append(f"{key}.{err['msg'].removeprefix('Value error, ')}")
        else:
            got = err.get("input")
            shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
            lines.append(f"{key}: {err['msg'].removeprefix('Value error, ')}{shown}")
    return "invalid config: " + "; ".join(lines)


def _unknown_key_message(loc: tuple) -> str:
    key = ".".join(str(p) for p in loc)
    model: type[BaseModel] = TrainerConfig
    for part in loc[:-1]:
        annotation = model.model_fields[str(part)].annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
    valid = list(model.model_fields)
    return (f"{key}: unknown key{_did_you_mean(str(loc[-1]), valid)}; valid keys here: {', '.join(valid)}")


def _did_you_mean(word: str, options: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


# --------------------------------------------------------------------------------------------------------
# Checks that need the machine: files that must exist (before JAX), process/device counts (after init)


def check_environment(cfg: TrainerConfig) -> None:
    """Local files the config names must exist on this worker, and wandb_mode: online needs an API key
    here. Runs on every process before jax.distributed starts. Raises ConfigError."""
    problems = []
    if is_local_path(cfg.model_path) and not Path(cfg.model_path).expanduser().exists():
        problems.append(f"model_path: {cfg.model_path} does not exist; build the tiny model with "
                        f"`python -m trainer make-tiny-model {cfg.model_path}` or point it at a model folder")
    if cfg.data.is_local and not Path(cfg.data.path).expanduser().is_file():
        problems.append(f"data.path: {cfg.data.path} does not exist; write one with "
                        f"`python -m trainer make-gsm8k-jsonl {cfg.data.path}` "
                        "or use the hub id openai/gsm8k")
    if cfg.wandb_mode == "online" and not wandb_key_available():
        # Checked on every process: otherwise only process 0 fails (in wandb.init) while the others wait for
        # it in a collective until a timeout.
        problems.append(f"wandb_mode: online needs a W&B API key on every worker and this one has none "
                        f"(no WANDB_API_KEY in the environment, no {_wandb_host()} entry in ~/.netrc); put "
                        f"WANDB_API_KEY=... in the .env given to --env-file, or set wandb_mode: offline or "
                        f"disabled")
    if problems:
        raise ConfigError("; ".join(problems))


def _wandb_host() -> str:
    from urllib.parse import urlparse

    return urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"


def wandb_key_available() -> bool:
    """Whether wandb will find an API key here, where wandb looks: WANDB_API_KEY, else a netrc entry
    (the file NETRC names, or ~/.netrc) for the W&B host (WANDB_BASE_URL's, api.wandb.ai by default).
    Only says whether one exists; the key itself is never returned or printed."""
    if os.environ.get("WANDB_API_KEY", "").strip():
        return True
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc").expanduser()
    try:
        entry = netrc.netrc(str(path)).authenticators(_wandb_host())
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def prompts_per_process(cfg: TrainerConfig, process_count: int) -> int:
    return cfg.rollout.batch_size // process_count


def check_topology(cfg: TrainerConfig, process_count: int, local_device_count: int,
                   data_parallel: int, fsdp: int) -> None:
    """Batch shapes against the process and device counts; called before anything compiles."""
    r, problems = cfg.rollout, []
    if r.batch_size % process_count:
        problems.append(f"rollout.batch_size: {r.batch_size} prompts do not split over {process_count} "
                        f"processes; use a multiple of {process_count}")
    else:
        local_batch = prompts_per_process(cfg, process_count) * r.n
        if local_batch % local_device_count:
            problems.append(
                f"rollout.batch_size/rollout.n: local_batch = prompts_per_process * n = "
                f"{r.batch_size // process_count} * {r.n} = {local_batch} does not divide by the "
                f"{local_device_count} local devices; make batch_size/{process_count} * n a multiple of "
                f"{local_device_count}")
        else:
            per_device = local_batch * process_count // (data_parallel * fsdp)
            mb = cfg.train.micro_batch_size_per_device
            if per_device % mb:
                problems.append(f"train.micro_batch_size_per_device: {mb} does not divide the {per_device} "
                                f"sequences each device trains on; use a divisor of {per_device}")
    if problems:
        raise ConfigError("invalid config for this pod: " + "; ".join(problems))


def check_pod_shape(cfg: TrainerConfig, process_count: int, local_device_count: int,
                    num_slices: int = 1) -> tuple[int, int, int]:
    """Everything `check_topology` checks, from a pod's shape alone (no JAX): the console runs this before
    it sends anything, so a batch that does not divide costs no TPU time. Returns the (dp, fsdp, tp) sizes."""
    try:
        dp, fsdp, tp = resolve_mesh_shape(cfg.mesh_shape, process_count * local_device_count, process_count,
                                          num_slices)
    except MeshError as exc:
        raise ConfigError(f"invalid config for this pod: {exc}") from None
    check_topology(cfg, process_count, local_device_count, dp, fsdp)
    return dp, fsdp, tp


def dump_yaml(cfg: TrainerConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
