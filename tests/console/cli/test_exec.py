"""`tpu-console exec` against a real local pod: prefixed output, summary, exit status, no side effect on
bad input or an unreachable worker."""

from __future__ import annotations

import json
import socket
from dataclasses import replace

import pytest

from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console import cli
from tpu_console.locations import home
from tpu_console.providers.local import LocalProvider

pytestmark = pytest.mark.usefixtures("console_home")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def pod(capsys) -> str:
    assert cli.main(["create", "pod", "--type", "local-3x1"]) == 0
    capsys.readouterr()
    return "pod"


def worker_home(worker: int):
    return home() / "local" / "pod" / "workers" / str(worker)


def test_output_is_prefixed_and_summarised(capsys, pod):
    status, out, err = run(capsys, "exec", pod, "--", "echo out-$PWD; echo warn >&2")
    assert status == 0
    assert sorted(out.splitlines()) == [f"[{i}] out-{worker_home(i)}" for i in range(3)]
    assert sorted(line for line in err.splitlines() if line.endswith("warn")) == [
        f"[{i}] warn" for i in range(3)
    ]
    summary = err.splitlines()[-4:]
    assert summary[0].split() == ["WORKER", "EXIT", "TIME"]
    assert [row.split()[:2] + row.split()[3:] for row in summary[1:]] == [
        ["[0]", "0", "ok"],
        ["[1]", "0", "ok"],
        ["[2]", "0", "ok"],
    ]


def test_exit_status_is_the_first_non_zero_worker_status(capsys, pod):
    # worker 0 succeeds, 1 exits 4, 2 exits 7: the first non-zero in worker order wins
    command = 'case "$PWD" in */0) exit 0;; */1) exit 4;; *) exit 7;; esac'
    status, _, err = run(capsys, "exec", pod, "--", command)
    assert status == 4
    rows = [line.split() for line in err.splitlines()[-3:]]
    assert [(r[0], r[1], r[3]) for r in rows] == [
        ("[0]", "0", "ok"),
        ("[1]", "4", "failed"),
        ("[2]", "7", "failed"),
    ]


def test_worker_selection(capsys, pod):
    status, out, _ = run(capsys, "exec", pod, "--worker", "0,2", "--", "basename", "$PWD")
    assert status == 0
    # several arguments are quoted one by one: `$PWD` arrives literally, not expanded
    assert sorted(out.splitlines()) == ["[0] $PWD", "[2] $PWD"]


def test_single_argument_is_a_shell_line(capsys, pod):
    status, out, _ = run(capsys, "exec", pod, "--worker", "1", "--", "cd /tmp && echo a | tr a b")
    assert status == 0 and out == "[1] b\n"


def test_options_after_double_dash_belong_to_the_command(capsys, pod):
    status, out, _ = run(capsys, "exec", pod, "--worker", "2", "--", "echo", "--worker", "--json")
    assert status == 0 and out == "[2] --worker --json\n"


def test_json(capsys, pod):
    status, out, _ = run(capsys, "exec", pod, "--worker", "1-2", "--json", "--", "echo hi; exit 3")
    assert status == 3
    document = json.loads(out)
    assert document["exit_status"] == 3 and document["node"] == "pod"
    assert [(r["worker"], r["exit_status"], r["stdout"], r["error"]) for r in document["results"]] == [
        (1, 3, "hi\n", None),
        (2, 3, "hi\n", None),
    ]


def test_timeout_is_255_with_the_reason(capsys, pod):
    status, _, err = run(capsys, "exec", pod, "--worker", "0", "--timeout", "0.3", "--", "sleep 5")
    assert status == 255
    assert "timed out after 0.3s" in err.splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["exec", "ghost", "--", "touch", "ran"], "unknown node 'ghost': `tpu-console ls` lists the nodes"),
        (
            ["exec", "pod", "--worker", "3", "--", "touch", "ran"],
            "worker 3 is out of range: this node has 3 workers (0-2)",
        ),
        (["exec", "pod", "--worker", "x", "--", "touch", "ran"], "bad worker selection 'x'"),
        (["exec", "pod", "--"], "no command given"),
        (["exec", "pod", "--", " "], "empty command"),
    ],
)
def test_bad_input_runs_nothing(capsys, pod, argv, message):
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == ""
    assert err.strip() == f"error: {message}" or err.strip().startswith(f"error: {message}")
    assert not any((worker_home(i) / "ran").exists() for i in range(3))


class HalfBrokenLocal(LocalProvider):
    """Worker 1's address points at a port nobody listens on."""

    async def ssh_targets(self, node):
        targets = await super().ssh_targets(node)
        return [replace(t, port=_closed_port()) if t.worker == 1 else t for t in targets]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_worker_fails_before_anything_runs(capsys, pod, monkeypatch):
    monkeypatch.setattr(cli, "build_providers", lambda settings: {"local": HalfBrokenLocal(settings)})
    status, out, err = run(capsys, "exec", pod, "--", "touch ran")
    assert status == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("error: worker 1 of 'pod' is unreachable: ")
    assert "nothing was run" in line and "--worker" in line
    assert not any((worker_home(i) / "ran").exists() for i in range(3))
    # leaving the broken worker out works
    status, _, _ = run(capsys, "exec", pod, "--worker", "0,2", "--", "touch ran")
    assert status == 0
    assert [(worker_home(i) / "ran").exists() for i in range(3)] == [True, False, True]
