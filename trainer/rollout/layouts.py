"""The rollout layouts, and how one is chosen (`resolve_rollout_layout`, from `rollout.weight_layout` and
`rollout.weight_copies`; the trainer records the `RolloutLayout` in its `start` event).

A layout says where decode's bf16 weights live (weight_placement.py has the table;
`rollout_weights_program` makes them from the training weights once a step) and how a decode step lays out
its work. In every layout the batch's rows are split over every device, each decoding its own.
- `fsdp`: the weights where training holds them, the step's layout left to the partitioner. Each chip
  reads 1/N of the weights a token, but every matmul contracts over a split dimension, so each layer
  all-reduces partial sums (five collectives a layer on TPU, and the logits' partial sums once a token).
  The layout of CPU runs and tests.
- `megatron` (decode_layouts.megatron_layout): every weight split over every chip: q/k/v by their input
  and o_proj by its output (as FSDP splits them), the MLP by its intermediate columns, the embedding and an
  untied head by vocabulary. Every collective is written out (shard_map), and each chip samples from its
  own slice of the vocabulary (split_sampling.py): four collectives a layer, and the [rows, intermediate]
  activations never cross the interconnect. `auto`'s choice where the KV heads do not divide a copy's chips.
- `head_groups` (decode_layouts.head_group_layout): attention split by KV head, on a second mesh over the
  same devices (dp = copies, fsdp = devices / copies / KV heads, tp = KV heads): the slice holds
  `rollout.weight_copies` copies of the weights, each on its own block of whole hosts decoding its own
  rows. Two collectives a layer, inside a copy. The default on TPU.
The planner measures them (`python -m trainer plan`, benchmarks/plan.py); docs/plan.md has the figures.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jax.sharding import Mesh

from trainer.model import Qwen2Config

WEIGHT_LAYOUTS = ("fsdp", "megatron", "head_groups")


@dataclasses.dataclass(frozen=True)
class RolloutLayout:
    """The layout a rollout decodes with, as resolve_rollout_layout chose it from the config (recorded in the
    trainer's `start` event and shown by `tpu-console runs show`)."""

    weight_layout: str  # one of WEIGHT_LAYOUTS, never `auto`
    configured: str  # rollout.weight_layout as configured (`auto` or the layout itself)
    why: str  # why this layout, in a few words
    copies: int = 1  # head_groups: copies of the weights on the slice, each decoding its own rows

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# `auto`'s chips to a copy of head_groups' weights: a copy's all-reduce then spans a 4x2 block of a v5e or
# v6e torus (4 hops a phase) instead of the slice. Planned for Qwen2.5-3B (docs/plan.md): on v6e-16 two
# copies of 8 chips beat one of 16 at both ends of the range, and on v6e-8 one copy of 8 beats two of 4.
COPY_CHIPS = 8


def resolve_rollout_layout(weight_layout: str, config: Qwen2Config, mesh: Mesh, *,
                           mesh_shape: str = "auto", copies: int | str = "auto") -> RolloutLayout:
    """The rollout layout for `rollout.weight_layout` and `rollout.weight_copies` on `mesh` (the training
    mesh), the one place a layout is chosen.

    `auto`: on TPU with mesh_shape auto, head_groups where a copy of its weights
    fits whole chips of a slice: one copy per COPY_CHIPS chips (a slice of fewer: one copy a slice), each
    copy's chips dividing the KV heads, the hidden and intermediate sizes and the vocabulary. On several
    slices (dp > 1 under mesh_shape auto) every slice holds its own copies, so decode never crosses the
    data-center network. Otherwise megatron on one slice where the dims divide its chips, fsdp elsewhere
    (CPU tests and tools included, and several slices without head_groups: megatron would split the weights
    over both). head_groups is the fastest at both ends of the planner's range (docs/plan.md, the 3B bench
    on v6e-16: two copies 1.22..1.84 ms a token, one 1.34..1.95; megatron 1.92..3.07).
    `copies` (rollout.weight_copies): `auto` as above for head_groups (configured or chosen), else a number
    of copies for head_groups (1 for any other layout: refused with another layout configured, not used
    where `auto` chose another)."""
    if weight_layout != "auto" and weight_layout not in WEIGHT_LAYOUTS:
        raise ValueError(f"weight_layout {weight_layout!r}: use auto or one of {', '.join(WEIGHT_LAYOUTS)}")
    slices = mesh.shape.get("dp", 1) if mesh_shape == "auto" else 1
    auto_copies = _auto_copies(config, mesh.size, slices)
    chosen, why = weight_layout, "configured"
    if weight_layout == "auto":
        n = mesh.size
        sizes = {"hidden size": config.hidden_size, "intermediate size": config.intermediate_size,
                 "vocabulary": config.vocab_size}
        left = [name for name, size in sizes.items() if size % n]
        if not on_tpu(mesh):
            chosen, why = "fsdp", "auto: not on TPU"
        elif mesh_shape != "auto":
            chosen, why = "fsdp", f"auto: mesh_shape {mesh_shape}, not auto"
        elif auto_copies:
            chosen = "head_groups"
            why = (f"auto: the {config.num_key_value_heads} KV heads and the model's dims divide "
                   f"{n // auto_copies} chips")
        elif slices > 1:
            chosen, why = "fsdp", (f"auto: {slices} slices, and no head_groups copy fits a slice's "
                                   f"{n // slices} chips (megatron would cross slices every token)")
        elif left:
            chosen, why = "fsdp", f"auto: {n} chips do not divide the {' and '.join(left)}"
        else:
            chosen = "megatron"
            why = f"auto: the {config.num_key_value_heads} KV heads do not divide {n} chips (no head_groups)"
    if copies == "auto":
        copies = (auto_copies or 1) if chosen == "head_groups" else 1
        how = f"one per {mesh.size // copies} chips" + (f", {copies // slices} a slice" if slices > 1 else "")
    else:
        copies, how = int(copies), ""
        if copies != 1 and chosen != "head_groups":
            if weight_layout != "auto":
                raise ValueError(f"rollout.weight_copies={copies} is for weight_layout head_groups, not "
                                 f"{chosen}; set rollout.weight_copies=1")
            # `auto` chose another layout here (a TPU config run on CPU, say): the copies do not apply.
            why += f"; rollout.weight_copies={copies} not used (it is for head_groups)"
            copies = 1
    if copies != 1:
        per_copy, left_over = divmod(mesh.size, copies)
        if left_over or per_copy % config.num_key_value_heads:
            raise ValueError(f"rollout.weight_copies={copies} does not give each copy a whole number of "
                             f"chips for the {config.num_key_value_heads} KV heads on {mesh.size} chips; use "
                             f"a divisor of {mesh.size // config.num_key_value_heads}")
        why += f"; {copies} copies of the weights, {per_copy} chips each" + (f" ({how})" if how else "")
    return RolloutLayout(chosen, weight_layout, why, copies)


def _auto_copies(config: Qwen2Config, chips: int, slices: int) -> int | None:
    """head_groups' copies under `auto`: one per COPY_CHIPS chips where a slice's chips hold whole copies,
    else one a slice; None where a copy's chips would not divide the KV heads, the hidden and intermediate
    sizes and the vocabulary (no head_groups)."""
    per_slice = chips // slices
    options = (COPY_CHIPS, per_slice) if per_slice % COPY_CHIPS == 0 else (per_slice,)
    dims = (config.hidden_size, config.intermediate_size, config.vocab_size)
    for per_copy in options:
        if per_copy % config.num_key_value_heads == 0 and all(d % per_copy == 0 for d in dims):
            return chips // per_copy
    return None


def on_tpu(mesh: Mesh) -> bool:
    return mesh.devices.flat[0].platform == "tpu"
