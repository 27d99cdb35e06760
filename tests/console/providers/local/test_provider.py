"""The local provider: types, create/list/get/delete, pinned host keys, and detached jobs that outlive
the console process."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import textwrap
import time

import pytest

from tests.conftest import LocalPod
from tests.processes import pid_alive
from tpu_console.domain import CreateRequest, NodeState
from tpu_console.errors import AlreadyExists, NotFound, UserError
from tpu_console.fleet.fleet import Fleet
from tpu_console.providers.local import LocalProvider, parse_local_type

# A minimal launch wrapper, as the run launcher writes it: a job in its own session that records its
# process group, and its exit status once it ends. It waits for a `go` file so the test controls its end.
# Only the redirected `setsid` command is backgrounded: backgrounding a whole `a && b &` list would leave
# a subshell holding the session's stdout until the job ends (with sshd as with the local server).
DETACHED_JOB = (
    "mkdir -p tpu-console/runs/r1; cd tpu-console/runs/r1 || exit 1; "
    "setsid nohup bash -c 'echo $$ > pid.tmp && mv pid.tmp pid; while [ ! -f go ]; do sleep 0.05; done; "
    'echo "finished on $TPU_WORKER_ID"; echo 0 > exit.tmp; mv exit.tmp exit\' > output.log 2>&1 < /dev/null &'
)




async def _wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()


@pytest.mark.parametrize(
    ("accelerator_type", "workers", "devices"),
    [("local-v6e-8", 1, 8), ("local-v6e-16", 4, 4), ("local-v4-16", 2, 4), ("local-3x2", 3, 2)],
)
def test_local_types(accelerator_type: str, workers: int, devices: int):
    shape = parse_local_type(accelerator_type)
    assert (shape.workers, shape.devices_per_worker, shape.total_devices) == (
        workers,
        devices,
        workers * devices,
    )


@pytest.mark.parametrize("bad", ["local-3x0", "v6e-8", "local-0x4", "local-2x", "local-1025x1"])
def test_bad_local_types_name_the_valid_ones(bad: str):
    with pytest.raises(UserError, match=r"local-WxD .* local-v6e-8, local-v6e-16, local-v4-16"):
        parse_local_type(bad)


async def test_create_list_get_delete():
    provider = LocalProvider()
    lines: list[str] = []
    node = await provider.create(
        CreateRequest(name="rehearsal", accelerator_type="local-v6e-16"), lines.append
    )
    assert (node.name, node.provider, node.state) == ("rehearsal", "local", NodeState.READY)
    assert (node.shape.workers, node.shape.devices_per_worker, node.accelerator_type) == (
        4,
        4,
        "local-v6e-16",
    )
    assert lines and all("rehearsal" in line for line in lines)
    again = LocalProvider()  # a later console reads the same node from disk
    assert [n.name for n in (await again.list_nodes()).nodes] == ["rehearsal"]
    assert (await again.get("rehearsal")).shape == node.shape
    await again.delete("rehearsal")
    assert (await provider.list_nodes()).nodes == []
    with pytest.raises(NotFound, match="no local node named 'rehearsal'"):
        await provider.get("rehearsal")


async def test_delete_moves_a_big_pod_aside_at_once_and_removes_its_files_in_the_background():
    """A pod whose workers hold a project's environment (thousands of files): `delete` answers at once,
    says where the files went, frees the name, and the files are gone soon after (with what a removal the
    machine lost half-way left behind)."""
    provider = LocalProvider()
    await provider.create(CreateRequest(name="big", accelerator_type="local-2x1"))
    for worker in range(2):
        env = provider.store.worker_dir("big", worker) / "tpu-console" / "envs" / "s1"
        for package in range(20):
            (env / f"pkg{package}").mkdir(parents=True)
            for module in range(100):
                (env / f"pkg{package}" / f"m{module}.py").write_text("x = 1\n" * 50)
    left_over = provider.store.root / ".trash" / "old-1"  # a removal cut short earlier
    (left_over / "workers").mkdir(parents=True)
    lines: list[str] = []
    started = time.monotonic()
    await provider.delete("big", lines.append)
    took = time.monotonic() - started
    assert took < 2.0, took  # a rename, not a walk of 4,000 files
    assert lines[-1].startswith("big: deleted; its files are being removed in the background (")
    assert (await provider.list_nodes()).nodes == [] and not provider.store.node_dir("big").exists()
    await provider.create(CreateRequest(name="big", accelerator_type="local-2x1"))  # the name is free
    assert await _wait_for(lambda: not any((provider.store.root / ".trash").iterdir()), timeout=60)
    assert [n.name for n in (await provider.list_nodes()).nodes] == ["big"]
    await provider.delete("big")


async def test_create_refuses_bad_input_before_making_anything():
    provider = LocalProvider()
    with pytest.raises(UserError, match="unknown local accelerator type 'v6e-8'"):
        await provider.create(CreateRequest(name="pod", accelerator_type="v6e-8"))
    with pytest.raises(UserError, match="invalid node name 'Bad_Name'"):
        await provider.create(CreateRequest(name="Bad_Name", accelerator_type="local-1x1"))
    assert list(provider.store.root.iterdir()) == []
    await provider.create(CreateRequest(name="pod", accelerator_type="local-1x1"))
    with pytest.raises(AlreadyExists, match="'pod' already exists"):
        await provider.create(CreateRequest(name="pod", accelerator_type="local-2x1"))
    with pytest.raises(NotFound):
        await provider.delete("no-such-pod")


async def test_host_keys_are_made_once_and_stay_pinned(local_pod: LocalPod):
    later = LocalProvider()
    try:
        targets = await later.ssh_targets(await later.get("pod"))
        assert [t.host_keys for t in targets] == [t.host_keys for t in local_pod.targets]
        assert len({t.host_keys for t in targets}) == 4  # one key per worker
        assert {t.port for t in targets}.isdisjoint({t.port for t in local_pod.targets})
        async with Fleet(targets) as fleet:
            assert all(r.ok for r in await fleet.run("true"))
    finally:
        await later.close()


async def test_coordinator_env_points_at_worker_0(local_pod: LocalPod):
    env = local_pod.provider.coordinator_env(local_pod.node, local_pod.targets)
    host, port = env["TRAINER_COORDINATOR_ADDRESS"].rsplit(":", 1)
    assert host == "127.0.0.1" and 1024 <= int(port) <= 65535
    assert env["TRAINER_NUM_PROCESSES"] == "4"


async def test_a_detached_job_outlives_the_console_process(local_pod: LocalPod):
    # Another console process starts the job on every worker, then exits (taking its SSH servers along).
    console = textwrap.dedent(
        f"""
        import asyncio
        from tpu_console.fleet.fleet import Fleet
        from tpu_console.providers.local import LocalProvider

        async def main():
            provider = LocalProvider()
            targets = await provider.ssh_targets(await provider.get("pod"))
            async with Fleet(targets) as fleet:
                results = await fleet.run({DETACHED_JOB!r}, timeout=10)
            await provider.close()
            assert all(r.ok for r in results), results

        asyncio.run(main())
        """
    )
    other_console = await asyncio.create_subprocess_exec(
        sys.executable, "-c", console, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await asyncio.wait_for(other_console.communicate(), 60)
    assert other_console.returncode == 0, output.decode()
    runs = [local_pod.worker_dir(i) / "tpu-console/runs/r1" for i in range(4)]
    assert await _wait_for(lambda: all((run / "pid").exists() for run in runs))
    pids = [int((run / "pid").read_text()) for run in runs]
    assert all(pid_alive(pid) for pid in pids) and not any((run / "exit").exists() for run in runs)

    # This console (its own servers, new connections) finds the jobs by their files and lets them finish.
    async with Fleet(local_pod.targets) as fleet:
        status = await fleet.run('kill -0 "$(cat tpu-console/runs/r1/pid)" && echo running')
        assert [r.stdout for r in status] == ["running\n"] * 4
        await fleet.run("touch tpu-console/runs/r1/go")
    assert await _wait_for(lambda: all((run / "exit").exists() for run in runs))
    assert [(run / "output.log").read_text() for run in runs] == [f"finished on {i}\n" for i in range(4)]


async def test_delete_stops_running_jobs(local_pod: LocalPod):
    async with Fleet(local_pod.targets) as fleet:
        assert all(r.ok for r in await fleet.run(DETACHED_JOB))
    pid_files = [local_pod.worker_dir(i) / "tpu-console/runs/r1/pid" for i in range(4)]
    assert await _wait_for(lambda: all(pid_file.exists() for pid_file in pid_files))
    pids = [int(p.read_text()) for p in pid_files]
    assert all(pid_alive(pid) for pid in pids)
    await local_pod.provider.delete("pod")
    assert await _wait_for(lambda: not any(pid_alive(pid) for pid in pids), timeout=5)
    assert not local_pod.provider.store.node_dir("pod").exists()


async def _spare_ready(server) -> bool:
    """The next spare is started shortly after a command ends: wait for it (up to 5 s)."""
    for _ in range(100):
        if await server.spares.wait_ready():
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_command_on_a_spare_shell_sees_the_worker_and_shares_no_state(local_pod: LocalPod):
    server = local_pod.provider.worker_server(local_pod.node.name, 1)
    async with Fleet(local_pod.targets) as fleet:
        assert await _spare_ready(server)
        [first] = await fleet.run(
            'echo "$TPU_WORKER_ID $HOME $PWD ${__tpu_command-unset}"; echo "$BASH_EXECUTION_STRING";'
            ' echo pid=$$; [ -d "$TPU_LOG_DIR" ] && echo "$TPU_LOG_DIR"; LEFT_BEHIND=1; cd /',
            workers=[1],
        )
        home = local_pod.worker_dir(1)
        assert first.ok, first
        lines = first.stdout.splitlines()
        assert lines[0] == f"1 {home} {home} unset"
        assert "__tpu_command" in lines[1]  # it did run on a spare, not through `bash -c <command>`
        assert lines[3] == f"{home}/tpu_logs"  # libtpu's logs (and Ray's stream of them): the worker's own
        assert await _spare_ready(server)
        [second] = await fleet.run('echo "${LEFT_BEHIND-unset} $PWD pid=$$"', workers=[1])
        assert second.ok, second
        left, pwd, pid = second.stdout.split()
        assert (left, pwd) == ("unset", str(home))
        assert pid != lines[2]  # a fresh bash for each command


async def test_a_slice_made_again_is_reached_even_where_its_old_port_was_taken_meanwhile():
    provider = LocalProvider()
    try:
        await provider.create(CreateRequest(name="ms", accelerator_type="local-1x1", slices=2))
        before = await provider.ssh_targets(await provider.get("ms"))
        await provider.preempt("ms", slice_index=0)
        with socket.socket() as taken:  # another program's connection got the port meanwhile
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the closed server's TIME_WAIT
            with contextlib.suppress(OSError):  # a socket of the closed server's still holds it: as taken
                taken.bind(("127.0.0.1", before[0].port))
                taken.listen()
            await provider.recreate_slice("ms", 0)
            node = await provider.get("ms")
            assert node.state is NodeState.READY
            targets = await provider.ssh_targets(node)
            assert targets[0].port != before[0].port
            fleet = Fleet(targets)
            try:
                (answer,) = await fleet.run("echo up", [0], timeout=30)
            finally:
                await fleet.close()
            assert answer.ok and answer.stdout.strip() == "up"
    finally:
        await provider.close()
