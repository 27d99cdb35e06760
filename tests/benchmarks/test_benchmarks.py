"""The benchmark scripts still run end to end (on small settings, so the suite stays quick). Their
targets are judged by running them in full, never here: a timed assertion in a unit test would be noise."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], check=False, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )


@pytest.mark.skipif(shutil.which("ssh") is None, reason="the OpenSSH client is not installed")
def test_fanout_benchmark_prints_every_measurement_and_a_verdict():
    result = _run(["benchmarks/fanout.py", "--workers", "3", "--repeats", "3", "--pause", "0.2"])
    assert result.returncode in (0, 1), result.stdout + result.stderr  # 1: targets not met
    for label in ("(a) fleet cold", "(b) fleet warm", "(c) one ssh process per worker",
                  "(d) ssh over warm ControlMasters", "ratio (c)/(b)", "ratio (d)/(b)"):
        assert re.search(re.escape(label) + r".*\d+\.\dx?", result.stdout), result.stdout
    assert re.search(r"targets: .*: (met|NOT met)", result.stdout)


def test_decode_benchmark_prints_both_rates_and_the_ratio():
    pytest.importorskip("torch")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = _run(["benchmarks/decode.py", "--batch", "2", "--new-tokens", "4", "--repeats", "1"], env)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    assert re.search(r"trainer Sampler:\s+[\d.]+ tokens/s", result.stdout), result.stdout
    assert re.search(r"transformers generate:\s+[\d.]+ tokens/s", result.stdout), result.stdout
    assert re.search(r"ratio \(Sampler / transformers\): [\d.]+x", result.stdout), result.stdout


def test_tui_benchmark_prints_key_to_frame_latency_idle_and_loaded():
    result = _run(
        ["benchmarks/tui.py", "--workers", "4", "--lines-per-s", "200", "--presses", "4", "--warmup", "0.2"]
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr
    for label in (r"\(a\) idle", r"\(b\) loaded"):
        assert re.search(label + r"\s*: key to frame median [\d.]+ ms, p95 [\d.]+ ms", result.stdout), (
            result.stdout
        )
    assert re.search(r"took in [\d,]+ log lines/s", result.stdout), result.stdout
    assert re.search(r"targets?: .*: (met|NOT met)", result.stdout), result.stdout


def test_monitor_benchmark_prints_throughput_memory_and_latency():
    result = _run(["benchmarks/monitor.py", "--workers", "3", "--lines", "500", "--latency-s", "1"])
    assert result.returncode in (0, 1), result.stdout + result.stderr
    assert re.search(
        r"\(a\) throughput: [\d,]+ lines .*: [\d,]+ lines/s wall; .*: [\d,]+ lines per CPU-second; "
        r"every line once: True",
        result.stdout,
    ), result.stdout
    assert re.search(r"peak RSS \d+ MiB", result.stdout), result.stdout
    assert re.search(r"\(b\) latency, .*p50 \d+ ms, p95 \d+ ms", result.stdout), result.stdout
    assert re.search(r"targets: .*: (met|NOT met)", result.stdout)
