"""The fleet layer against a 4-worker local pod: per-worker results, streaming, timeouts, file transfer,
reconnects, unreachable workers and host-key pinning. The tests that take `local_fleet` run twice: on
the exec path (an SSH session per command) and on the command channel (worker/agent.py), which must
give the same results."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import asyncssh
import pytest

from tests.conftest import LocalPod
from tests.processes import pid_alive
from tpu_console.errors import Unreachable, UserError
from tpu_console.fleet.fleet import Fleet, WorkerLine


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens here once the socket is closed


@pytest.fixture(params=["exec", "channel"])
async def local_fleet(request: pytest.FixtureRequest, local_pod: LocalPod) -> AsyncIterator[Fleet]:
    """A fleet on the local pod whose commands all take one path: `exec` or the command `channel`."""
    async with Fleet(local_pod.targets, command_channels=request.param == "channel") as fleet:
        if request.param == "channel":
            assert await fleet.start_command_channels() == {}
            assert all(fleet.connection(w).command_channel() for w in range(4))
        yield fleet
        if request.param == "channel":  # nothing took the exec path, except on a connection made again
            assert all(c.exec_commands == 0 for c in map(fleet.connection, range(4)) if c.connects == 1)


async def test_each_worker_sees_its_own_index_home_and_devices(local_pod: LocalPod, local_fleet: Fleet):
    results = await local_fleet.run(
        'echo "$TPU_WORKER_ID/$TPU_WORKER_COUNT $HOME $PWD $XLA_FLAGS $JAX_PLATFORMS"'
    )
    assert [r.worker for r in results] == [0, 1, 2, 3]
    for r in results:
        home = local_pod.worker_dir(r.worker)
        assert r.ok, r
        assert r.stdout == f"{r.worker}/4 {home} {home} --xla_force_host_platform_device_count=2 cpu\n"


async def test_exit_status_and_stderr_are_kept_per_worker(local_fleet: Fleet):
    results = await local_fleet.run(
        'echo "out $TPU_WORKER_ID"; echo "err $TPU_WORKER_ID" >&2; exit $((TPU_WORKER_ID * 3))'
    )
    assert [r.exit_status for r in results] == [0, 3, 6, 9]
    assert [r.ok for r in results] == [True, False, False, False]
    assert [r.stderr for r in results] == [f"err {i}\n" for i in range(4)]
    assert all(r.error is None and r.duration_s > 0 for r in results)


async def test_death_by_signal_reads_as_128_plus_n(local_fleet: Fleet):
    [result] = await local_fleet.run("kill -TERM $$", workers=[2])
    assert result.exit_status == 128 + 15


async def test_selection_runs_only_there_and_rejects_unknown_workers(local_pod: LocalPod, local_fleet: Fleet):
    results = await local_fleet.run("touch ran", workers=[3, 1])
    assert [r.worker for r in results] == [1, 3]
    assert [(local_pod.worker_dir(i) / "ran").exists() for i in range(4)] == [False, True, False, True]
    with pytest.raises(UserError, match="no worker 4 on this node; valid workers: 0-3"):
        await local_fleet.run("touch ran", workers=[0, 4])
    assert not (local_pod.worker_dir(0) / "ran").exists()  # nothing ran before the bad index was refused


async def test_lines_stream_tagged_by_worker_and_stream(local_fleet: Fleet):
    lines: list[WorkerLine] = []
    results = await local_fleet.run(
        'for i in 1 2; do echo "w$TPU_WORKER_ID line $i"; done; printf "no newline" >&2',
        on_line=lines.append,
    )
    assert all(r.ok for r in results)
    for worker in range(4):
        mine = [(line.stream, line.text) for line in lines if line.worker == worker]
        assert mine == [
            ("stdout", f"w{worker} line 1"),
            ("stdout", f"w{worker} line 2"),
            ("stderr", "no newline"),
        ]
    assert results[1].stdout == "w1 line 1\nw1 line 2\n"


async def test_large_output_and_input_arrive_whole(local_fleet: Fleet):
    data = "".join(f"line {i}\n" for i in range(250_000))  # about 2.4 MB each way: more than any pipe
    results = await local_fleet.run(
        "cat; head -c 3000000 /dev/zero | tr '\\0' y >&2", stdin=data, workers=[1, 2]
    )
    for r in results:
        assert r.ok, r.error
        assert r.stdout == data and r.stderr == "y" * 3_000_000


async def test_env_and_stdin_reach_the_command(local_fleet: Fleet):
    results = await local_fleet.run(
        'echo "$GREETING $(cat)"', env={"GREETING": "it's 'quoted' $HOME"}, stdin="from stdin"
    )
    assert {r.stdout for r in results} == {"it's 'quoted' $HOME from stdin\n"}
    with pytest.raises(UserError, match="invalid environment variable name"):
        await local_fleet.run("true", env={"BAD-NAME": "x"})


async def test_timeout_gives_a_per_worker_error_and_stops_the_command(
    local_pod: LocalPod, local_fleet: Fleet
):
    started = time.monotonic()
    results = await local_fleet.run("echo $$ > pid; echo started; exec sleep 30", timeout=0.5)
    assert time.monotonic() - started < 5
    for r in results:
        assert r.exit_status is None and r.error == "timed out after 0.5s"
        assert r.stdout == "started\n"  # what arrived before the deadline is kept
    pids = [int((local_pod.worker_dir(i) / "pid").read_text()) for i in range(4)]
    deadline = time.monotonic() + 5
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not any(pid_alive(pid) for pid in pids)


async def test_concurrency_is_bounded_overall(local_pod: LocalPod):
    # the exec path: every command opens an SSH channel, and the overall limit bounds those
    async with Fleet(local_pod.targets, overall_limit=2, command_channels=False) as fleet:
        await fleet.run("true")  # connect first, so only the command phase is timed
        started = time.monotonic()
        results = await fleet.run("sleep 0.3")
        elapsed = time.monotonic() - started
    assert all(r.ok for r in results)
    assert elapsed >= 0.6  # 4 workers, 2 at a time: at least two rounds


async def test_commands_on_command_channels_take_no_place_in_the_overall_limit(local_pod: LocalPod):
    # Each command waits until all four have started (the workers' folders are siblings): with the
    # overall limit applied, two would wait for two that never start, and time out.
    barrier = ('touch ../started-$TPU_WORKER_ID; '
               'until [ "$(ls ../started-* | wc -l)" -ge 4 ]; do sleep 0.02; done')
    async with Fleet(local_pod.targets, overall_limit=2) as fleet:
        assert await fleet.start_command_channels() == {}
        results = await fleet.run(barrier, timeout=10)
    assert [r.error for r in results] == [None] * 4 and all(r.ok for r in results)


async def test_connections_persist_across_commands(local_fleet: Fleet):
    for _ in range(3):
        assert all(r.ok for r in await local_fleet.run("true"))
    assert [local_fleet.connection(w).connects for w in range(4)] == [1, 1, 1, 1]


async def test_a_dropped_connection_is_reestablished(local_pod: LocalPod, local_fleet: Fleet):
    assert all(r.ok for r in await local_fleet.run("true"))
    server = local_pod.provider.worker_server("pod", 1)
    await server.close()  # the worker goes down: its connection is dropped
    await server.start(server.port)  # and comes back on the same address
    results = await local_fleet.run("echo $TPU_WORKER_ID")
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n", "3\n"]
    assert [local_fleet.connection(w).connects for w in range(4)] == [1, 2, 1, 1]


async def test_reconnect_backs_off_until_the_worker_is_back(local_pod: LocalPod, local_fleet: Fleet):
    assert all(r.ok for r in await local_fleet.run("true"))
    server = local_pod.provider.worker_server("pod", 0)
    await server.close()

    async def come_back_later() -> None:
        await asyncio.sleep(0.3)  # after the first refused attempt, before the last retry (0.75 s)
        await server.start(server.port)

    revive = asyncio.create_task(come_back_later())
    [result] = await local_fleet.run("echo back", workers=[0])
    await revive
    assert result.ok and result.stdout == "back\n", result


async def test_unreachable_worker_is_a_per_worker_error(local_pod: LocalPod):
    dead = replace(local_pod.targets[3], port=_closed_port())
    async with Fleet([*local_pod.targets[:3], dead], connect_timeout=2) as fleet:
        results = await fleet.run("echo hi")
        assert [r.ok for r in results] == [True, True, True, False]
        assert results[3].exit_status is None
        assert (
            results[3].error.startswith("unreachable: connection refused")
            and str(dead.port) in results[3].error
        )
        with pytest.raises(Unreachable, match="connection refused"):
            await fleet.get("anything", 3)


async def test_a_host_key_other_than_the_pinned_one_is_refused(local_pod: LocalPod):
    impostor_key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    wrong = replace(local_pod.targets[2], host_keys=(impostor_key,))
    async with Fleet([*local_pod.targets[:2], wrong]) as fleet:
        results = await fleet.run("touch reached")
    assert [r.ok for r in results] == [True, True, False]
    assert results[2].error.startswith("unreachable: host key changed: worker 2 (127.0.0.1:")
    assert "pinned" in results[2].error
    assert not (local_pod.worker_dir(2) / "reached").exists()


async def test_put_and_get_files(local_pod: LocalPod, local_fleet: Fleet, tmp_path: Path):
    results = await local_fleet.put(b"lr: 0.1\n", "tpu-console/runs/r1/config.yaml", mode=0o600)
    assert all(r.ok for r in results), results
    for worker in range(4):
        written = local_pod.worker_dir(worker) / "tpu-console/runs/r1/config.yaml"
        assert written.read_bytes() == b"lr: 0.1\n"
        assert written.stat().st_mode & 0o777 == 0o600
        assert [p.name for p in written.parent.iterdir()] == ["config.yaml"]  # no temp file left behind
    local = tmp_path / "data.bin"
    local.write_bytes(bytes(range(256)) * 1000)
    assert all(r.ok for r in await local_fleet.put(local, "data.bin", workers=[1]))
    assert await local_fleet.get("data.bin", 1) == local.read_bytes()
    with pytest.raises(FileNotFoundError, match="worker 0: no file data.bin"):
        await local_fleet.get("data.bin", 0)


async def test_an_unreadable_client_key_fails_before_any_worker_runs(local_pod: LocalPod, tmp_path: Path):
    broken = tmp_path / "broken_key"
    broken.write_text("not a key\n")
    targets = [*local_pod.targets[:3], replace(local_pod.targets[3], client_key=broken)]
    async with Fleet(targets) as fleet:
        with pytest.raises(UserError, match="cannot read SSH key .*broken_key"):
            await fleet.run("touch ran")
    assert not any((local_pod.worker_dir(i) / "ran").exists() for i in range(4))


async def test_a_connection_closing_while_a_channel_opens_is_reconnected_once(
    local_pod: LocalPod, monkeypatch
):
    """asyncssh raises AttributeError when the connection goes away mid-open: the command had not started,
    so the fleet reconnects and sends it again, as for any connection lost before a command began."""
    from tpu_console.fleet import fleet as fleet_module

    real_open, calls = fleet_module.open_command, []

    async def open_once_broken(ssh, command, worker, on_line, streamed=False):
        calls.append(worker)
        if len(calls) == 1:
            ssh.close()
            await ssh.wait_closed()
            raise AttributeError("'NoneType' object has no attribute 'session_started'")
        return await real_open(ssh, command, worker, on_line, streamed)

    monkeypatch.setattr(fleet_module, "open_command", open_once_broken)
    async with Fleet(local_pod.targets, command_channels=False) as fleet:
        (result,) = await fleet.run("echo again", [0])
    assert (result.exit_status, result.stdout, result.error) == (0, "again\n", None) and calls == [0, 0]
