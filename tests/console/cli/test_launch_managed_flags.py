"""`launch --managed`'s recovery flags reach the managed run's record: `--doctor` / `--no-doctor` (the pod
doctor on each new node) over a job file's `[recovery] doctor` and over the default (off for a local
pod); `--lost-after` over a job file's `[recovery] lost_after` and the default (10m)."""

from __future__ import annotations

import pytest

from tests.console.launch.test_local import run, run_folder
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.processes import wait_for
from tpu_console.controller import state as st
from tpu_console.controller.store import open_store
from tpu_console.settings import load_settings

pytestmark = pytest.mark.usefixtures("console_home")


def test_doctor_flags_reach_the_managed_run_over_the_job_file_and_the_default(capsys, tmp_path):
    assert run(capsys, "create", "pod", "--type", "local-1x1")[0] == 0
    job_file = tmp_path / "job.toml"
    job_file.write_text('command = "true"\n[recovery]\ndoctor = true\nlost_after = "20m"\n')
    store = open_store(load_settings({}))
    launches = {"default": ["--managed", "--", "true"], "flag on": ["--managed", "--doctor", "--", "true"],
                "job file": ["--job", str(job_file)],
                "flag off": ["--no-doctor", "--lost-after", "90s", "--job", str(job_file)]}
    doctor, lost_after = {}, {}
    for name, flags in launches.items():
        status, out, err = run(capsys, "launch", "pod", *flags)
        assert status == 0 and "managed as m" in err, (name, err)
        wait_for((run_folder(0, out.split()[-1]) / "exit").exists, timeout=30)  # the node free again
        managed_id = err.split("managed as ")[1].split()[0]
        managed = st.load(store, managed_id).run
        doctor[name], lost_after[name] = managed.doctor, managed.lost_after_s
    assert doctor == {"default": False, "flag on": True, "job file": True, "flag off": False}
    assert lost_after == {"default": 600.0, "flag on": 600.0, "job file": 1200.0, "flag off": 90.0}


def test_a_bad_lost_after_is_one_line_and_launches_nothing(capsys):
    assert run(capsys, "create", "pod", "--type", "local-1x1")[0] == 0
    status, out, err = run(capsys, "launch", "pod", "--managed", "--lost-after", "soon", "--", "true")
    assert status == 2 and out == ""
    assert err.startswith("error: ") and "--lost-after" in err and len(err.strip().splitlines()) == 1
    runs = run_folder(0, "x").parent
    assert not runs.exists() or not any(runs.iterdir())  # no run was started
