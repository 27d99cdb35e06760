"""A local multislice (2 slices of a local type, one node): create, ls and delete as one thing; a command
launched on every host of every slice with the slice id, slice count and slice 0's coordinator
(MEGASCALE_*) beside the jax.distributed variables; bad --slices input; and the real tiny trainer run on
2 slices with data parallelism over the slices (the DCN axis)."""

from __future__ import annotations

import json
import socket
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.console.launch.test_local import run, worker_home
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.processes import wait_for
from tpu_console.domain import AcceleratorShape, CreateRequest, Node, NodeState, Worker, worker_slices
from tpu_console.errors import UserError
from tpu_console.history.store import RunStore
from tpu_console.launch import job_ports, multislice
from tpu_console.launch.job_spec import JobSpec
from tpu_console.launch.start import launch
from tpu_console.observe import stacks
from tpu_console.providers.local.jobs import running_job_groups, stop_groups
from tpu_console.providers.local.provider import LocalProvider
from tpu_console.tui.run_snapshot import WorkerRow
from tpu_console.tui.widgets.worker_grid import row_cells
from trainer.synthetic_gsm8k import write_jsonl

pytest_plugins = ("tests.trainer.fixtures",)
pytestmark = pytest.mark.usefixtures("console_home")

SHOW_ENV = ("import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
            "if k.startswith(('MEGASCALE_', 'TPU_CONSOLE_PROCESS_ID', 'TPU_CONSOLE_NUM_PROCESSES'))}))")


def follow(capsys, node: str, run_id: str) -> tuple[int, dict[int, list[str]]]:
    status, out, _ = run(capsys, "logs", node, run_id, "--follow", "--lines", "all")
    lines: dict[int, list[str]] = {}
    for line in out.splitlines():
        worker, _, text = line.partition("] ")
        lines.setdefault(int(worker[1:]), []).append(text)
    return status, lines


def test_create_ls_launch_and_delete_a_local_multislice(capsys):
    status, out, err = run(capsys, "create", "ms", "--type", "local-2x1", "--slices", "2",
                           "--provider", "local")
    assert status == 0, err
    assert "x 2 slices (ms-0, ms-1), 4 workers" in out
    status, out, _ = run(capsys, "ls", "--json")
    [node] = json.loads(out)["nodes"]
    assert node["slices"] == 2 and node["slice_names"] == ["ms-0", "ms-1"] and node["workers"] == 4
    assert [h["slice"] for h in node["hosts"]] == [0, 0, 1, 1]
    status, out, _ = run(capsys, "ls")
    assert "2x local-2x1" in out

    status, out, err = run(capsys, "launch", "ms", "--json", "--", sys.executable, "-c", SHOW_ENV)
    assert status == 0, err
    run_id = json.loads(out)["run_id"]
    status, lines = follow(capsys, "ms", run_id)
    assert status == 0 and sorted(lines) == [0, 1, 2, 3]  # every host of every slice
    envs = {w: json.loads(lines[w][-1]) for w in lines}
    assert [envs[w]["MEGASCALE_SLICE_ID"] for w in range(4)] == ["0", "0", "1", "1"]
    assert [envs[w]["TPU_CONSOLE_PROCESS_ID"] for w in range(4)] == ["0", "1", "2", "3"]
    assert {envs[w]["MEGASCALE_NUM_SLICES"] for w in envs} == {"2"}
    assert {envs[w]["TPU_CONSOLE_NUM_PROCESSES"] for w in envs} == {"4"}
    assert {envs[w]["MEGASCALE_COORDINATOR_ADDRESS"] for w in envs} == {"127.0.0.1"}
    # a local pod's hosts are all this machine: a free port, as for the jax.distributed coordinator
    [port] = {envs[w]["MEGASCALE_PORT"] for w in envs}
    assert port.isdigit() and port != "8080"

    # one slice alone, or both slices but one host, is a partial launch: refused before anything starts
    runs_before = len(RunStore().list())
    for subset in ("0,1", "0-2"):
        status, _, err = run(capsys, "launch", "ms", "--worker", subset, "--", sys.executable, "-c", "pass")
        assert status == 2 and err.count("\n") == 1
        assert "is 2 slices of local-2x1 (4 hosts)" in err
        assert "every host of every slice; leave out --worker" in err
    assert len(RunStore().list()) == runs_before

    status, _, err = run(capsys, "delete", "ms", "--yes")
    assert status == 0, err
    assert not worker_home(3, "ms").exists() and not worker_home(0, "ms").exists()
    status, out, _ = run(capsys, "ls", "--json")
    assert json.loads(out)["nodes"] == []


