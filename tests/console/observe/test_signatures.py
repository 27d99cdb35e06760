"""Log signatures, each from a recorded sample line of what JAX, libtpu, wandb or the trainer print."""

from __future__ import annotations

import pytest

from tpu_console.observe import signatures as sig
from tpu_console.observe.signatures import SignatureScanner

OOM_LINE = (
    "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of "
    "memory in memory space hbm. Used 17.44G of 15.48G hbm. Exceeded hbm capacity by 1.96G."
)
TRAINER_OOM_LINE = (
    "error: out of device memory: reduce rollout.batch_size or rollout.n (local_batch), shorten "
    "rollout.max_length_sample, lower train.micro_batch_size_per_device, or shard the model wider "
    "(a larger fsdp axis in mesh_shape) (local_batch=16)"
)


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (OOM_LINE, sig.OOM),
        ("RuntimeError: Resource exhausted: Out of memory while trying to allocate 2.00GiB.", sig.OOM),
        (
            (
                "error: Expected 4 JAX processes but jax.process_count()==1: only some workers were "
                "launched; launch on "
                "all workers (--worker all)"
            ),
            sig.WRONG_PROCESS_COUNT,
        ),
        (
            (
                "I0124 10:57:31.123 tpu_initializer.cc:123] The TPU is already in use by process with pid "
                "4242. Not "
                "attempting to load libtpu.so in this process."
            ),
            sig.TPU_IN_USE,
        ),
        (
            (
                "RuntimeError: Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by "
                "another process "
                'probably owned by another user. Run "$ sudo lsof -w /dev/vfio/0"'
            ),
            sig.TPU_IN_USE,
        ),
        ("ABORTED: libtpu lock held: /tmp/libtpu_lockfile exists and is locked", sig.TPU_IN_USE),
        (
            (
                "jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Barrier_id: "
                "PjRT_Client_Connect"
            ),
            sig.DISTRIBUTED_TIMEOUT,
        ),
        (
            (
                "E0124 coordination_service_agent.cc:332] Failed to connect to coordination service. The "
                "first task "
                "that fails to connect is probably the cause."
            ),
            sig.DISTRIBUTED_TIMEOUT,
        ),
        (
            "E1124 07:01:02.345 coordination_service.cc:512] The following tasks are unhealthy (stopped "
            "sending heartbeats): /job:jax_worker/replica:0/task:2",
            sig.LOST_WORKER,
        ),
        ("I1124 07:01:02.345 preemption_notifier.cc:89] Preemption notice received: the TPU VM will be "
         "shut down", sig.PREEMPTED),
        (
            "wandb: ERROR Error while calling W&B API: user is not logged in (<Response [401]>)",
            sig.WANDB_AUTH,
        ),
        (
            "wandb.errors.errors.UsageError: api_key not configured (no-tty). call "
            "wandb.login(key=[your_api_key])",
            sig.WANDB_AUTH,
        ),
        ("wandb.errors.errors.CommError: Run initialization has timed out after 90.0 sec.", sig.WANDB_INIT),
        ("wandb: 🚀 View run at https://wandb.ai/team/grpo-gsm8k/runs/jwo1cz6k", sig.WANDB_URL),
    ],
)
def test_each_signature_from_a_recorded_line(line, kind):
    finding = SignatureScanner().scan(line)
    assert finding is not None and finding.kind == kind
    if kind != sig.WANDB_URL:
        assert finding.hint and finding.hint in finding.message


@pytest.mark.parametrize(
    "line",
    [
        "step=3 loss=0.01 entropy=6.6 kl=0 reward_mean=0.5 dt=1.10s rollout_generate=0.46s "
        "tokens_per_s=116.5",
        "Loading checkpoint shards: 100%|██████████| 2/2",
        "wandb: Tracking run with wandb version 0.18.5",
        "memory is fine",
        "",
    ],
)
def test_ordinary_lines_match_nothing(line):
    scanner = SignatureScanner()
    assert scanner.scan(line) is None and scanner.first_problem is None


def test_oom_names_the_usage_and_the_local_batch_from_the_trainer_line():
    scanner = SignatureScanner()
    first = scanner.scan(OOM_LINE)
    assert first.detail == "out of HBM: Used 17.44G of 15.48G hbm"
    scanner.scan(TRAINER_OOM_LINE)
    problem = scanner.first_problem
    assert problem.kind == sig.OOM and problem.local_batch == 16
    assert problem.message.startswith(
        "out of HBM: Used 17.44G of 15.48G hbm (local_batch=16); out of device memory"
    )


