"""A job described by data: what runs on every worker, from which code, in which environment, where its
progress is read, and how its supervisor looks after it (docs/runs.md, "Your own program").

Pure: no I/O but reading the job file. A job comes from a job file (`launch NODE --job grpo.toml`, TOML
read with tomllib into `JobSpec`, whose models forbid unknown keys so a misspelt key is refused by name) or
from a command line (`launch NODE -- CMD ...`, `JobSpec.from_command`). The bundled trainer is the
built-in job (`launch NODE --config F`), launched by launch/start.py without a JobSpec.

A command is an argv: a string in the job file is split as a shell would split words (shlex), but no shell
runs it; write `bash -c '...'` for one. `[env]` is not secret: it is part of launch.json and of the job's
start command; secrets go in the `.env` given to `--env-file`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tpu_console.errors import UserError
from tpu_console.observe.metric_formats import METRIC_FORMATS, MetricFormat
from tpu_console.observe.supervision import SupervisionPolicy, policy_from_options

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")  # a shell's NAME=VALUE before a command
# [env] names that hold secrets by convention: refused, since [env] is on a command line and in launch.json.
_SECRET_NAME = re.compile(r"(?:^|_)(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$", re.IGNORECASE)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProjectSource(_Strict):
    """The code the job runs: a folder on this machine, or a git repository (what `sync --dir/--git` send)."""

    dir: str | None = None
    git: str | None = None
    branch: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ProjectSource:
        if (self.dir is None) == (self.git is None):
            raise ValueError("give one of dir or git")
        if self.branch is not None and self.git is None:
            raise ValueError("branch goes with git")
        return self


class SetupSpec(_Strict):
    """The project's environment: a command run on every worker, keyed by its requirement files' content."""

    command: str | list[str]  # a shell command line (it runs in the project's folder), or an argv
    requirements: list[str] | None = None  # None: the usual files found in the project
    python: str | None = None  # e.g. "3.12"


class MetricsSpec(_Strict):
    """Where the job's progress is read: its output's step lines, TensorBoard files, W&B files."""

    format: MetricFormat = "auto"
    regex: str | None = None
    tensorboard: str | None = None  # relative to the job's working folder
    wandb: str | None = None  # the folder holding W&B's run folders (run-<time>-<id>/, latest-run)

    @model_validator(mode="after")
    def _regex_fits(self) -> MetricsSpec:
        if self.format == "regex" and not self.regex:
            raise ValueError("format = 'regex' needs regex = '... (?P<step>\\d+) ...'")
        if self.regex is not None:
            try:
                pattern = re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"regex is not a regular expression ({exc})") from None
            if "step" not in pattern.groupindex:
                raise ValueError("regex has no named group `step`; write (?P<step>\\d+) where the step "
                                 "number is")
        return self


class SupervisorSpec(_Strict):
    """The same options as launch's flags (--fail-fast, --restart-on, ...), as the flags spell them."""

    fail_fast: bool = False
    restart_on: list[str] | str | None = None
    max_restarts: int | None = None
    on_end: Literal["keep", "delete"] = "keep"
    grace: str | float | None = None
    max_cost: float | None = None
    price_per_hour: float | None = None
    max_hang: str | float | None = None
    on_straggler: Literal["report", "restart"] | None = None


class RecoverySpec(_Strict):
    """`[recovery]`: the run is handed to the controller, which brings it back after a preemption
    (docs/managed-runs.md); the program resumes from its own checkpoint. The budgets, as launch's flags."""

    max_recoveries: int = Field(default=3, ge=0)
    max_cost: float | None = Field(default=None, gt=0)  # USD over every incarnation's node
    deadline: str | float | None = None  # no recovery begins this long after the launch ("12h")
    lost_after: str | float = "10m"  # a host unreachable this long on a READY node is lost
    queued: bool = False  # a new node through a queued request (gcp), one zone at a time
    doctor: bool | None = None  # the pod doctor on each new node before the relaunch (default: not local)


