"""The console's plan cache (tpu_console/experiments/planning.py): a plan is kept under a key that changes
with the trainer's source, the planner's and the rollout's subpackages included."""

from __future__ import annotations

import trainer
from tpu_console.experiments import planning


def test_a_change_to_the_planner_makes_a_new_cache_key(tmp_path, monkeypatch):
    root = tmp_path / "trainer"
    (root / "planner").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    estimate = root / "planner" / "estimate.py"
    estimate.write_text("OVER_FLOOR = 1.0\n")
    monkeypatch.setattr(trainer, "__file__", str(root / "__init__.py"))
    before = planning.cache_key("digest", "v6e-16")
    estimate.write_text("OVER_FLOOR = 2.85\n")
    assert planning.cache_key("digest", "v6e-16") != before
