"""The planner: the run's programs compiled by libtpu for a TPU slice on this CPU machine, the per-chip
bytes checked against a hand computation, the compiler's out-of-memory answer as a verdict."""

from __future__ import annotations

import json
import math

import pytest

from tests.trainer.launch import planning_config
from trainer.config import load_config
from trainer.planner import collectives, tpu_compile
from trainer.planner.plan import (
    EXIT_BAD_INPUT,
    EXIT_CANNOT_PLAN,
    EXIT_DOES_NOT_FIT,
    EXIT_FITS,
    build_plan,
    main,
)
from trainer.planner.tpu_specs import UnknownAcceleratorType, parse_accelerator_type

needs_libtpu = pytest.mark.skipif(tpu_compile.libtpu_version() is None, reason="libtpu is not installed")


def test_accelerator_types_map_to_libtpu_topologies():
    v6e16 = parse_accelerator_type("v6e-16")
    assert (v6e16.topology_name, v6e16.chips, v6e16.hosts, v6e16.chips_per_host_bounds) == (
        "v6e:4x4",
        16,
        4,
        (2, 2, 1),
    )
    v6e8 = parse_accelerator_type("v6e-8")
    assert (v6e8.topology_name, v6e8.hosts, v6e8.chips_per_host_bounds) == ("v6e:2x4", 1, (2, 4, 1))
    v4 = parse_accelerator_type("v4-16")  # v4 counts TensorCores: 8 chips on 2 hosts
    assert (v4.topology_name, v4.chips, v4.hosts, v4.generation.chip_config) == ("v4:2x2x2", 8, 2, "megacore")
    assert parse_accelerator_type("v5e-4").topology_name == "v5e:2x2"
    with pytest.raises(UnknownAcceleratorType, match="v6e-16"):
        parse_accelerator_type("v6e-12")
    with pytest.raises(UnknownAcceleratorType, match="unknown TPU generation"):
        parse_accelerator_type("v9x-8")


def test_collectives_are_read_from_the_compiled_hlo():
    hlo = """
      %all-gather-start = (f32[512]{0}, bf16[4096,2048]{1,0}) all-gather-start(%p), dimensions={0}
      %all-gather-done = bf16[4096,2048]{1,0} all-gather-done(%all-gather-start)
      %all-reduce.3 = f32[8,151936]{1,0} all-reduce(%x), to_apply=%add
      %fusion = f32[8]{0} fusion(%a), kind=kLoop
    """
    found = collectives.collectives_in(hlo)
    assert found.count == 2
    assert found.by_kind == {"all-gather": [1, 4096 * 2048 * 2], "all-reduce": [1, 8 * 151936 * 4]}


def test_without_libtpu_plan_says_so_in_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(tpu_compile, "libtpu_version", lambda: None)
    with pytest.raises(tpu_compile.LibtpuUnavailable, match="libtpu is not installed"):
        tpu_compile.tpu_devices.__wrapped__(parse_accelerator_type("v6e-4"))
    tpu_compile.tpu_devices.cache_clear()
    monkeypatch.setattr(tpu_compile, "tpu_devices", tpu_compile.tpu_devices.__wrapped__)
    monkeypatch.setattr("trainer.planner.plan.tpu_devices", tpu_compile.tpu_devices)
    config = tmp_path / "c.yaml"
    config.write_text("model_path: Qwen/Qwen2.5-0.5B-Instruct\nsteps: 1\n")
    assert main(["--config", str(config), "--topology", "v6e-4", "--quiet"]) == EXIT_CANNOT_PLAN
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot plan here" in err[0] and "pip install" in err[0]


