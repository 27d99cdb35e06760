"""benchmarks/gpu_check.py end to end on tiny shapes (on CPU), so the script a lent GPU runs cannot rot:
every section produces its figures, none records an error."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_every_section_on_tiny_shapes(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    assert gpu_check.main(["--tiny", "--out", str(tmp_path)]) == 0
    records = [json.loads(line) for line in (tmp_path / "gpu_check.jsonl").read_text().splitlines()]
    errors = [r for r in records if "error" in r or "skipped" in r]
    assert not errors, errors
    by = {}
    for r in records:
        by.setdefault(r["section"], []).append(r)
    assert by["hbm"][0]["read_GBps"] > 0
    generate = by["trainer generate"][0]
    assert generate["ms_per_token"] > 0 and generate["x_floor"] > 0
    assert generate["decode_loop_memory"]["xla_argument_bytes"] > 0
    assert by["trainer decode step"][0]["ms_per_token"] > 0
    update = by["grpo update"][0]
    assert update["xla_flops"] > 0 and update["six_n_flops_per_s"] > 0
    # the lowered program's count is the same arithmetic before the compiler's rewrites (on CPU, near it)
    assert 0.5 < update["xla_lowered_flops"] / update["xla_flops"] < 2
    assert update["memory"]["xla_temp_bytes"] > 0
    modes = {(r.get("mode"), r.get("compiled")) for r in by["transformers generate"] if "ms_per_token" in r}
    assert modes == {("eager", False), ("static cache", False)}
    assert by["done"] and (tmp_path / "gpu_check.txt").read_text().count("\n") == len(records)
