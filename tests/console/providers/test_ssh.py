"""The ssh provider: config parsing, and the fleet against a real OpenSSH sshd on 127.0.0.1
(known_hosts trust, accept_new, changed keys, SFTP, unreachable workers)."""

from __future__ import annotations

import getpass
import socket
from pathlib import Path

import asyncssh
import pytest

from tests.fixtures_sshd import Sshd
from tpu_console import ssh_identity
from tpu_console.domain import NodeState
from tpu_console.errors import NotFound, UserError
from tpu_console.fleet.fleet import Fleet
from tpu_console.providers.ssh import SshProvider, parse_host
from tpu_console.settings import Settings, SshNodeSettings, SshSettings


def _provider(hosts: list[str], known_hosts: Path, accept_new: bool = False, **extra) -> SshProvider:
    node = SshNodeSettings(
        name="lab",
        hosts=hosts,
        user=getpass.getuser(),
        key=str(ssh_identity.client_key_path()),
        known_hosts=str(known_hosts),
        accept_new=accept_new,
        **extra,
    )
    return SshProvider(Settings(ssh=SshSettings(nodes=[node])))


async def _fleet(provider: SshProvider, **options) -> Fleet:
    return Fleet(await provider.ssh_targets(await provider.get("lab")), **options)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.0.0.5", ("10.0.0.5", 22)),
        ("host.example:2222", ("host.example", 2222)),
        ("[::1]:2200", ("::1", 2200)),
        ("fe80::1", ("fe80::1", 22)),
    ],
)
def test_parse_host(text: str, expected: tuple[str, int]):
    assert parse_host(text) == expected


@pytest.mark.parametrize("bad", ["host:0", "host:abc", ":22", "[::1]x"])
def test_parse_host_rejects_malformed(bad: str):
    with pytest.raises(UserError, match="ssh host"):
        parse_host(bad)


async def test_nodes_come_from_config(tmp_path: Path):
    provider = _provider(["a:2201", "b"], tmp_path / "kh", devices_per_worker=4, accelerator_type="v4-16")
    [node] = (await provider.list_nodes()).nodes
    assert (node.name, node.provider, node.state) == ("lab", "ssh", NodeState.READY)
    assert [(w.index, w.host, w.port) for w in node.workers] == [(0, "a", 2201), (1, "b", 22)]
    assert (node.accelerator_type, node.shape.total_devices) == ("v4-16", 8)
    with pytest.raises(NotFound, match="no ssh node named 'other' \\(configured: lab\\)"):
        await provider.get("other")
    targets = await provider.ssh_targets(node)
    env = provider.coordinator_env(node, targets)
    assert env["TRAINER_COORDINATOR_ADDRESS"].startswith("a:") and env["TRAINER_NUM_PROCESSES"] == "2"
    assert env == provider.coordinator_env(node, targets)  # every launch on this node agrees


async def test_a_missing_key_file_is_a_user_error(tmp_path: Path):
    node = SshNodeSettings(name="lab", hosts=["h"], key=str(tmp_path / "nope"))
    provider = SshProvider(Settings(ssh=SshSettings(nodes=[node])))
    with pytest.raises(UserError, match="key file .*nope does not exist"):
        await provider.ssh_targets(await provider.get("lab"))


async def test_unknown_host_is_refused_without_accept_new(sshd: Sshd, tmp_path: Path):
    known_hosts = tmp_path / "known_hosts"
    provider = _provider([f"127.0.0.1:{sshd.port}"], known_hosts)
    async with await _fleet(provider) as fleet:
        [result] = await fleet.run("echo reached")
    assert result.exit_status is None and result.stdout == ""
    assert f"host key unknown: [127.0.0.1]:{sshd.port} is not in {known_hosts}" in result.error
    assert "accept_new = true" in result.error
    assert not known_hosts.exists()


async def test_accept_new_records_the_key_and_later_consoles_trust_it(sshd: Sshd, tmp_path: Path):
    known_hosts = tmp_path / "ssh" / "known_hosts"
    address = f"127.0.0.1:{sshd.port}"
    provider = _provider([address, address, address], known_hosts, accept_new=True)
    async with await _fleet(provider) as fleet:
        results = await fleet.run("echo $((6 * 7)); exit 5")
    assert [(r.stdout, r.exit_status, r.error) for r in results] == [("42\n", 5, None)] * 3
    assert known_hosts.read_text() == f"[127.0.0.1]:{sshd.port} {sshd.host_key_line}\n"  # once, for 3 workers

    strict = _provider([address], known_hosts, accept_new=False)
    async with await _fleet(strict) as fleet:
        [result] = await fleet.run("true")
    assert result.ok, result


async def test_a_changed_host_key_is_refused_even_with_accept_new(sshd: Sshd, tmp_path: Path):
    known_hosts = tmp_path / "known_hosts"
    old_key = " ".join(asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()[:2])
    known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {old_key}\n")
    provider = _provider([f"127.0.0.1:{sshd.port}"], known_hosts, accept_new=True)
    async with await _fleet(provider) as fleet:
        [result] = await fleet.run("echo reached")
    assert result.exit_status is None and result.stdout == ""
    assert "host key changed: worker 0 (127.0.0.1:" in result.error and "ssh-keygen -R" in result.error
    assert known_hosts.read_text() == f"[127.0.0.1]:{sshd.port} {old_key}\n"  # never overwritten


async def test_sftp_timeout_and_unreachable_worker_against_sshd(sshd: Sshd, tmp_path: Path):
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_key_line}\n")
    dead = _closed_port()
    provider = _provider([f"127.0.0.1:{sshd.port}", f"127.0.0.1:{dead}"], known_hosts)
    remote = tmp_path / "remote" / "nested" / "config.yaml"
    async with await _fleet(provider, connect_timeout=3) as fleet:
        put = await fleet.put(b"steps: 3\n", str(remote), mode=0o640)
        assert put[0].ok, put[0]
        assert remote.read_bytes() == b"steps: 3\n" and remote.stat().st_mode & 0o777 == 0o640
        assert await fleet.get(str(remote), 0) == b"steps: 3\n"
        assert put[1].error.startswith("unreachable: connection refused") and str(dead) in put[1].error

        results = await fleet.run(f"cat {remote}")
        assert results[0].stdout == "steps: 3\n" and results[0].ok
        assert results[1].exit_status is None and "connection refused" in results[1].error

        [slow] = await fleet.run("sleep 20", workers=[0], timeout=0.5)
        assert slow.error == "timed out after 0.5s"
        [after] = await fleet.run("echo still fine", workers=[0])  # the connection survives a timeout
        assert after.stdout == "still fine\n"


async def test_many_workers_behind_one_sshd_stay_within_its_limits(sshd: Sshd, tmp_path: Path):
    # 12 workers on one sshd: more than its MaxStartups (10) unauthenticated connections at once would
    # be dropped, so the per-host limit must pace the connects.
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_key_line}\n")
    provider = _provider([f"127.0.0.1:{sshd.port}"] * 12, known_hosts)
    async with await _fleet(provider) as fleet:
        results = await fleet.run("echo ok")
    assert [r.stdout for r in results] == ["ok\n"] * 12, [r.error for r in results if r.error]
