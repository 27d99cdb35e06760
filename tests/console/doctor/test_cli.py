"""`tpu-console doctor NODE` and `launch --check` through the CLI on a 2-worker local pod: the figures as one
JSON document, a finding as exit status 1 (doctor) or a refusal that launches nothing (launch --check), bad
numbers and unknown nodes refused with exit status 2."""

from __future__ import annotations

import json
import sys

import pytest

from tests.console.launch.test_launch_command import FOREIGN
from tests.console.launch.test_local import pod, run  # noqa: F401 - fixture
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console.doctor.check import FAULT_ENV
from tpu_console.history.store import RunStore

pytestmark = pytest.mark.usefixtures("console_home", "pod")


def test_doctor_prints_every_workers_figures_and_names_a_wrong_chip(capsys, monkeypatch):
    status, out, err = run(capsys, "doctor", "pod", "--json")
    assert status == 0, err
    document = json.loads(out)
    assert document["ok"] is True and document["findings"] == []
    assert [len(w["chips"]) for w in document["workers"]] == [1, 1]  # local-2x1: one device a worker

    monkeypatch.setenv(FAULT_ENV, "wrong-result:1:0")
    status, out, err = run(capsys, "doctor", "pod")
    assert status == 1
    assert err.splitlines()[-1].startswith("doctor: worker 1 chip 0 of 'pod' returned a matmul with 1 wrong")


def test_launch_check_refuses_a_node_with_a_fault_and_launches_nothing(capsys, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "wrong-result:0:0")
    status, out, err = run(capsys, "launch", "pod", "--check", "--", sys.executable, FOREIGN, "exit", "0=0")
    assert status == 2
    assert err.splitlines()[-1].startswith("error: worker 0 chip 0 of 'pod' returned a matmul")
    assert err.splitlines()[-1].endswith("; nothing was launched")
    assert RunStore().list() == []


@pytest.mark.parametrize("argv", [["doctor", "pod", "--stall", "0"], ["doctor", "no-such-pod"]])
def test_bad_input_is_one_line_and_status_2(capsys, argv):
    status, _, err = run(capsys, *argv)
    assert status == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
