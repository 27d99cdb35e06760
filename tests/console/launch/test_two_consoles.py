"""Two console homes (two people) against one pod: home A launches on its local pod; home B reaches the
same workers over loopback SSH as an `[[ssh.nodes]]` entry, and lists, follows, stacks and stops A's run,
which it never launched (found in the run folders on the pod, history/discovery.py)."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
from pathlib import Path

import pytest

from tests.processes import wait_for
from tpu_console import cli
from tpu_console.errors import UserError
from tpu_console.history import store
from tpu_console.history.store import RunStore
from tpu_console.launch.job_spec import JobSpec
from tpu_console.launch.start import launch
from tpu_console.providers.local import LocalProvider

SLEEPER = ("import time\nprint('hello from the pod', flush=True)\ndef wait_for_the_others():\n"
           "    time.sleep(60)\nwait_for_the_others()\n")


def _home_b(tmp_path: Path, pod) -> Path:
    home = tmp_path / "home-b"
    home.mkdir()
    hosts = ", ".join(f'"{t.host}:{t.port}"' for t in pod.targets)
    (home / "config.toml").write_text(
        f'[[ssh.nodes]]\nname = "pod"\nhosts = [{hosts}]\nuser = "{pod.targets[0].username}"\n'
        f'key = "{pod.targets[0].client_key}"\nknown_hosts = "{home / "known_hosts"}"\naccept_new = true\n'
    )
    return home


async def _as_b(monkeypatch, capsys, home_b: Path, *argv: str) -> tuple[int, str, str]:
    """The CLI of home B, user bob, in a thread of its own (home A's pod keeps serving in this loop)."""
    monkeypatch.setenv("TPU_CONSOLE_HOME", str(home_b))
    monkeypatch.setenv("USER", "bob")
    monkeypatch.setenv("LOGNAME", "bob")
    status = await asyncio.to_thread(cli.main, list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
async def two_worker_pod():
    provider = LocalProvider()
    from tpu_console.domain import CreateRequest

    node = await provider.create(CreateRequest(name="pod", accelerator_type="local-2x1"))
    targets = await provider.ssh_targets(node)

    class Pod:
        pass

    pod = Pod()
    pod.provider, pod.node, pod.targets = provider, node, targets
    try:
        yield pod
    finally:
        await provider.close()


async def test_home_b_lists_follows_stacks_and_stops_a_run_home_a_launched(
    two_worker_pod, tmp_path, monkeypatch, capsys
):
    pod = two_worker_pod
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("LOGNAME", "alice")
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    job = JobSpec.from_command([sys.executable, str(script)])
    result = await launch({"local": pod.provider}, "pod", job=job)
    assert result.ok, result
    run_id = result.run_id
    launch_json = json.loads((pod.provider.store.worker_dir("pod", 0) / "tpu-console" / "runs" / run_id
                              / "launch.json").read_text())
    assert launch_json["launched_by"]["user"] == "alice"
    home_b = _home_b(tmp_path, pod)

    # B has never seen it: `runs pod` finds it on the pod, with who launched it
    status, out, err = await _as_b(monkeypatch, capsys, home_b, "runs", "pod", "--json")
    assert status == 0, err
    (listed,) = json.loads(out)["runs"]
    assert listed["run_id"] == run_id and listed["launched_by"]["user"] == "alice"
    assert listed["state"] in ("running", "pending")

    # and by its id alone, as `status` takes it, in a fresh home of B's that knows nothing yet
    fresh = tmp_path / "home-b2"
    fresh.mkdir()
    (fresh / "config.toml").write_text((home_b / "config.toml").read_text())
    status, out, err = await _as_b(monkeypatch, capsys, fresh, "runs", "--json")  # every node's runs
    assert status == 0 and [r["run_id"] for r in json.loads(out)["runs"]] == [run_id], err
    (fresh / "console.sqlite").unlink()
    status, out, err = await _as_b(monkeypatch, capsys, fresh, "status", run_id, "--json")
    assert status == 0, err
    seen = json.loads(out)
    assert seen["run_id"] == run_id and seen["launched_by"]["user"] == "alice"
    assert isinstance(seen["supervisor"], list)  # its supervisor's decisions, read on the pod

    async def said_hello() -> bool:
        status, out, _ = await _as_b(monkeypatch, capsys, home_b, "logs", "pod", "--lines", "all")
        return status == 0 and "hello from the pod" in out

    for _ in range(100):
        if await said_hello():
            break
        await asyncio.sleep(0.2)
    else:
        pytest.fail("B never read the run's output")

    status, out, err = await _as_b(monkeypatch, capsys, home_b, "stacks", "pod", "--json", "--wait", "5")
    assert status == 0, err
    assert "wait_for_the_others" in out

    # stopping alice's run: refused without --yes, naming whose it is; done with it
    status, out, err = await _as_b(monkeypatch, capsys, home_b, "stop", "pod")
    assert status == 2 and "alice" in err and run_id in err, err
    assert not (pod.provider.store.worker_dir("pod", 0) / "tpu-console" / "runs" / run_id / "exit").exists()
    follow = asyncio.create_task(_as_b(monkeypatch, capsys, home_b, "logs", "pod", "--follow"))
    await asyncio.sleep(1.0)
    status, out, err = await _as_b(monkeypatch, capsys, home_b, "stop", "pod", "--yes", "--grace", "2")
    assert status == 0, err
    await asyncio.wait_for(follow, 60)
    assert RunStore(home_b / "console.sqlite").get(run_id).launched_by["user"] == "alice"
    wait_for(lambda: all((pod.provider.store.worker_dir("pod", w) / "tpu-console" / "runs" / run_id
                          / "exit").exists() for w in (0, 1)), timeout=20)


async def test_of_two_launches_at_once_from_two_homes_one_is_refused_naming_the_holder(
    two_worker_pod, tmp_path, monkeypatch, capsys
):
    pod = two_worker_pod
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    home_a = Path(os.environ["TPU_CONSOLE_HOME"])
    home_b = _home_b(tmp_path, pod)

    async def as_a():
        try:
            return await launch({"local": pod.provider}, "pod",
                                job=JobSpec.from_command([sys.executable, str(script)]),
                                store=RunStore(home_a / "console.sqlite"))
        except UserError as exc:
            return exc

    async def as_b():  # another process: this one's environment is alice's while her launch runs
        env = {**os.environ, "TPU_CONSOLE_HOME": str(home_b), "USER": "bob", "LOGNAME": "bob"}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tpu_console", "launch", "pod", "--json", "--", sys.executable, str(script),
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await process.communicate()
        return process.returncode, out.decode(), err.decode()

    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("LOGNAME", "alice")
    a, (b_status, b_out, b_err) = await asyncio.gather(as_a(), as_b())
    a_started = not isinstance(a, UserError) and a.ok
    b_started = b_status == 0 and json.loads(b_out)["started"]
    assert a_started != b_started, (a, b_status, b_err)  # exactly one
    refusal = b_err if a_started else str(a)
    holder = "alice" if a_started else "bob"
    assert f"held by {holder}" in refusal and " since " in refusal, refusal
    run_id = a.run_id if a_started else json.loads(b_out)["run_id"]

    # stopped from home B (--yes: a script), the node is free again
    status, out, err = await _as_b(monkeypatch, capsys, home_b, "stop", "pod", run_id, "--yes",
                                   "--grace", "2", "--json")
    assert status == 0, err
    if json.loads(out)["state"] == "stopped":  # seen ended by the stop itself: it released the lock
        assert not (pod.provider.store.worker_dir("pod", 0) / "tpu-console" / "launch.lock").exists()
    wait_for(lambda: all((pod.provider.store.worker_dir("pod", w) / "tpu-console" / "runs" / run_id
                          / "exit").exists() for w in (0, 1)), timeout=20)
    status, out, err = await _as_b(monkeypatch, capsys, home_b, "launch", "pod", "--json", "--",
                                   sys.executable, "-c", "print('second')")
    assert status == 0 and json.loads(out)["started"], err


def test_stopping_another_persons_run_asks_for_its_id_typed_back(monkeypatch):
    from datetime import UTC, datetime

    from tpu_console.cli import prompts
    from tpu_console.history.store import RunRecord

    monkeypatch.setenv("USER", "bob")
    monkeypatch.setenv("LOGNAME", "bob")
    record = RunRecord("20260101-000000-abcd", "pod", "local", "local-2x1", [0, 1], "c", "d", [], "python3",
                       datetime.now(UTC), launched_by={"user": "alice", "host": "alices-laptop"})
    monkeypatch.setattr(prompts, "can_ask", lambda json_mode: True)
    questions: list[str] = []
    answers = iter(["y", record.run_id])
    monkeypatch.setattr("builtins.input", lambda question: questions.append(question) or next(answers))
    with pytest.raises(UserError, match="not stopping alice on alices-laptop's run .* did not match"):
        prompts.confirm_stop(record, yes=False, json_mode=False)  # a y/N answer is not enough
    assert "is alice on alices-laptop's run; type its run id" in questions[0]
    prompts.confirm_stop(record, yes=False, json_mode=False)  # the id typed back
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("LOGNAME", "alice")
    answers = iter(["y"])
    prompts.confirm_stop(record, yes=False, json_mode=False)  # her own: y/N as before


def _open_store(path: str) -> None:
    RunStore(Path(path))


def test_consoles_opening_one_older_database_at_once_all_open_it(tmp_path):
    """The app and a CLI command (or two people's consoles on a shared home) open the run history together;
    the columns added since its first release are added once, and no console fails on a duplicate."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    for trial in range(12):
        path = tmp_path / f"runs-{trial}.db"
        with sqlite3.connect(path) as db:  # a database from the first release: none of the added columns
            db.executescript(store._SCHEMA)
        openers = [context.Process(target=_open_store, args=(str(path),)) for _ in range(6)]
        for opener in openers:
            opener.start()
        for opener in openers:
            opener.join()
        assert [opener.exitcode for opener in openers] == [0] * 6
        with sqlite3.connect(path) as db:
            columns = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
            worker_columns = {row[1] for row in db.execute("PRAGMA table_info(run_workers)")}
        assert set(store._ADDED_COLUMNS) <= columns
        assert set(store._ADDED_WORKER_COLUMNS) <= worker_columns