@pytest.mark.parametrize("argv, words", [
    (["--type", "v3-8", "--slices", "2", "--provider", "gcp"], "v3-8 has no Multislice"),
    (["--type", "v2-8", "--slices", "2", "--provider", "gcp"], "v2-8 has no Multislice"),
    (["--type", "v6e-16", "--slices", "2", "--provider", "gcp", "--direct"], "leave out --direct"),
    (["--type", "local-2x1", "--slices", "0", "--provider", "local"], "--slices 0"),
    (["--type", "local-512x1", "--slices", "4", "--provider", "local"], "more than 1024"),
])
def test_bad_slices_are_refused_before_anything_is_made(capsys, argv, words):
    status, _, err = run(capsys, "create", "bad", *argv)
    assert status == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert words in err
    status, out, _ = run(capsys, "ls", "--json", "--provider", "local")
    assert json.loads(out)["nodes"] == []


def test_a_mesh_that_cannot_span_the_slices_is_refused_at_launch(capsys, tmp_path, tiny_model_dir):
    assert run(capsys, "create", "ms", "--type", "local-1x2", "--slices", "2", "--provider", "local")[0] == 0
    data = write_jsonl(tmp_path / "gsm8k.jsonl", 16, seed=0)
    status, _, err = run(capsys, "launch", "ms", "--config", str(CONFIG), "--set",
                         f"model_path={tiny_model_dir}", "--set", f"data.path={data}",
                         "--set", "mesh_shape=1,-1,1")
    assert status == 2 and err.count("\n") == 1, err
    assert "dp=1, which cannot span 2 slices" in err and "2 slices, 2 worker(s) x 2 devices" in err
    assert RunStore().list() == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_tiny_trainer_on_two_local_slices(capsys, tmp_path, tiny_model_dir):
    """2 slices x 1 host x 2 CPU devices: jax.distributed over both processes, mesh_shape auto puts dp=2 on
    the slices (the outer axis) and fsdp inside each slice, and the run ends well."""
    assert run(capsys, "create", "ms", "--type", "local-1x2", "--slices", "2", "--provider", "local")[0] == 0
    data = write_jsonl(tmp_path / "gsm8k.jsonl", 16, seed=0)
    status, out, err = run(capsys, "launch", "ms", "--config", str(CONFIG), "--json",
                           "--set", f"model_path={tiny_model_dir}", "--set", f"data.path={data}",
                           "--set", "steps=1", "--set", "eval_every_steps=0",
                           "--set", "rollout.global_length=64", "--set", "rollout.max_length_sample=8")
    assert status == 0, err
    run_id = json.loads(out)["run_id"]
    status, out, _ = run(capsys, "logs", "ms", run_id, "--follow", "--lines", "all")
    assert status == 0, out[-3000:]
    for worker in (0, 1):
        folder = worker_home(worker, "ms") / "tpu-console" / "runs" / run_id
        events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
        start = events[0]
        assert start["process_count"] == 2 and start["device_count"] == 4
        assert start["mesh_axes"] == {"dp": 2, "fsdp": 2, "tp": 1} and start["fsdp_spans_hosts"] is False
        assert events[-1]["kind"] == "end"


