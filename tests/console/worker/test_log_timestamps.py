"""The time a log line gives itself (worker/log_timestamps.py): absl's and glog's prefix, Python logging's
asctime, ISO 8601, at the line's start only."""

from __future__ import annotations

import pytest

from tpu_console.worker.log_timestamps import timestamp

# tunix's step lines through absl (a recorded run's, tests/console/worker/program_outputs/tunix.log)
ABSL = "I1127 21:44:59.518823 139832939633536 peft_trainer.py:488] Train step 1 training loss: 5.530603"
ABSL_NEXT = "I1127 21:44:59.548636 139832939633536 peft_trainer.py:488] Train step 2 training loss: 5.516487"


def test_the_time_between_two_lines_is_read_to_the_digit_they_print():
    assert timestamp(ABSL_NEXT) - timestamp(ABSL) == pytest.approx(0.029813, abs=1e-6)
    glog = "W1127 21:40:30.317585   32574 pjrt_client.cc:587] PjRt-IFRT device count: total=1"  # C++, padded
    assert timestamp(glog) - timestamp("I1127 21:40:29.317585 1 a.py:1] x") == pytest.approx(1.0)
    python = timestamp("2026-11-27 21:44:59,518 INFO step 1 | loss 0.5")  # logging's default asctime
    assert timestamp("2026-11-27 21:45:00,018\tINFO step 2 | loss 0.4") - python == pytest.approx(0.5)
    assert timestamp("2026-11-28 00:00:00.25 step 2") - timestamp("2026-11-27 23:59:59.75 step 1") == 0.5


@pytest.mark.parametrize("line", [
    "2026-11-27T21:44:59.518823Z step 1",
    "2026-11-27T22:44:59.518823+01:00 step 1",
    "2026-11-27T16:14:59.518823-0530 step 1",
    "[2026-11-27 21:44:59,518823] step 1",  # in brackets
    "\x1b[32m2026-11-27 21:44:59.518823\x1b[0m | INFO | step 1",  # loguru, coloured
    "[rank0]: 2026-11-27 21:44:59.518823 step 1",  # torchrun's tag before it
])
def test_iso_times_with_zones_brackets_colours_and_a_tag_before_them(line):
    assert timestamp(line) == pytest.approx(timestamp("2026-11-27T21:44:59.518823Z"), abs=1e-6)


@pytest.mark.parametrize("line", [
    "step 5 | loss 0.123 | 0.21 s/step",  # none
    "step 5 saved to ckpt-2026-11-27T21:44:59",  # a time in the message is not the line's
    "I1340 21:44:59.518823 1 a.py:1] not a date",
    "I1127 21:44:59.518823 no thread or file",  # not absl's prefix
    "2026-11-27 21:44:591 a number runs on",
    "",
])
def test_a_line_without_a_time_of_its_own_has_none(line):
    assert timestamp(line) is None


def test_glog_prints_no_year_and_the_29th_of_february_still_reads():
    leap_day = timestamp("I0229 00:00:00.000000 1 a.py:1] x")
    assert timestamp("I0301 00:00:00.000000 1 a.py:1] x") - leap_day == 86400
