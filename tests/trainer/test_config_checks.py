"""Config checks found on reading the trainer (issue 16): refused before any TPU time is spent."""

from __future__ import annotations

import pytest

from trainer.config import ConfigError, check_pod_shape, check_topology, load_config

BASE = {"model_path": "Qwen/Qwen2.5-0.5B-Instruct", "steps": 1, "rollout": {"batch_size": 16, "n": 8}}


def _maxtext(mesh_shape: str = "auto"):
    return load_config(raw={**BASE, "mesh_shape": mesh_shape,
                            "rollout": {**BASE["rollout"], "sharding_style": "maxtext"}})


@pytest.mark.parametrize("processes, local_devices", [(1, 8), (4, 4)])
def test_maxtext_with_dp_1_is_refused_before_anything_is_sent(processes, local_devices):
    # mesh_shape auto is dp=1: maxtext would replicate the rollout batch on every chip.
    with pytest.raises(ConfigError) as info:
        check_pod_shape(_maxtext(), processes, local_devices)
    message = str(info.value)
    assert "\n" not in message
    assert "rollout.sharding_style: maxtext" in message and "dp=1" in message
    assert "legacy" in message and "dp > 1" in message and "host_local" in message
    with pytest.raises(ConfigError, match="rollout.sharding_style: maxtext"):
        check_topology(_maxtext(), processes, local_devices, data_parallel=1,
                       fsdp=processes * local_devices)


def test_maxtext_with_dp_above_1_or_on_one_device_is_accepted():
    assert check_pod_shape(_maxtext("host_local"), 4, 4) == (4, 4, 1)
    assert check_pod_shape(_maxtext("2,-1,1"), 1, 8) == (2, 4, 1)
    assert check_pod_shape(_maxtext(), 1, 1) == (1, 1, 1)  # one device: nothing is replicated
    check_topology(_maxtext(), 1, 1, data_parallel=1, fsdp=1)
    # legacy with dp=1 is the default layout and stays accepted
    check_pod_shape(load_config(raw=dict(BASE)), 4, 4)