def test_bad_topology_and_batch_are_one_line_errors(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("model_path: Qwen/Qwen2.5-0.5B-Instruct\nsteps: 1\n")
    assert main(["--config", str(config), "--topology", "v6e-12", "--quiet"]) == EXIT_BAD_INPUT
    assert "v6e-12" in capsys.readouterr().err


def decode_step_plan(tmp_path, model_dir, layout: str) -> dict:
    """The tiny model's plan on v6e 2x2 with rollout.weight_layout `layout`, compiling only what the decode
    step needs (prefill, whose output layout is its input, and the step): the layout tests' figures."""
    cfg = load_config(planning_config(tmp_path, model_dir, weight_layout=layout), [])
    return build_plan(cfg, parse_accelerator_type("v6e-4"), only={"decode step"}).to_json()


@needs_libtpu
def test_tiny_model_plan_on_v6e_2x2_matches_a_hand_computation(tmp_path, tiny_model_dir, capsys):
    from trainer.model import Qwen2Config

    config = planning_config(tmp_path, tiny_model_dir)
    assert main(["--config", config, "--topology", "v6e-4", "--json", "--quiet"]) == EXIT_FITS
    plan = json.loads(capsys.readouterr().out)
    assert (
        plan["fits"] and plan["verdict"].startswith("fits") and plan["mesh"] == {"dp": 1, "fsdp": 4, "tp": 1}
    )
    assert plan["weight_layout"] == "head_groups"  # rollout.weight_layout auto, on TPU with mesh_shape auto

    # By hand: fp32 parameters, each split 4 ways along its fsdp dimension when that divides (all do here
    # but the 1-D norms and biases, which stay whole), AdamW's two moments the same, plus its step count.
    model = Qwen2Config.from_hf(json.loads((tiny_model_dir / "config.json").read_text()))
    h, i, v, layers = model.hidden_size, model.intermediate_size, model.vocab_size, model.num_hidden_layers
    q, kv = model.num_attention_heads * model.dim_per_head, model.num_key_value_heads * model.dim_per_head
    sharded = v * h + layers * (h * q + 2 * h * kv + q * h + 3 * h * i)  # embed, q k v o, gate up down
    whole = h + layers * (2 * h + q + 2 * kv)  # final norm; per layer two norms and the q/k/v biases
    per_chip = 4 * (sharded // 4 + whole)
    resident = plan["resident_bytes"]
    assert resident["parameters"] == per_chip
    assert resident["optimizer state"] == 2 * per_chip + 8  # mu, nu; Adam's and the schedule's int32 counts
    # The KV cache: every layer's keys and values for this chip's rows (16 sequences / 4 chips), bf16.
    cache = layers * 2 * (16 // 4) * model.num_key_value_heads * (64 + 32) * model.dim_per_head * 2
    assert resident["KV cache"] == cache
    names = [p["name"] for p in plan["programs"]]
    assert names == ["optimizer init", "rollout weights", "prefill", "decode loop", "decode step", "update"]
    update = plan["programs"][-1]
    assert update["flops"] > 0 and update["collectives"] > 0 and update["peak_bytes"] < plan["hbm_bytes"]
    low, high = plan["step_estimate_s"]["step_s"]
    assert 0 < low <= high  # a range: HBM at the floor and short latencies .. the compiler's bytes, long ones
    # The decode step's floor: this chip's bf16 weights and its KV cache up to the loop's mean length (no
    # history here: the config's maximum, 32 new tokens after a 64-token prompt bucket, of 96 slots).
    step = next(p for p in plan["programs"] if p["name"] == "decode step")
    floor = resident["rollout weights"] + cache * (64 + 32 / 2) / 96
    assert step["floor_bytes"] == pytest.approx(floor)
    assert step["estimated_seconds"][0] <= step["estimated_seconds"][1]
    # What crosses HBM, read from the HLO (trainer/planner/hbm_traffic.py), is at least the floor and at most
    # the compiler's bytes accessed, which also counts on-chip copies.
    assert floor <= step["hbm_traffic_bytes"] < step["bytes_accessed"]
    assert plan["expected_new_tokens"] == 32 and plan["longest_rows_known"] == 0
    # One slice: nothing crosses a data-center network (tests/trainer/test_dcn.py plans two).
    assert all(p["dcn_ops"] == [] for p in plan["programs"])
    assert plan["network_step"]["dcn_bytes_per_chip"] == 0 and plan["slices"] == 1
    assert math.isclose(plan["hbm_bytes"], 31.25 * 2**30)  # the compiler's own limit for a v6e chip


@needs_libtpu
@pytest.mark.parametrize(("layout", "per_layer", "per_token"), [("megatron", 4, 4), ("head_groups", 2, 6)])
def test_explicit_rollout_layouts_make_their_collectives_a_layer(tmp_path, tiny_model_dir, layout, per_layer,
                                                                  per_token):
    plan = decode_step_plan(tmp_path, tiny_model_dir, layout)
    layers = json.loads((tiny_model_dir / "config.json").read_text())["num_hidden_layers"]
    step = next(p for p in plan["programs"] if p["name"] == "decode step")
    # megatron: q/k/v partial sums (with the norm's squares), the attention output, the MLP's input and
    # output; head_groups: the attention's output and the MLP's. Once a token: the ids, the sum of the
    # vocab-split embedding lookups, the sampler's per-slice statistics and the drawn tokens; head_groups
    # also gathers the mask and the rotary tables' angles to its row blocks (two chips share a block),
    # once before the blocks (DecodeLayout.tables).
    assert step["collectives"] == per_layer * layers + per_token, step["collectives_by_kind"]


@needs_libtpu
def test_a_config_the_compiler_cannot_fit_is_a_verdict_not_a_traceback(tmp_path, tiny_model_dir, capsys):
    # 16 prompts of 65,536 tokens: prefill's attention scores alone would need far more than a chip's HBM
    # (too long a sequence rather than too many: the compiler refuses the first program at once).
    config = planning_config(tmp_path, tiny_model_dir, batch_size=8, n=2, global_length=65536,
                             max_length_sample=64)
    assert main(["--config", config, "--topology", "v6e-4", "--quiet"]) == EXIT_DOES_NOT_FIT
    out = capsys.readouterr().out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("does not fit:") and "fix:" in verdict
    assert "OUT OF MEMORY" in out or "GiB per chip" in verdict
