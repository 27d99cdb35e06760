"""`launch --recover` needs checkpoints a new node can read (the recovery itself is the controller's loop:
tests/console/controller/)."""

from __future__ import annotations

import pytest

from tests.console.launch.test_local import CONFIG
from tpu_console.errors import UserError
from tpu_console.experiments.recovery import require_durable_checkpoints


def test_recovery_needs_checkpoints_on_storage_that_outlives_the_node():
    with pytest.raises(UserError, match="--recover needs checkpoints"):
        require_durable_checkpoints(str(CONFIG), [], "gcp")
    with pytest.raises(UserError, match="use a gs:// bucket"):
        require_durable_checkpoints(
            str(CONFIG), ["checkpoint.dir=/root/ckpt", "checkpoint.every_steps=10"], "gcp"
        )
    require_durable_checkpoints(
        str(CONFIG), ["checkpoint.dir=gs://bucket/run", "checkpoint.every_steps=10"], "gcp"
    )