class JobSpec(_Strict):
    """A job that is a command, as a job file or a command line describes it."""

    command: list[str]
    project: ProjectSource | None = None
    setup: SetupSpec | None = None
    env: dict[str, str] = Field(default_factory=dict)
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    supervisor: SupervisorSpec = Field(default_factory=SupervisorSpec)
    recovery: RecoverySpec | None = None
    # It can go on with fewer slices of a multislice, and back (it reads TPU_CONSOLE_NUM_SLICES, and
    # resumes from its own checkpoint with the same global batch): launch's `slices` is refused without it.
    elastic: bool = False
    # Where it came from (not keys of the file): the job file's path and its text as given.
    job_file: str | None = Field(default=None, exclude=True)
    job_file_text: str | None = Field(default=None, exclude=True)

    @field_validator("command", mode="before")
    @classmethod
    def _argv(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"cannot be split into words ({exc})") from None
        if isinstance(value, list) and not value:
            raise ValueError("is empty; give the program and its arguments")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if _SECRET_NAME.search(name):
                raise ValueError(
                    f"{name} looks like a secret, and [env] is written into launch.json and the start "
                    "command; put it in a .env file given to --env-file"
                )
        return env

    @classmethod
    def from_command(cls, argv: list[str]) -> JobSpec:
        """`launch NODE -- CMD ...`: the argv as given, the current project and setup of the workers."""
        if not argv or not argv[0].strip():
            raise UserError("-- is followed by no command; give the program to run, e.g. -- python train.py")
        return cls(command=list(argv))

    @classmethod
    def from_command_line(cls, text: str) -> JobSpec:
        """A command typed as one line (the app's launch form), split into words as a shell would; no
        shell runs it. Leading NAME=VALUE words set the command's environment, as a shell takes them
        (`XLA_FLAGS=--xla_dump_to=/tmp/x python train.py`), and are checked as [env] is."""
        try:
            argv = shlex.split(text)
        except ValueError as exc:
            raise UserError(f"the command cannot be split into words ({exc}); close its quotes") from None
        env: dict[str, str] = {}
        while argv and _ASSIGNMENT.match(argv[0]):
            name, _, value = argv.pop(0).partition("=")
            env[name] = value
        if env and not argv:
            named = " ".join(f"{name}=..." for name in env)
            raise UserError(f"{named} is the environment of a command, but no command follows; give the "
                            "program after it, e.g. DEBUG=1 python train.py")
        command = cls.from_command(argv).command
        try:
            return cls(command=command, env=env)
        except ValidationError as exc:
            raise UserError(str(exc.errors()[0]["msg"]).removeprefix("Value error, ")) from None

    def with_command(self, argv: list[str]) -> JobSpec:
        """This job with another command (`launch --job F -- CMD`: the command line wins over the file)."""
        return self.model_copy(update={"command": list(JobSpec.from_command(argv).command)})

    def with_metrics(self, given: str) -> JobSpec:
        """This job with its steps read as `launch --metrics` says (over the job file's [metrics] format and
        regex): a format's name, or a regular expression with a named group `step`."""
        formats = ", ".join(f for f in METRIC_FORMATS if f != "regex")
        if given == "regex":
            raise UserError("--metrics regex: give the regular expression itself, e.g. --metrics "
                            "'iter (?P<step>\\d+) loss (?P<loss>[\\d.]+)'")
        if given in METRIC_FORMATS:
            return self.model_copy(update={"metrics": self.metrics.model_copy(
                update={"format": given, "regex": None})})
        try:
            pattern = re.compile(given)
        except re.error as exc:
            raise UserError(f"--metrics {given!r} is neither a format ({formats}) nor a regular expression "
                            f"({exc}); give a format, or a regex with (?P<step>\\d+) where the step "
                            "is") from None
        if "step" not in pattern.groupindex:
            raise UserError(f"--metrics {given!r} has no named group `step`; write (?P<step>\\d+) where the "
                            f"step number is, or give a format ({formats})")
        return self.model_copy(update={"metrics": self.metrics.model_copy(
            update={"format": "regex", "regex": given})})

    def policy(self, **overrides: Any) -> SupervisionPolicy:
        """The supervision this job asks for; `overrides` (launch's flags, None when not given) win."""
        options = self.supervisor.model_dump()
        if isinstance(options["restart_on"], list):
            options["restart_on"] = ",".join(options["restart_on"])
        for name in ("grace", "max_hang"):
            if isinstance(options[name], int | float):
                options[name] = f"{options[name]:g}"
        given = {k: v for k, v in overrides.items() if v is not None}
        if given.get("on_end") == "keep" and "grace" not in given:
            options["grace"] = None  # the file's grace went with its on_end = "delete"
        options.update(given)
        return policy_from_options(**options)

    def project_dir(self) -> Path | None:
        """The project folder on this machine, when the job names one (relative to the job file's folder)."""
        if self.project is None or self.project.dir is None:
            return None
        base = Path(self.job_file).parent if self.job_file else Path.cwd()
        return (base / Path(self.project.dir).expanduser()).resolve()

    def record(self) -> dict[str, Any]:
        """What launch.json's `job` object and the run record keep of the spec (no derived worker state)."""
        return {
            "command": list(self.command),
            "env": dict(self.env),
            "metrics": self.metrics.model_dump(),
            "job_file": self.job_file,
            "job_file_text": self.job_file_text,
        }

    def digest(self) -> str:
        """A short, stable digest of what the job runs (the record's `config_digest` for a command)."""
        data = self.model_dump(mode="json")
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def load_job_file(path: str | Path, command: list[str] | None = None) -> JobSpec:
    """The job file as a JobSpec; a one-line UserError naming the file and the key for anything wrong.
    `command` (`launch --job F -- CMD`) replaces the file's, which the file may then leave out."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"job file {path} does not exist; pass --job with an existing TOML file")
    text = path.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path} is not valid TOML ({exc}); fix the file") from None
    if command is not None:
        data["command"] = JobSpec.from_command(command).command
    if "command" not in data:
        raise UserError(f"{path} has no command; add command = \"python train.py ...\" (or an argv list), or "
                        "give one after --")
    try:
        spec = JobSpec.model_validate({**data, "job_file": str(path.resolve()), "job_file_text": text})
    except ValidationError as exc:
        raise UserError(describe_error(exc, path)) from None
    project = spec.project_dir()
    if project is not None and not project.is_dir():
        given = data["project"]["dir"]
        raise UserError(f"{path}: project.dir {given!r} is not a folder ({project}); fix the path (it is "
                        "relative to the job file's folder)")
    return spec


def describe_error(exc: ValidationError, path: Path) -> str:
    errors = exc.errors()
    # a misspelt key first: it usually explains the "missing" one beside it
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    where = ".".join(str(part) for part in first["loc"] if not isinstance(part, int)) or "(top level)"
    if first["type"] == "extra_forbidden":
        known = _known_keys(first["loc"][:-1])
        return (f"{path}: unknown key {where!r}; remove it or fix its spelling"
                + (f" (known here: {', '.join(known)})" if known else ""))
    message = str(first["msg"]).removeprefix("Value error, ")
    return f"{path}: {where}: {message}; fix it in the file"


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    model: Any = JobSpec
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        annotation = getattr(field, "annotation", None)
        candidates = [a for a in getattr(annotation, "__args__", (annotation,)) if isinstance(a, type)]
        model = next((c for c in candidates if issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return [name for name, field in model.model_fields.items() if not field.exclude]
