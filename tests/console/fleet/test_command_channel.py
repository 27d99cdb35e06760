"""The fleet's command channel (one long-lived session per worker running worker/agent.py): when it
starts, what happens when it cannot, when its agent or connection goes away, and the same against a
stock OpenSSH sshd. What every command does on it (streams, exit statuses, timeouts, env, stdin) is in
test_fleet.py, which runs each test on both paths."""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import signal
from pathlib import Path

import asyncssh
import pytest

from tests.conftest import LocalPod
from tests.fixtures_sshd import Sshd
from tests.processes import pid_alive
from tpu_console import asyncssh_tuning, ssh_identity
from tpu_console.fleet import command_channel
from tpu_console.fleet.fleet import CHANNEL_AFTER_COMMANDS, Fleet, WorkerLine
from tpu_console.providers.ssh import SshProvider
from tpu_console.settings import Settings, SshNodeSettings, SshSettings


async def _until(predicate, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


def _is_agent(pid: int) -> bool:
    return b"sys.stdin.buffer.read" in Path(f"/proc/{pid}/cmdline").read_bytes()


async def _first_line(lines: list[WorkerLine]) -> str:
    await _until(lambda: bool(lines))
    return lines[0].text


async def test_the_channel_starts_after_a_connections_second_command(local_pod: LocalPod):
    async with Fleet(local_pod.targets) as fleet:
        conn = fleet.connection(2)
        for _ in range(CHANNEL_AFTER_COMMANDS - 1):
            assert (await fleet.run("true", workers=[2]))[0].ok
        await asyncio.sleep(0.3)
        assert conn.command_channel() is None  # a one-off command starts nothing
        assert (await fleet.run("true", workers=[2]))[0].ok
        await _until(lambda: conn.command_channel() is not None)
        [result] = await fleet.run('echo "$TPU_WORKER_ID $PPID"', workers=[2])
        worker, parent = result.stdout.split()
        assert worker == "2" and result.ok
        assert _is_agent(int(parent))  # run by the agent, not by the server
        assert (conn.exec_commands, conn.channels_started, conn.connects) == (CHANNEL_AFTER_COMMANDS, 1, 1)


async def test_a_worker_without_the_agents_python_keeps_the_exec_path(
    local_pod: LocalPod, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(command_channel, "AGENT_PYTHON", "python3-not-installed")
    async with Fleet(local_pod.targets) as fleet:
        problems = await fleet.start_command_channels()
        assert sorted(problems) == [0, 1, 2, 3]
        assert "python3-not-installed" in problems[0] and "not found" in problems[0]
        for _ in range(3):
            results = await fleet.run('echo "$TPU_WORKER_ID"; exit 4')
            assert [(r.stdout, r.exit_status, r.error) for r in results] == [
                (f"{w}\n", 4, None) for w in range(4)
            ]
        conn = fleet.connection(0)
        assert conn.command_channel() is None and conn.channels_started == 0
        assert conn.channel_problem == problems[0]  # not tried again on this connection
        assert conn.exec_commands == 3


async def test_an_agent_that_dies_fails_its_commands_only_and_is_started_again(local_pod: LocalPod):
    async with Fleet(local_pod.targets) as fleet:
        assert await fleet.start_command_channels() == {}
        lines: list[WorkerLine] = []
        running = asyncio.create_task(
            fleet.run("echo $$ $PPID; exec sleep 30", workers=[1], on_line=lines.append)
        )
        command, agent = map(int, (await _first_line(lines)).split())
        os.kill(agent, signal.SIGTERM)  # the agent goes away with a command running
        [result] = await running
        assert result.exit_status is None and result.error.startswith("connection lost while running")
        await _until(lambda: not pid_alive(command))  # the agent stopped it on its way out
        conn = fleet.connection(1)
        assert conn.connects == 1  # the connection itself is fine
        assert [r.stdout for r in await fleet.run("echo $TPU_WORKER_ID")] == ["0\n", "1\n", "2\n", "3\n"]
        assert conn.exec_commands == 1 and fleet.connection(0).exec_commands == 0
        assert await fleet.start_command_channels() == {}
        assert conn.channels_started == 2
        [result] = await fleet.run("echo $PPID", workers=[1])
        assert result.ok and int(result.stdout) != agent


async def test_a_dropped_connection_gets_a_new_channel(local_pod: LocalPod):
    async with Fleet(local_pod.targets) as fleet:
        assert await fleet.start_command_channels() == {}
        server = local_pod.provider.worker_server("pod", 3)
        await server.close()  # the worker goes down: its connection and agent with it
        await server.start(server.port)
        [result] = await fleet.run("echo back", workers=[3])
        assert result.stdout == "back\n"
        assert await fleet.start_command_channels() == {}
        conn = fleet.connection(3)
        assert (conn.connects, conn.channels_started) == (2, 2)
        [result] = await fleet.run("echo again", workers=[3])
        assert result.stdout == "again\n" and conn.exec_commands == 1


async def test_closing_the_fleet_stops_commands_still_running_on_the_channel(local_pod: LocalPod):
    fleet = Fleet(local_pod.targets)
    assert await fleet.start_command_channels() == {}
    [slow] = await fleet.run("sleep 20", workers=[0], timeout=0.5)
    assert slow.error == "timed out after 0.5s"
    [after] = await fleet.run("echo still fine", workers=[0])  # the channel survives a timeout
    assert after.stdout == "still fine\n" and fleet.connection(0).channels_started == 1
    lines: list[WorkerLine] = []
    running = asyncio.create_task(fleet.run("echo $$; exec sleep 30", workers=[0], on_line=lines.append))
    pid = int(await _first_line(lines))
    await fleet.close()
    [result] = await running
    assert result.error.startswith("connection lost while running")
    await _until(lambda: not pid_alive(pid), timeout=5)


async def test_asyncssh_sends_no_padding_packets_under_aead_ciphers(
    local_pod: LocalPod, caplog: pytest.LogCaptureFixture
):
    assert asyncssh_tuning.apply()  # the installed asyncssh is one the tuning knows
    asyncssh.set_debug_level(3)  # packet logs, to see what went over the wire
    caplog.set_level(logging.DEBUG, logger="asyncssh")
    try:
        async with Fleet(local_pod.targets[:1]) as fleet:
            assert await fleet.start_command_channels() == {}
            assert fleet.connection(0)._conn.get_extra_info("send_cipher") == "aes128-gcm@openssh.com"
            caplog.clear()
            assert (await fleet.run("echo hi"))[0].stdout == "hi\n"
    finally:
        asyncssh.set_debug_level(1)
    sent = [r.getMessage() for r in caplog.records if "] Sent MSG_" in r.getMessage()]  # both ends
    assert any("MSG_CHANNEL_DATA" in message for message in sent), sent
    assert not any("MSG_IGNORE" in message for message in sent), sent


# -- against a stock OpenSSH sshd ------------------------------------------------------------------------


async def _sshd_targets(sshd: Sshd, tmp_path: Path, workers: int = 2):
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_key_line}\n")
    node = SshNodeSettings(
        name="lab",
        hosts=[f"127.0.0.1:{sshd.port}"] * workers,
        user=getpass.getuser(),
        key=str(ssh_identity.client_key_path()),
        known_hosts=str(known_hosts),
    )
    provider = SshProvider(Settings(ssh=SshSettings(nodes=[node])))
    return await provider.ssh_targets(await provider.get("lab"))


async def test_the_channel_against_openssh(sshd: Sshd, tmp_path: Path):
    async with Fleet(await _sshd_targets(sshd, tmp_path)) as fleet:
        assert await fleet.start_command_channels() == {}
        lines: list[WorkerLine] = []
        results = await fleet.run(
            'echo "one $GREETING"; echo oops >&2; printf "%s" "$(cat)"; exit 3',
            env={"GREETING": "it's $HOME"},
            stdin="no newline",
            on_line=lines.append,
        )
        for r in results:
            assert (r.stdout, r.stderr, r.exit_status, r.error) == (
                "one it's $HOME\nno newline",
                "oops\n",
                3,
                None,
            )
        assert sorted((line.worker, line.stream, line.text) for line in lines) == sorted(
            (w, stream, text)
            for w in (0, 1)
            for stream, text in (("stdout", "one it's $HOME"), ("stderr", "oops"), ("stdout", "no newline"))
        )
        [killed] = await fleet.run("kill -KILL $$", workers=[0])
        assert killed.exit_status == 128 + 9
        [timed_out] = await fleet.run("echo $$; exec sleep 30", workers=[1], timeout=1)
        assert timed_out.error == "timed out after 1s" and timed_out.stdout
        await _until(lambda: not pid_alive(int(timed_out.stdout)), timeout=5)
        [after] = await fleet.run("echo $PPID", workers=[1])
        assert _is_agent(int(after.stdout))  # still on the channel
        assert all(fleet.connection(w).exec_commands == 0 for w in (0, 1))


async def test_openssh_without_the_agents_python_keeps_the_exec_path(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(command_channel, "AGENT_PYTHON", "python3-not-installed")
    async with Fleet(await _sshd_targets(sshd, tmp_path, workers=1)) as fleet:
        problems = await fleet.start_command_channels()
        assert list(problems) == [0] and "python3-not-installed" in problems[0]
        for _ in range(3):
            [result] = await fleet.run("echo fine; exit 2")
            assert (result.stdout, result.exit_status) == ("fine\n", 2)
        assert fleet.connection(0).exec_commands == 3