def test_a_held_megascale_port_is_named_and_nothing_starts(capsys, monkeypatch):
    """The port check on real workers: another program holds the port megascale's coordinator will bind,
    so the launch says which port on which worker, in one line, and starts nothing; --skip-port-check
    launches anyway."""
    assert run(capsys, "create", "ms", "--type", "local-1x1", "--slices", "2", "--provider", "local")[0] == 0
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        monkeypatch.setattr(multislice, "megascale_port", lambda node, host: port)
        status, _, err = run(capsys, "launch", "ms", "--", sys.executable, "-c", "pass")
        assert status == 2 and err.count("\n") == 1, err
        assert err.startswith(f"error: tcp:{port} on worker 0 (slice 0) of 'ms', megascale's port, is in use "
                              "by another program") and err.rstrip().endswith("nothing was launched")
        assert RunStore().list() == []
        status, out, err = run(capsys, "launch", "ms", "--skip-port-check", "--json", "--",
                               sys.executable, "-c", "pass")
        assert status == 0, err
    run_id = json.loads(out)["run_id"]
    assert follow(capsys, "ms", run_id)[0] == 0


def test_fail_fast_stops_every_slice_when_a_worker_of_slice_1_fails(capsys):
    """2 slices x 2 hosts: worker 3 (slice 1) fails; the run's supervisor on worker 0 stops the other three,
    in both slices."""
    assert run(capsys, "create", "ms", "--type", "local-2x1", "--slices", "2", "--provider", "local")[0] == 0
    job = ('if [ "$MEGASCALE_SLICE_ID/$TPU_CONSOLE_WORKER" = 1/3 ]; then sleep 1; echo boom; exit 1; fi; '
           "exec sleep 60")
    try:
        status, out, err = run(capsys, "launch", "ms", "--fail-fast", "--json", "--", "bash", "-c", job)
        assert status == 0, err
        run_id = json.loads(out)["run_id"]
        folders = [worker_home(w, "ms") / "tpu-console" / "runs" / run_id for w in range(4)]
        wait_for(lambda: all((f / "exit").exists() for f in folders), timeout=30)
        assert [(f / "exit").read_text().strip() for f in folders] == ["143", "143", "143", "1"]
        decisions = [json.loads(line)["message"]
                     for line in (folders[0] / "supervisor.jsonl").read_text().splitlines()]
        assert any(m.startswith("worker 3 exited 1: stopping worker(s) 0,1,2") for m in decisions), decisions
    finally:
        stop_groups([g for w in range(4) for g in running_job_groups(worker_home(w, "ms"))], grace_s=1.0)


async def test_an_unreachable_host_of_slice_1_stops_the_launch():
    """The guard against a partial launch counts every host of every slice: one host of slice 1 down, and
    nothing starts anywhere."""
    provider = LocalProvider()
    try:
        node = await provider.create(CreateRequest(name="ms", accelerator_type="local-1x1", slices=2))
        await provider.ssh_targets(node)
        await provider.worker_server("ms", 1).close()
        with pytest.raises(UserError) as refused:
            await launch({"local": provider}, "ms", job=JobSpec(command=[sys.executable, "-c", "pass"]))
        assert str(refused.value).startswith("worker 1 (slice 1) of 'ms' is unreachable: ")
        assert "nothing was launched" in str(refused.value) and RunStore().list() == []
    finally:
        await provider.close()


WAITS = """\
import os, time

def wait_for_the_others():
    time.sleep(60)

def load_data():
    time.sleep(60)

(load_data if os.environ["TPU_CONSOLE_WORKER"] == "3" else wait_for_the_others)()
"""