def test_a_traceback_gives_its_last_exception_line():
    scanner = SignatureScanner()
    lines = [
        "Traceback (most recent call last):",
        '  File "/root/trainer/train.py", line 12, in run',
        "    batch = next(it)",
        "           ^^^^^^^^",
        "ValueError: could not broadcast input array from shape (3,) into shape (4,)",
        "step=9 this line comes later",
    ]
    found = [f for line in lines if (f := scanner.scan(line)) is not None]
    assert [f.kind for f in found] == [sig.EXCEPTION]
    assert (
        scanner.first_problem.line
        == "ValueError: could not broadcast input array from shape (3,) into shape (4,)"
    )


def test_a_traceback_is_kept_whole_with_the_one_it_was_chained_to_and_bounded():
    scanner = SignatureScanner()
    first = [
        "Traceback (most recent call last):",
        '  File "train.py", line 7, in lookup',
        "    return config[key]",
        "           ~~~~~~^^^^^",
        "KeyError: 'y'",
    ]
    chained = [
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        '  File "train.py", line 20, in <module>',
        "    main()",
        "RuntimeError: no config key y",
    ]
    for line in ["step 3 | loss 0.3", *first, *chained, "after it"]:
        scanner.scan(line)
    assert scanner.last_exception.traceback == "\n".join(first + chained)
    assert scanner.first_problem.message == "RuntimeError: no config key y"

    scanner = SignatureScanner()  # an unrelated traceback later is not glued to the one before
    for line in [*first, "", "step 4 | loss 0.2", *first]:
        scanner.scan(line)
    assert scanner.last_exception.traceback == "\n".join(first)

    scanner = SignatureScanner()  # a very deep one keeps its last frames, and says how many are left out
    frames = [f'  File "r.py", line {i}, in f' for i in range(5000)]
    for line in ["Traceback (most recent call last):", *frames, "RecursionError: maximum recursion depth"]:
        scanner.scan(line)
    kept = scanner.last_exception.traceback.splitlines()
    assert len(kept) == sig.MAX_TRACEBACK_LINES + 1
    assert kept[0] == f"({5002 - sig.MAX_TRACEBACK_LINES} earlier lines of the traceback left out)"
    assert kept[-2:] == [frames[-1], "RecursionError: maximum recursion depth"]


def test_a_specific_signature_beats_the_traceback_and_the_wandb_url_is_kept():
    scanner = SignatureScanner()
    for line in [
        "wandb: View run at https://wandb.ai/e/p/runs/abc123",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        OOM_LINE,
    ]:
        scanner.scan(line)
    assert scanner.wandb_url == "https://wandb.ai/e/p/runs/abc123"
    assert scanner.first_problem.kind == sig.OOM
    assert scanner.last_exception.line == OOM_LINE


def test_the_patterns_the_pod_classifies_with_are_the_scanners():
    """The job runner on the pod compiles `patterns()` with Python's `re` (3.8+): same kinds, same order."""
    import re

    kinds = [kind for kind, _ in sig.patterns()]
    assert kinds[0] == sig.OOM and sig.WANDB_URL not in kinds and sig.LOST_WORKER in kinds
    compiled = [(kind, re.compile(pattern)) for kind, pattern in sig.patterns()]
    line = "jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out"
    assert next(kind for kind, p in compiled if p.search(line)) == sig.DISTRIBUTED_TIMEOUT


def test_a_chunk_scanned_at_once_finds_what_scanning_each_line_finds():
    """`scan_lines` passes over the lines without a pre-filter word: the same findings, in the same order,
    and the same state after, however the log is cut into chunks (tracebacks, chained ones, across cuts)."""
    import random

    traceback = ["Traceback (most recent call last):", '  File "t.py", line 3, in f', "    g()",
                 "KeyError: 'y'"]
    pieces = [["step 3 | loss 0.3 | all good"], ["step 4 | the TPU is busy computing"], [OOM_LINE],
              [TRAINER_OOM_LINE], traceback, ["", "The above exception was the direct cause of it:", ""],
              ["wandb: View run at https://wandb.ai/e/p/runs/abc123"], ["  indented, outside a traceback"],
              ["DEADLINE_EXCEEDED: Barrier timed out"], [""]]
    rng = random.Random(7)
    log = [line for _ in range(300) for line in rng.choice(pieces)]
    one_by_one = SignatureScanner()
    expected = [f for line in log if (f := one_by_one.scan(line)) is not None]
    for _ in range(5):
        chunked, found, at = SignatureScanner(), [], 0
        while at < len(log):
            size = rng.choice([1, 2, 3, 7, 40])
            found += chunked.scan_lines(log[at : at + size])
            at += size
        assert found == expected
        assert (chunked.findings, chunked.last_exception, chunked.wandb_url, chunked._chained) == (
            one_by_one.findings, one_by_one.last_exception, one_by_one.wandb_url, one_by_one._chained)
    assert {f.kind for f in expected} >= {sig.OOM, sig.EXCEPTION, sig.WANDB_URL, sig.DISTRIBUTED_TIMEOUT}
    assert SignatureScanner().scan_lines([]) == []
