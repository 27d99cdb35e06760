"""`l`: the launch form. The config (a shipped one or a file), its `--set` overrides and the env file are
checked here with the trainer's own schema and against the node's shape, and any problem is shown in the
form; only a config that passes closes it, and only then does anything reach a worker. Instead of the
trainer, the form runs a job of your own: a job file (`.toml`, launch/job_spec.py) or a command typed as one
line (split into words as a shell would, no shell runs it), as `launch --job` and `launch -- CMD` do.

On a node of a TPU type (and local pods that rehearse one, local-v6e-16), the form also shows the planned
peak HBM per chip for the chosen config, from the TPU compiler (tpu_console/experiments/planning.py, cached),
and refuses a config the compiler says will not fit unless "Skip the plan check" is ticked."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Checkbox, Input, Label, Select, Static

from tpu_console.domain import Node
from tpu_console.errors import UserError
from tpu_console.experiments import planning
from tpu_console.experiments.planning import PlanOutcome, tpu_type_for
from tpu_console.launch.demo import is_tiny_config
from tpu_console.launch.job_kinds import check_shape, refuse_unseen_hang, validate_config
from tpu_console.launch.job_spec import JobSpec, load_job_file
from tpu_console.launch.start import check_supervision
from tpu_console.observe.supervision import SupervisionPolicy, policy_from_options
from tpu_console.providers.base import Provider
from tpu_console.secrets import read_env_file
from tpu_console.tui.modals.form import KEYS_HINT, FormModal, FormSelect, TickBox


@dataclass(frozen=True)
class LaunchOrder:
    config_path: str
    overrides: list[str]
    env_file: str | None
    kill_stale: bool
    fail_fast: bool = False
    plan_check: bool = True
    make_inputs: bool = False  # the tiny demo's model and data first, where a worker lacks them
    policy: SupervisionPolicy = field(default_factory=SupervisionPolicy)  # the run's supervisor's orders
    job: JobSpec | None = None  # a job file or a command, run instead of the trainer (config_path unused)


def shipped_configs() -> list[Path]:
    import trainer

    folder = Path(trainer.__file__).parent / "configs"
    return sorted(folder.glob("*.yaml"))


def check_launch(node: Node, config_path: str, overrides: list[str], env_file: str | None) -> None:
    """UserError for anything `launch` would refuse before touching a worker, that can be known here."""
    check_shape(validate_config(config_path, overrides), node, node.shape.workers)
    if env_file:
        read_env_file(env_file)


class LaunchModal(FormModal[LaunchOrder]):
    SUBMIT_ID = "launch"
    DEFAULT_CSS = """
    LaunchModal { align: center middle; }
    LaunchModal #dialog { width: 84; height: auto; max-height: 100%; overflow-y: auto; padding: 0 2; border:
    round $accent; background: $surface; }
    LaunchModal Label { margin-top: 1; color: $text-muted; }
    LaunchModal #error { color: $error; height: auto; }
    LaunchModal #plan { color: $text-muted; height: auto; margin-top: 1; }
    LaunchModal #buttons { height: auto; margin-top: 1; }
    LaunchModal #buttons Static { width: 2; }
    LaunchModal #flags { height: 1; margin-top: 1; }
    LaunchModal #flags Checkbox { margin-right: 3; }
    LaunchModal #make-inputs { margin-top: 1; }
    LaunchModal #job-row { height: 1; margin-top: 1; }
    LaunchModal #job-row Static { width: auto; margin-right: 1; }
    LaunchModal .options { height: 1; }
    LaunchModal .options Static { width: auto; margin-right: 1; }
    LaunchModal .options Input { width: 10; margin-right: 2; }
    LaunchModal .options #restart-on { width: 16; }
    LaunchModal .options Select { width: 11; margin-right: 2; }
    LaunchModal .options #on-straggler { width: 13; }
    """

    def __init__(self, node: Node, provider: Provider | None = None) -> None:
        super().__init__()
        self.node = node
        self.provider = provider  # checks the supervisor's options against the node (None: launch does)
        self.configs = shipped_configs()
        self.tpu_type = tpu_type_for(node.accelerator_type)
        self.planned: dict[tuple[str, tuple[str, ...]], PlanOutcome] = {}  # (config, overrides) -> outcome

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog") as dialog:
            # in the border, so it stays in sight when the form is taller than the terminal and scrolls
            dialog.border_title = (
                f"[b]Launch on {self.node.name}[/b] ({self.node.accelerator_type}, "
                f"{self.node.shape.workers} workers x {self.node.shape.devices_per_worker} devices)"
            )
            yield Label("Shipped config")
            yield FormSelect(
                [(p.name, str(p)) for p in self.configs],
                value=self._default_config(),
                id="shipped",
                compact=True,
            )
            yield Label("...or a config file (wins when given)")
            yield Input(placeholder="e.g. path/to/config.yaml", id="path", compact=True)
            with Horizontal(id="job-row"):
                yield Static("...or your own job, not the trainer:")
                yield Input(placeholder="e.g. grpo.toml or python train.py", id="job", compact=True)
            yield Label("Overrides: KEY=VALUE separated by spaces (none: the config as it is)")
            yield Input(placeholder="e.g. steps=20 rollout.n=8", id="overrides", compact=True)
            yield Label("Env file with secrets (optional; else the one `sync` uploaded)")
            yield Input(placeholder="e.g. .env", id="env", compact=True)
            with Horizontal(id="flags"):
                yield TickBox("Kill stale TPU holders first", id="kill-stale", compact=True)
                fail_fast = TickBox("Fail fast", id="fail-fast", compact=True)
                fail_fast.tooltip = "stop every worker's job when one fails"
                yield fail_fast
                skip_plan = TickBox("Skip the plan check", id="no-plan-check", compact=True)
                skip_plan.tooltip = "launch even if the TPU compiler says the config will not fit"
                yield skip_plan
            yield TickBox(
                "Make the tiny model and data on workers that lack them (tpu-console demo)",
                value=True,
                id="make-inputs",
                compact=True,
            )
            # The run's supervisor (docs/supervisor.md): the CLI's launch flags, blank meaning off.
            yield Label("Supervisor (blank: off): delete when done, budgets, restarts, stragglers")
            with Horizontal(classes="options"):
                yield Static("On end")
                yield FormSelect([("keep", "keep"), ("delete", "delete")], value="keep", id="on-end",
                                 allow_blank=False, compact=True)
                yield Static("grace")
                yield Input(placeholder="e.g. 10m", id="grace", compact=True)
                yield Static("Max cost $")
                yield Input(placeholder="e.g. 20", id="max-cost", compact=True)
                yield Static("at $/h")
                yield Input(placeholder="e.g. 4.2", id="price-per-hour", compact=True)
            with Horizontal(classes="options"):
                yield Static("Max hang")
                yield Input(placeholder="e.g. 30m", id="max-hang", compact=True)
                yield Static("Restart on")
                yield Input(placeholder="e.g. transient", id="restart-on", compact=True)
                yield Static("max restarts")
                yield Input(placeholder="e.g. 3", id="max-restarts", compact=True)
            with Horizontal(classes="options"):
                yield Static("On a straggler")
                straggler = FormSelect([("off", ""), ("report", "report"), ("restart", "restart")], value="",
                                       id="on-straggler", allow_blank=False, compact=True)
                straggler.tooltip = ("a worker 1.5x the others' median step over its last 20 steps: name it, "
                                     "or restart every job from its checkpoint (up to max restarts)")
                yield straggler
            yield Static(self._plan_hint(), id="plan")
            yield Static("", id="error")
            with Horizontal(id="buttons"):
                yield Button("Launch", variant="primary", id="launch", compact=True)
                yield Static("  ")
                yield Button("Cancel (esc)", id="cancel", compact=True)
                yield Static(KEYS_HINT, classes="keys-hint")

    def _default_config(self) -> str | object:
        # A local pod cannot hold the real model: offer the tiny config there, the first shipped one
        # elsewhere.
        if not self.configs:
            return Select.BLANK
        tiny = [p for p in self.configs if p.name == "tiny_local.yaml"]
        return str(tiny[0] if tiny and self.node.provider == "local" else self.configs[0])

    def _chosen(self) -> tuple[str, list[str]]:
        path = self.query_one("#path", Input).value.strip()
        shipped = self.query_one("#shipped", Select).value
        config = path or ("" if shipped is Select.BLANK else str(shipped))
        return config, self.query_one("#overrides", Input).value.split()

    # ---- the plan ------------------------------------------------------------------------------------

    def _plan_hint(self) -> str:
        if self.tpu_type is None:
            return f"Plan: {self.node.accelerator_type} is no TPU type, nothing to plan"
        return f"Plan: the peak HBM per chip on {self.tpu_type} shows here"

    def on_mount(self) -> None:
        self._offer_inputs()
        self._schedule_plan()

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id != "shipped":
            return
        self._offer_inputs()
        self._schedule_plan()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id in ("path", "overrides", "job"):
            self._offer_inputs()
            self._schedule_plan()

    def _offer_inputs(self) -> None:
        # The demo's inputs can be made for the shipped tiny configs only: a real model is no one's to make.
        config, _ = self._chosen()
        self.query_one("#make-inputs", Checkbox).display = (
            bool(config) and is_tiny_config(config) and not self._job_text())

    def _job_text(self) -> str:
        return self.query_one("#job", Input).value.strip()

    def _job(self) -> JobSpec | None:
        """The job typed in the form: a job file (`.toml`) or a command line; None for the trainer."""
        text = self._job_text()
        if not text:
            return None
        if text.endswith(".toml") and " " not in text:
            return load_job_file(text)
        return JobSpec.from_command_line(text)

    def _schedule_plan(self) -> None:
        if self._job_text():  # the trainer's plan says nothing of another program
            self.workers.cancel_group(self, "plan")
            self.query_one("#plan", Static).update("Plan: none for your own job (the plan is the trainer's)")
        elif self.tpu_type is not None:
            # The line always speaks of the inputs as they are now: back to the hint until the new plan.
            self.query_one("#plan", Static).update(self._plan_hint())
            self.run_worker(self._plan_chosen, exclusive=True, group="plan")

    async def _plan_chosen(self) -> None:
        import asyncio

        await asyncio.sleep(0.5)  # typing settles first: one plan per pause, not per key
        # submitted or closed while typing settled (a closing form is still mounted, its children gone)
        lines = self.query("#plan") if self.is_mounted else None
        if not lines:
            return
        config, overrides = self._chosen()
        line = lines.first(Static)
        try:
            validated = validate_config(config, overrides)
            check_shape(validated, self.node, self.node.shape.workers)
        except UserError:
            line.update(self._plan_hint())
            return
        line.update(f"Plan: compiling for {self.tpu_type} with the TPU compiler (minutes for a large model)")
        outcome = await planning.plan(config, overrides, self.tpu_type, config_digest=validated.digest)
        self.planned[(config, tuple(overrides))] = outcome
        if self.is_mounted and line.is_attached:
            line.update("Plan: " + outcome.summary())

    # ---- submit --------------------------------------------------------------------------------------

    def _policy(self, job: JobSpec | None = None) -> SupervisionPolicy:
        """The supervisor's options, parsed and checked by the very code the CLI's flags go through; for a
        job file, the options given here over its [supervisor] (blank, unticked and `keep` give none)."""
        def text(field_id: str) -> str:
            return self.query_one(f"#{field_id}", Input).value

        options = dict(
            fail_fast=self.query_one("#fail-fast", Checkbox).value,
            on_end=str(self.query_one("#on-end", Select).value),
            grace=text("grace"),
            max_cost=text("max-cost"),
            price_per_hour=text("price-per-hour"),
            max_hang=text("max-hang"),
            restart_on=text("restart-on"),
            max_restarts=text("max-restarts"),
            on_straggler=str(self.query_one("#on-straggler", Select).value),
        )
        if job is not None:
            given = {k: v for k, v in options.items() if v not in (False, "", "keep")}
            policy = job.policy(**given)
        else:
            policy = policy_from_options(**options)
        if self.provider is not None:
            check_supervision(self.provider, self.node, policy)
        return policy

    def submit(self) -> None:
        config, overrides = self._chosen()
        env_file = self.query_one("#env", Input).value.strip() or None
        plan_check = not self.query_one("#no-plan-check", Checkbox).value
        try:
            job = self._job()
        except UserError as exc:
            self.show_error(str(exc))
            return
        if job is not None:
            self._submit_job(job, overrides, env_file)
            return
        try:
            if not config:
                raise UserError("pick a shipped config or give a config file")
            check_launch(self.node, config, overrides, env_file)
            policy = self._policy()
            outcome = self.planned.get((config, tuple(overrides)))
            if plan_check and outcome is not None and outcome.status == "does-not-fit":
                raise UserError(f"{outcome.verdict} (tick 'Skip the plan check' to launch anyway)")
        except UserError as exc:
            self.show_error(str(exc))
            return
        self.workers.cancel_group(self, "plan")  # its answer would land on a closed form
        self.dismiss(
            LaunchOrder(
                config,
                overrides,
                env_file,
                self.query_one("#kill-stale", Checkbox).value,
                self.query_one("#fail-fast", Checkbox).value,
                plan_check,
                make_inputs=is_tiny_config(config) and self.query_one("#make-inputs", Checkbox).value,
                policy=policy,
            )
        )

    def _submit_job(self, job: JobSpec, overrides: list[str], env_file: str | None) -> None:
        """A job of your own: what `launch --job F` / `launch -- CMD` checks before a worker is reached."""
        try:
            if overrides:
                raise UserError("overrides set keys of the trainer's config; your own job takes its "
                                "arguments in its command: leave Overrides empty")
            if env_file:
                read_env_file(env_file)
            policy = self._policy(job)
            refuse_unseen_hang(job, policy)
        except UserError as exc:
            self.show_error(str(exc))
            return
        self.workers.cancel_group(self, "plan")
        self.dismiss(
            LaunchOrder(
                "",
                [],
                env_file,
                self.query_one("#kill-stale", Checkbox).value,
                policy.fail_fast,
                plan_check=False,
                policy=policy,
                job=job,
            )
        )
