"""The run follower (worker/run_follower.py) as a worker runs it: the real loader and source on stdin, over
a run folder of real files; and the console-side pieces it feeds: chunk records, the cursor's held partial
line, streamed command output, and `Fleet.follow`."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tpu_console.fleet import run_recipes
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.output import CommandOutput
from tpu_console.history.tail import LogChunk, TailCursor, parse_chunk_record
from tpu_console.observe.probe import parse_probe, probe_from_status

RUN = "20250314-120000-0000"


def start_follower(home, offsets, poll_s=0.02, probe_s=0.2, max_bytes=1 << 16, last_lines=None):
    program = run_recipes.follow_run(RUN, offsets, poll_s, probe_s, max_bytes,
                                     last_lines=last_lines)  # as the
    # exec path runs it
    process = subprocess.Popen(["bash", "-c", program.command_line()], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, env={**os.environ, "HOME": str(home)},
                               start_new_session=True)
    process.stdin.write(program.source)
    process.stdin.close()
    return process


def records(process, timeout=10, first=b""):
    """Every record until the follower exits (after `first`, what was read of them already)."""
    out = first + process.stdout.read()
    process.wait(timeout=timeout)
    assert out.endswith(b"\n")
    return out.decode().splitlines()


def chunks_of(lines, name):
    """The bytes of `name` as the records carried them, checking that chunks follow on from each other."""
    data, offset = b"", None
    for line in lines:
        if line.startswith(f"C {name} "):
            _, chunk = parse_chunk_record(line[2:])
            assert offset is None or chunk.start == offset
            data, offset = data + chunk.data, chunk.end
    return data


def run_folder(tmp_path):
    folder = tmp_path / run_recipes.run_dir(RUN)
    folder.mkdir(parents=True)
    return folder


def test_it_streams_both_files_from_their_offsets_then_the_exit_and_ends(tmp_path):
    folder = run_folder(tmp_path)
    (folder / "output.log").write_bytes(b"old\nnew 1\nnew 2\npartial")
    (folder / "events.jsonl").write_bytes(b'{"kind": "start"}\n')
    (folder / "pid").write_text("999999\n")  # no such process group: the job is over...
    (folder / "exit").write_text("3\n")  # ...and exited 3
    lines = records(start_follower(tmp_path, {"output.log": 4, "events.jsonl": 0}, max_bytes=5))
    assert chunks_of(lines, "output.log") == b"new 1\nnew 2\npartial"  # in chunks of at most 5 bytes
    assert chunks_of(lines, "events.jsonl") == b'{"kind": "start"}\n'
    assert lines[-1] == "E" and lines[-2].startswith("P ")
    probe = probe_from_status(RUN, lines[-2][2:])
    assert (probe.pgid, probe.alive, probe.exit_status, probe.log_bytes) == (999999, False, 3, 23)
    assert probe.exit_time == pytest.approx((folder / "exit").stat().st_mtime, abs=1e-3)

    # a single look (`status`, `runs`) is the same producer: the same state line, with the files' ends
    look = run_recipes.probe_runs([RUN, "20250314-120000-0001"], events_tail_bytes=8, log_tail_lines=2)
    done = subprocess.run(["bash", "-c", look.command_line()], input=look.source, capture_output=True,
                          env={**os.environ, "HOME": str(tmp_path)}, timeout=30, check=True)
    probes = parse_probe(done.stdout.decode(), 8)
    assert probes[RUN] == replace(probe, log_tail=["new 2", "partial"])
    assert probes["20250314-120000-0001"].missing
    assert done.stdout.decode().split("\n")[2] == lines[-2][2:]


def test_it_follows_a_live_job_waits_for_a_file_that_does_not_exist_yet_and_sees_it_end(tmp_path):
    folder = run_folder(tmp_path)
    job = subprocess.Popen(["sleep", "30"], start_new_session=True)
    (folder / "pid").write_text(f"{job.pid}\n")
    follower = start_follower(tmp_path, {"output.log": 0})
    try:
        first = follower.stdout.readline()  # it has started: its first heartbeat, no log yet
        with open(folder / "output.log", "ab") as log:
            for i in range(50):
                log.write(f"line {i}\n".encode())
                log.flush()
                time.sleep(0.005)
        time.sleep(0.5)  # a few more heartbeats
        job.kill()
        job.wait()
        (folder / "exit").write_text("137\n")
        lines = records(follower, first=first)
    finally:
        follower.kill()
    assert chunks_of(lines, "output.log") == b"".join(f"line {i}\n".encode() for i in range(50))
    statuses = [probe_from_status(RUN, line[2:]) for line in lines if line.startswith("P ")]
    assert statuses[0].alive and statuses[0].exit_status is None  # the heartbeat while it ran
    assert len(statuses) >= 3 and statuses[-1].exit_status == 137 and lines[-1] == "E"


def test_a_job_gone_without_an_exit_file_ends_the_follow_as_lost(tmp_path):
    folder = run_folder(tmp_path)
    (folder / "pid").write_text("999999\n")
    start = time.monotonic()
    lines = records(start_follower(tmp_path, {"output.log": 0}))
    probe = probe_from_status(RUN, lines[-2][2:])
    assert not probe.alive and probe.exit_status is None and probe.pgid == 999999 and lines[-1] == "E"
    assert time.monotonic() - start >= 0.5  # it gave the wrapper its grace to write `exit`


def test_a_missing_run_folder_is_reported_and_a_rewritten_file_is_read_again_from_0(tmp_path):
    assert records(start_follower(tmp_path, {"output.log": 0})) == ["P missing=1", "E"]
    folder = run_folder(tmp_path)
    (folder / "output.log").write_bytes(b"short\n")
    (folder / "exit").write_text("0\n")
    lines = records(start_follower(tmp_path, {"output.log": 100}))  # past its end: it was rewritten
    (chunk_line,) = [line for line in lines if line.startswith("C ")]
    assert parse_chunk_record(chunk_line[2:])[1] == LogChunk(end=6, size=6, data=b"short\n")


@pytest.mark.parametrize(("log", "lines", "sent"), [
    (b"a\nb\nc\nd\n", 2, b"c\nd\n"),
    (b"a\nb\nc\npart", 2, b"c\npart"),  # a last line without its newline counts, as for tail -n
    (b"a\nb\n", 5, b"a\nb\n"),
    (b"a\nb\n", 0, b""),  # nothing to send: an empty record says where the next bytes start
])
def test_a_log_opened_at_its_last_lines_starts_there_and_says_where(tmp_path, log, lines, sent):
    folder = run_folder(tmp_path)
    (folder / "output.log").write_bytes(log)
    (folder / "exit").write_text("0\n")
    out = records(start_follower(tmp_path, {}, max_bytes=3, last_lines={"output.log": lines}))
    first = parse_chunk_record(next(line for line in out if line.startswith("C "))[2:])[1]
    assert first.start == len(log) - len(sent) and chunks_of(out, "output.log") == sent


def test_a_follower_nobody_reads_waits_in_its_write_instead_of_buffering(tmp_path):
    folder = run_folder(tmp_path)
    (folder / "output.log").write_bytes(b"x" * (8 << 20))
    job = subprocess.Popen(["sleep", "30"], start_new_session=True)
    (folder / "pid").write_text(f"{job.pid}\n")
    follower = start_follower(tmp_path, {"output.log": 0}, max_bytes=1 << 16)
    try:
        time.sleep(1.0)
        status = Path(f"/proc/{follower.pid}/status").read_text().splitlines()
        rss_kib = int(next(line.split()[1] for line in status if line.startswith("VmRSS")))
        assert rss_kib < 32 * 1024  # 8 MiB of log, base64: it would be 11 MiB if buffered
        follower.stdout.read(1 << 20)  # reading lets it go on
    finally:
        os.killpg(follower.pid, signal.SIGKILL)
        job.kill()
        job.wait()
        follower.wait()


# -- the console's side ------------------------------------------------------------------------------------


def test_chunk_records_cut_short_are_refused():
    data = base64.b64encode(b"line one\nline two\n").decode()
    expected = ("output.log", LogChunk(28, 40, b"line one\nline two\n"))
    assert parse_chunk_record(f"output.log 10 28 40 {data}") == expected
    assert parse_chunk_record(f"output.log 10 28 40 {data[:12]}") is None  # whole base64, too few bytes
    assert parse_chunk_record(f"output.log 10 28 40 {data[:13]}") is None  # not base64
    assert parse_chunk_record("output.log 10 28") is None


def test_the_cursor_holds_a_partial_line_until_the_next_chunk_completes_it():
    cursor = TailCursor()
    assert cursor.take(LogChunk(end=9, size=9, data=b"one\ntwo-p")) == ["one"]
    assert (cursor.offset, cursor.pending) == (4, b"two-p")
    assert cursor.take(LogChunk(end=16, size=16, data=b"art\nthr")) == ["two-part"]  # follows on at 9
    assert cursor.take(LogChunk(end=19, size=19, data=b"ee\n")) == ["three"]
    assert cursor.take(LogChunk(end=23, size=23, data=b"tail")) == [] and cursor.offset == 19
    # A new follower starts again at the offset: its chunk replaces what was held.
    assert cursor.take(LogChunk(end=24, size=24, data=b"tail!")) == [] and cursor.pending == b"tail!"
    assert cursor.finish() == ["tail!"] and cursor.offset == 24 and cursor.finish() == []


def test_streamed_output_keeps_no_stdout_and_drops_a_cut_off_last_line():
    lines = []
    output = CommandOutput(0, lines.append, streamed=True)
    for piece in (b"C a", b"bc\nP al", b"ive=1\nC cut-o", b"ff"):
        output.add("stdout", piece)
    output.add("stderr", b"warning\n")
    output.end()
    assert [(line.stream, line.text) for line in lines] == [
        ("stdout", "C abc"),
        ("stdout", "P alive=1"),
        ("stderr", "warning"),
    ]
    assert output.stdout == b"" and output.stderr == b"warning\n"


@pytest.mark.parametrize("channels", [True, False], ids=["command-channel", "exec-path"])
async def test_a_follow_takes_no_overall_slot_and_cancelling_it_stops_it_on_the_worker(local_pod, channels):
    async with Fleet(local_pod.targets, overall_limit=1, command_channels=channels) as fleet:
        if channels:
            await fleet.start_command_channels()
        marker = local_pod.worker_dir(0) / "follow.pid"
        seen = []
        command = f"echo $$ > {marker}; while true; do echo tick; sleep 0.05; done"
        follow = asyncio.create_task(fleet.follow(command, 0, seen.append))
        while len(seen) < 3:
            await asyncio.sleep(0.05)
        (result,) = await asyncio.wait_for(fleet.run("echo other", [1]), 10)  # the one overall slot is free
        assert result.stdout == "other\n"
        follow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await follow
        pid = int(marker.read_text())
        for _ in range(100):
            if not os.path.exists(f"/proc/{pid}"):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the followed command still runs on the worker")
