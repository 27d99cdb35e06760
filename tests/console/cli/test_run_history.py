"""`runs show` and `runs compare` on a local pod: a followed run is archived (masked) and summarised when it
ends, and two runs compare side by side, B against A in percent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.console.launch.test_local import fake_trainer, launch, pod, run  # noqa: F401 - pod is a fixture
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from trainer import telemetry as tm

pytestmark = pytest.mark.usefixtures("console_home")

SECRET = "s3cr3t-token-value"

# Two steps with the step time given in $STEP_S, memory on worker 1 only, and a secret printed.
STEPPING = """\
for step in 1 2; do
  mem=null; [ "$TRAINER_PROCESS_ID" = 1 ] && mem=7.5
  echo '{"t": 1, "kind": "step", "process": '$TRAINER_PROCESS_ID', "step": '$step', "time/train/step_s": STEP_S,
"time/train/step_avg_last10_s": STEP_S, "throughput/train/valid_tokens_per_s": TOKENS,
"memory/train/bytes_in_use_max_gib": '$mem', "memory/train/peak_bytes_in_use_max_gib": '$mem',
"train-reward/total/mean": 0.25}' | tr -d '\\n' >> events.jsonl
  echo >> events.jsonl
  echo "step=$step token=$MY_SECRET"
done
"""  # noqa: E501 - an event line of the fake trainer


# The trainer's start event with the rollout layout `auto` chose (trainer/train.py).
START = """\
echo '{"t": 0, "kind": "start", "process": '$TRAINER_PROCESS_ID', "rollout_layout": {"weight_layout": \
"head_groups", "configured": "auto", "why": "auto: the 2 KV heads divide 16 chips"}}' >> events.jsonl
"""  # noqa: E501 - an event line of the fake trainer


def stepping(tmp_path: Path, name: str, step_s: float, tokens: float, start: str = "") -> str:
    body = start + STEPPING.replace("STEP_S", str(step_s)).replace("TOKENS", str(tokens))
    folder = tmp_path / name
    folder.mkdir()
    return fake_trainer(folder, body)


def test_a_followed_run_is_archived_and_summarised_and_two_runs_compare(capsys, pod, tmp_path):  # noqa: F811
    env_file = tmp_path / "my.env"
    env_file.write_text(f"MY_SECRET={SECRET}\n")
    run_a = launch(capsys, stepping(tmp_path, "a", 2.0, 1000.0), "--env-file", str(env_file))
    status, out, _ = run(capsys, "logs", run_a, "--follow")
    assert status == 0 and "[1] step=2 token=***" in out and SECRET not in out

    status, out, err = run(capsys, "runs", "show", run_a, "--json")
    assert status == 0, err
    shown = json.loads(out)
    assert shown["state"] == "succeeded" and shown["finished_at"]
    assert shown["summary"][tm.STEP_AVG_LAST10] == 2.0 and shown["summary"][tm.VALID_TOKENS_PER_S] == 1000.0
    assert shown["summary"][tm.MEM_IN_USE] == 7.5 and shown["summary"][tm.REWARD_MEAN] == 0.25
    archive = Path(shown["archive_path"])
    for worker in (0, 1):
        log = (archive / f"worker-{worker}" / "output.log").read_text()
        assert log == "step=1 token=***\nstep=2 token=***\n"  # masked before it was stored
        assert len((archive / f"worker-{worker}" / "events.jsonl").read_text().splitlines()) == 2

    assert shown["rollout_layout"] is None  # no start event: a job that is not the trainer
    assert "rollout " not in run(capsys, "runs", "show", run_a)[1]

    run_b = launch(capsys, stepping(tmp_path, "b", 2.5, 900.0, START), "--env-file", str(env_file))
    assert run(capsys, "logs", run_b, "--follow")[0] == 0
    status, out, _ = run(capsys, "runs", "show", "pod")  # a node: its latest run, read from its archive
    assert status == 0 and out.startswith(f"{run_b}  succeeded") and "valid tokens/s" in out
    assert "rollout   head_groups weights (auto: the 2 KV heads divide 16 chips)" in out
    shown = json.loads(run(capsys, "runs", "show", run_b, "--json")[1])
    assert shown["rollout_layout"]["weight_layout"] == "head_groups"

    status, out, err = run(capsys, "runs", "compare", run_a, run_b)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["METRIC", "A", run_a, "B", run_b, "B", "VS", "A"]
    assert lines[1].split()[-3:] == ["2", "2.5", "+25.0%"]
    assert lines[2].split()[-3:] == ["1,000", "900", "-10.0%"]
    status, out, _ = run(capsys, "runs", "compare", run_a, run_b, "--json")
    rows = {row["metric"]: row for row in json.loads(out)["rows"]}
    assert rows[tm.MEM_PEAK]["change_pct"] == {run_b: 0.0}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["runs", "compare", "20250101-000000-abcd"], "runs compare needs two runs or more"),
        (["runs", "show"], "runs show takes a run id"),
        (["runs", "show", "20250101-000000-abcd"], "unknown run id"),
        (["runs", "pod", "extra"], "unexpected arguments after pod"),
    ],
)
def test_bad_history_requests_are_one_line(capsys, pod, argv, message):  # noqa: F811
    status, _, err = run(capsys, *argv)
    assert status == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1


# Worker 1 fails after a moment; worker 0 would run forever (as a worker blocked in a collective does).
ONE_FAILS = """\
if [ "$TRAINER_PROCESS_ID" = 1 ]; then sleep 1; echo boom; exit 3; fi
while true; do sleep 0.1; done
"""


def test_launch_fail_fast_stops_the_other_workers_when_one_fails(capsys, pod, tmp_path):  # noqa: F811
    from tests.console.launch.test_local import run_folder
    from tests.processes import wait_for

    run_id = launch(capsys, fake_trainer(tmp_path, ONE_FAILS), "--fail-fast")
    exit_file = run_folder(0, run_id) / "exit"
    wait_for(exit_file.exists, timeout=45)
    assert exit_file.read_text().strip() == "143"  # TERM from the run's supervisor
    decisions = run_folder(0, run_id) / "supervisor.jsonl"
    wait_for(lambda: '"ended"' in decisions.read_text(), timeout=30)
    assert "worker 1 exited 3: stopping worker(s) 0" in decisions.read_text()
    status, out, _ = run(capsys, "status", run_id)
    assert status == 0 and "supervisor: worker 1 exited 3: stopping worker(s) 0" in out
    assert "supervisor: the run failed" in out


def test_the_layout_line_names_the_copies_of_the_weights():
    from tpu_console.cli.run_history import rollout_layout_line

    two = {"weight_layout": "head_groups", "configured": "auto", "copies": 2,
           "why": "auto: ...; 2 copies of the weights, 8 chips each (one per 8 chips)"}
    assert rollout_layout_line(two).startswith("rollout   head_groups weights (2 copies) (auto:")
    # A start event written before copies were recorded (and while rows had a style): one copy, its rows.
    assert rollout_layout_line({"weight_layout": "fsdp", "rows": "legacy", "why": "auto: not on TPU"}) == (
        "rollout   fsdp weights, rows legacy (auto: not on TPU)")
