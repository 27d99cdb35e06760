"""trainer/planner/whole_cost.py: a compiled program's flops with each loop counted as often as it runs."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from trainer.planner import whole_cost
from trainer.planner.hlo_text import parse_hlo


def _compiled(fn, *args):
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled.as_text(), compiled.cost_analysis()


def test_a_scan_and_a_nested_loop_count_every_trip():
    # XLA counts a loop body once: a scan of 6 matmuls reports about one. Nested: 3 x 5 matmuls.
    x, w = jnp.ones((32, 64)), jnp.ones((6, 64, 64))
    matmul = 2 * 32 * 64 * 64

    def scan(w, x):
        return jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), x, w)[0]

    text, cost = _compiled(scan, w, x)
    assert cost["flops"] < 2 * matmul
    whole = whole_cost.whole_cost(text, cost["flops"], cost["bytes accessed"])
    assert whole.trip_counts == [6]
    assert 6 * matmul <= whole.flops <= 6 * matmul * 1.05
    assert whole.bytes_accessed > 3 * cost["bytes accessed"]

    def nested(w, x):
        def outer(c, _):
            return jax.lax.fori_loop(0, 5, lambda i, c: jnp.tanh(c @ w[0]), c), None
        return jax.lax.scan(outer, x, None, length=3)[0]

    text, cost = _compiled(nested, w, x)
    whole = whole_cost.whole_cost(text, cost["flops"], cost["bytes accessed"])
    assert sorted(whole.trip_counts) == [3, 5]
    assert 15 * matmul <= whole.flops <= 15 * matmul * 1.05
    runs = parse_hlo(text).runs
    assert sorted(runs[loop.body] for loop in whole.loops) == [3, 15]


def test_a_loop_of_unknown_length_stays_counted_once():
    def until(x):
        return jax.lax.while_loop(lambda c: jnp.sum(c) < 1e6, lambda c: c @ c + 1.0, x)

    text, cost = _compiled(until, jnp.ones((16, 16)))
    whole = whole_cost.whole_cost(text, cost["flops"], cost["bytes accessed"])
    assert whole.trip_counts == [None] and whole.flops == cost["flops"]