def test_stacks_and_status_say_which_slice_a_worker_is_in(capsys, tmp_path):
    """py-spy's dumps of 2 slices x 2 hosts, grouped slice by slice: slice 0 all in one place, slice 1 with
    worker 3 elsewhere; a stack shared across slices printed once; status names each worker's slice."""
    assert run(capsys, "create", "ms", "--type", "local-2x1", "--slices", "2", "--provider", "local")[0] == 0
    program = tmp_path / "waits.py"
    program.write_text(WAITS)
    try:
        status, out, err = run(capsys, "launch", "ms", "--json", "--", sys.executable, str(program))
        assert status == 0, err
        run_id = json.loads(out)["run_id"]
        expected = ("slice 0 (workers 0-1): waits.py:4 (wait_for_the_others) | slice 1 (workers 2-3): "
                    "worker 2: waits.py:4 (wait_for_the_others); worker 3: waits.py:7 (load_data)")
        said = []

        def grouped() -> bool:  # until every interpreter is in its sleep
            said.append(run(capsys, "stacks", "ms", run_id, "--json"))
            return json.loads(said[-1][1])["summary"] == expected

        wait_for(grouped, timeout=30, poll=0.3)
        groups = json.loads(said[-1][1])["groups"]
        assert [(g["workers"], g["slices"]) for g in groups] == [([0, 1, 2], [0, 1]), ([3], [1])]
        status, out, _ = run(capsys, "stacks", "ms", run_id)
        assert "--- slice 0: workers 0-1; slice 1: worker 2: waits.py:4 (wait_for_the_others)\n" in out
        assert "--- slice 1: worker 3: waits.py:7 (load_data)\n" in out
        status, out, _ = run(capsys, "status", run_id)
        assert status == 0 and "[0] slice 0" in out and "[3] slice 1" in out
    finally:
        stop_groups([g for w in range(4) for g in running_job_groups(worker_home(w, "ms"))], grace_s=1.0)


def test_one_stack_everywhere_is_said_once_and_a_silent_worker_in_its_slice():
    def dump(func: str) -> str:
        return f'Thread 0x1 (most recent call first):\n  File "/p/waits.py", line 4 in {func}\n' \
               '  File "/p/waits.py", line 9 in <module>\n'

    same = stacks.group([stacks.WorkerStacks(w, dump=dump("wait")) for w in range(4)], "r", "ms")
    same.slice_of = worker_slices(2, [0, 1, 2, 3])
    assert same.summary() == "slices 0-1 (workers 0-3): waits.py:4 (wait)"
    one_silent = stacks.group([stacks.WorkerStacks(w, dump=dump("wait")) for w in range(3)]
                              + [stacks.WorkerStacks(3, silent="its job is stopped (SIGSTOP)")], "r", "ms")
    one_silent.slice_of = same.slice_of
    assert one_silent.summary() == ("slice 0 (workers 0-1): waits.py:4 (wait) | slice 1 (workers 2-3): "
                                    "worker 2: waits.py:4 (wait); worker 3: did not answer (its job is "
                                    "stopped (SIGSTOP))")


def test_the_dashboard_names_a_workers_slice_beside_its_last_line():
    failed = WorkerRow(worker=5, activity="exited", exit_status=1, failed=True, last_line="boom", slice=1)
    assert row_cells(failed, 5, None)[-1].plain == "slice 1 · boom"
    assert row_cells(replace(failed, slice=None), 5, None)[-1].plain == "boom"  # one slice: as before


def test_the_ports_a_job_needs_where_the_platform_names_its_coordinator():
    """On a Cloud TPU multislice the console names no coordinator: JAX's own (8482 since JAX 0.8.1, or
    JAX_COORDINATOR_PORT) and megascale's 8080, on the first worker's internal address."""
    node = Node("ms", "gcp", AcceleratorShape("v6e-16", 8, 4, 32), NodeState.READY, slices=2,
                workers=tuple(Worker(i, f"34.0.0.{i}", internal_ip=f"10.0.0.{i}") for i in range(8)))
    needs = job_ports.job_ports(node, {}, 0, "10.0.0.0")
    assert [(n.port, n.host, n.purpose) for n in needs] == [
        (8482, "10.0.0.0", "the JAX coordinator's"), (8080, "10.0.0.0", "megascale's")]
    assert job_ports.job_ports(node, {"JAX_COORDINATOR_PORT": "9999"}, 0, "10.0.0.0")[0].port == 9999
    named = {"JAX_COORDINATOR_ADDRESS": "127.0.0.1:4000", "MEGASCALE_COORDINATOR_ADDRESS": "127.0.0.1",
             "MEGASCALE_PORT": "4001"}
    assert [(n.port, n.host) for n in job_ports.job_ports(node, named, 0, "x")] == [
        (4000, "127.0.0.1"), (4001, "127.0.0.1")]


CONFIG = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "tiny_local.yaml"
