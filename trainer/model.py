"""Qwen2 (the architecture of Qwen2.5-{0.5B,1.5B,3B,7B}-Instruct) in Flax NNX.

Read top to bottom in the order data flows: config (with presets and the sharding of each parameter kind),
RMSNorm, rotary embeddings, attention, MLP, block, model. The model knows two forwards:

- `model(input_ids, positions, attention_mask)`: full sequence, causal + padding mask, fp32 logits [B, T, V]
  (training, log-prob recomputation).
- `model.prefill(...)` and `model.decode(input_ids, positions, kv_mask, cache, cache_index, options)`: write
  the chunk's keys/values into a preallocated KV cache and return fp32 logits of the chunk's last position
  [B, V]. The sampler (trainer/rollout/sampler.py) owns the cache and the loop, and passes in how the
  cached forward is traced (`DecodeOptions`: the matmuls' output dtype, how the cache is written, where
  rows and the cache live, and an explicit decode step, `DecodeLayout`, for a layout that writes its
  collectives out).

Parameters are stored in `param_dtype` (fp32 by default) and cast to `compute_dtype` (bf16 by default) at use.
Each parameter carries `out_sharding` metadata naming mesh axes ("dp", "fsdp", "tp"); `nnx.get_partition_spec`
and `param_sharding.py` turn it into shardings. Layouts are [in, out] (HF Linear weights transposed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from trainer.param_sharding import Axes, constrain_batch

# A large finite negative instead of -inf: rows with every key masked (left padding) stay finite.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)

@dataclass(frozen=True)
class ShardingRules:
    """Mesh axes of each parameter kind (one table, so a layout change is one edit). Shapes are [in, out]."""

    embed: Axes = ("tp", "fsdp")  # [vocab, hidden]
    attn_qkv: Axes = ("fsdp", "tp")  # q/k/v kernels [hidden, heads * head_dim]
    attn_qkv_bias: Axes = ("tp",)  # [heads * head_dim]
    attn_out: Axes = ("tp", "fsdp")  # o kernel [heads * head_dim, hidden]
    mlp_in: Axes = ("fsdp", "tp")  # gate/up kernels [hidden, intermediate]
    mlp_out: Axes = ("tp", "fsdp")  # down kernel [intermediate, hidden]
    norm: Axes = (None,)  # [hidden]
    lm_head: Axes = ("fsdp", "tp")  # [hidden, vocab] (untied models only)
    # Activations and the KV cache [batch, kv_heads, length, head_dim]: batch over data axes, heads over tp.
    batch: Axes = (("dp", "fsdp"),)
    kv_cache: Axes = (("dp", "fsdp"), "tp", None, None)


@dataclass(frozen=True)
class Qwen2Config:
    vocab_size: int = 151936
    hidden_size: int = 896
    intermediate_size: int = 4864
    num_hidden_layers: int = 24
    num_attention_heads: int = 14
    num_key_value_heads: int = 2
    head_dim: int | None = None  # None: hidden_size // num_attention_heads (as in HF Qwen2)
    max_position_embeddings: int = 32768
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    bos_token_id: int | None = 151643
    eos_token_id: int | tuple[int, ...] | None = 151645
    pad_token_id: int | None = None
    sharding: ShardingRules = field(default_factory=ShardingRules)

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        return self.eos_token_id if isinstance(self.eos_token_id, tuple) else (self.eos_token_id,)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> Qwen2Config:
        """Build from a Hugging Face `config.json` dict (transformers 4 or 5 layout)."""
        model_type = hf.get("model_type", "qwen2")
        if model_type != "qwen2":
            raise ValueError(f"config.json has model_type {model_type!r}; this model implements 'qwen2' "
                             "(Qwen2 / Qwen2.5 checkpoints)")
        rope = hf.get("rope_parameters") or {}
        rope_scaling = hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type") or rope_scaling.get("rope_type") or rope_scaling.get("type")
        if rope_type not in (None, "default"):
            raise ValueError(f"rope type {rope_type!r} is not supported (only the default rotary embedding)")
        theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
        known = {f.name for f in dataclasses.fields(cls)} - {"sharding", "rope_theta"}
        values = {k: hf[k] for k in known if k in hf}
        return cls(rope_theta=float(theta), **values)

    def to_hf(self, dtype: str = "float32") -> dict[str, Any]:
        """The `config.json` dict transformers' `Qwen2ForCausalLM` loads."""
        out: dict[str, Any] = {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_act": "silu",
            "attention_dropout": 0.0,
            "use_cache": True,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": self.num_hidden_layers,
            "rope_scaling": None,
            "torch_dtype": dtype,
        }
        for f in dataclasses.fields(self):
            if f.name == "sharding":
                continue
            value = getattr(self, f.name)
            if f.name == "head_dim" and value is None:
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> Qwen2Config:
        """A named preset: 'qwen2.5-0.5b', 'qwen2.5-1.5b', 'qwen2.5-3b', 'qwen2.5-7b' (Instruct configs)."""
        key = name.lower().removesuffix("-instruct")
        if key not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[key], **overrides)


PRESETS: dict[str, Qwen2Config] = {
    "qwen2.5-0.5b": Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-3b": Qwen2Config(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                              num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-7b": Qwen2Config(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                              num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                              tie_word_embeddings=False),
}


def _normal(rngs: nnx.Rngs, shape: Sequence[int], std: float, dtype: Any) -> jax.Array:
    return (std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)


class Dense(nnx.Module):
    """y = x @ kernel (+ bias), computed in `compute_dtype`; kernel is [in, out]."""

    def __init__(self, din: int, dout: int, *, use_bias: bool, kernel_axes: Axes, bias_axes: Axes,
                 std: float, rngs: nnx.Rngs, param_dtype: Any, compute_dtype: Any):
        self.kernel = nnx.Param(_normal(rngs, (din, dout), std, param_dtype), out_sharding=kernel_axes)
        self.bias = nnx.Param(jnp.zeros((dout,), param_dtype), out_sharding=bias_axes) if use_bias else None
        self.compute_dtype = compute_dtype

    def __call__(self, x: jax.Array, out_dtype: Any = jnp.float32) -> jax.Array:
        return self.accumulate(x, out_dtype).astype(self.compute_dtype)

    def accumulate(self, x: jax.Array, out_dtype: Any = jnp.float32) -> jax.Array:
        """fp32 x @ kernel (+ bias) from compute-dtype operands, for elementwise work that follows in fp32.

        Accumulating in fp32 is what the MXU does; on CPU a bf16-output dot is also several times slower
        (XLA widens it to an fp32 dot), and so is elementwise math in bf16 (widened op by op). out_dtype:
        the dot's own output (DecodeOptions.matmul_dtype: the dtype of partial sums a split contraction
        sends across the interconnect)."""
        y = jnp.dot(x.astype(self.compute_dtype), self.kernel[...].astype(self.compute_dtype),
                    preferred_element_type=out_dtype).astype(jnp.float32)
        if self.bias is not None:
            y = y + self.bias[...].astype(jnp.float32)
        return y


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, *, axes: Axes, param_dtype: Any, compute_dtype: Any):
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype), out_sharding=axes)
        self.eps = eps
        self.compute_dtype = compute_dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.scale[...], self.eps, self.compute_dtype)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, dtype: Any) -> jax.Array:
    """RMSNorm over the last dim: RMSNorm's math, for code that holds the scale itself (a shard_map)."""
    # Normalise and scale in fp32, cast once (HF scales in the compute dtype; the difference is rounding).
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (scale.astype(jnp.float32) * xf).astype(dtype)


def rotary_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """fp32 cos/sin [B, T, head_dim] for integer positions [B, T], computed once per forward for all
    layers."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Qwen2's rotate-half rotary embedding on x [B, T, heads, head_dim]."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, compute_dtype: Any) -> jax.Array:
    """Grouped-query attention. q [B,T,H,D], k/v [B,KV,S,D], mask [B,T,S] (True = may attend) -> [B,T,H*D].

    k/v are head-major (the KV cache layout) so the big operands feed the dots without a relayout copy.
    """
    b, t, h, d = q.shape
    kv = k.shape[1]
    if t == 1:
        # One query per row (a decode step): without the unit T axis the dots need no relayout copies,
        # which cost more than the attention math itself on CPU.
        q1 = q.reshape(b, kv, h // kv, d)
        scores = jnp.einsum("bkgd,bksd->bkgs", q1, k, preferred_element_type=jnp.float32) * (d ** -0.5)
        scores = jnp.where(mask[:, :, None, :], scores, _MASK_VALUE)  # mask [B, 1, S] -> [B, 1, 1, S]
        # Softmax's division after the values' matmul, on [.., D] rather than [.., S]: one pass over the
        # scores fewer, the same probabilities.
        weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
        out = jnp.einsum("bkgs,bksd->bkgd", weights.astype(compute_dtype), v.astype(compute_dtype),
                         preferred_element_type=jnp.float32) / jnp.sum(weights, axis=-1, keepdims=True)
        return out.astype(compute_dtype).reshape(b, 1, h * d)
    q = q.reshape(b, t, kv, h // kv, d)
    scores = jnp.einsum("btkgd,bksd->bkgts", q, k, preferred_element_type=jnp.float32) * (d ** -0.5)
    scores = jnp.where(mask[:, None, None, :, :], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(compute_dtype)
    out = jnp.einsum("bkgts,bksd->btkgd", probs, v.astype(compute_dtype))
    return out.reshape(b, t, h * d)


def _write_cache(cache: jax.Array, update: jax.Array, start: tuple, as_bits: bool) -> jax.Array:
    """cache with `update` written at `start`, in place.

    as_bits: a 16-bit cache is written as raw bits: XLA CPU widens a bf16 dynamic-update-slice to fp32 and
    back, which rewrites the whole cache every decode step instead of one slot; on the bits it is a plain
    in-place write. On TPU the bitcast is a relayout, a copy of the whole cache every token.
    """
    update = update.astype(cache.dtype)
    if cache.dtype.itemsize != 2 or not as_bits:
        return jax.lax.dynamic_update_slice(cache, update, start)
    bits = jax.lax.dynamic_update_slice(jax.lax.bitcast_convert_type(cache, jnp.uint16),
                                        jax.lax.bitcast_convert_type(update, jnp.uint16), start)
    return jax.lax.bitcast_convert_type(bits, cache.dtype)


class Attention(nnx.Module):
    def __init__(self, config: Qwen2Config, *, rngs: nnx.Rngs, param_dtype: Any, compute_dtype: Any):
        c, s = config, config.sharding
        self.num_heads, self.num_kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = c.dim_per_head
        common = {"rngs": rngs, "param_dtype": param_dtype, "compute_dtype": compute_dtype,
                  "std": c.initializer_range}
        qkv = dict(use_bias=True, kernel_axes=s.attn_qkv, bias_axes=s.attn_qkv_bias, **common)
        self.q_proj = Dense(c.hidden_size, self.num_heads * self.head_dim, **qkv)
        self.k_proj = Dense(c.hidden_size, self.num_kv_heads * self.head_dim, **qkv)
        self.v_proj = Dense(c.hidden_size, self.num_kv_heads * self.head_dim, **qkv)
        self.o_proj = Dense(self.num_heads * self.head_dim, c.hidden_size, use_bias=False,
                            kernel_axes=s.attn_out, bias_axes=(None,), **common)
        self.compute_dtype = compute_dtype

    def _qkv(self, x: jax.Array, cos: jax.Array, sin: jax.Array, project: Any = None,
             out_dtype: Any = jnp.float32) -> tuple[jax.Array, jax.Array, jax.Array]:
        """q [B,T,H,D]; k, v head-major [B,KV,T,D]; all in the compute dtype (rotary applied in fp32).
        project: computes the three fp32 projections together (DecodeLayout.qkv); default: one by one."""
        dense = (self.q_proj, self.k_proj, self.v_proj)
        q, k, v = project(x, dense) if project is not None else (d.accumulate(x, out_dtype) for d in dense)
        b, t = q.shape[:2]
        q = q.reshape(b, t, self.num_heads, self.head_dim)
        k = k.reshape(b, t, self.num_kv_heads, self.head_dim)
        v = v.astype(self.compute_dtype).reshape(b, t, self.num_kv_heads, self.head_dim)
        q = apply_rotary(q, cos, sin).astype(self.compute_dtype)
        k = apply_rotary(k, cos, sin).astype(self.compute_dtype)
        return q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array) -> jax.Array:
        q, k, v = self._qkv(x, cos, sin)
        return self.o_proj(_attend(q, k, v, mask, self.compute_dtype))

    def decode(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array,
               cache: tuple[jax.Array, jax.Array], cache_index: jax.Array, options: DecodeOptions,
               norm: RMSNorm | None = None, layer: jax.Array | None = None) -> tuple[jax.Array, tuple]:
        """Write this chunk's k/v at `cache_index` and attend over the whole cache (mask [B, T, S]).
        options.cache places the written cache before attention reads it; with options.layout, its `qkv`,
        `heads` and `out` do their parts, and x is the block's input before `norm` (the qkv hook applies
        it). layer: the cache holds every layer's keys/values stacked [layers, B, KV, S, D] (a scanned
        model's) and this is layer `layer`: its slot is written in place in the stack and attention reads
        that layer's slice."""
        layout, as_bits = options.layout, options.cache_write_as_bits
        if layout is None:
            q, k, v = self._qkv(x, cos, sin, out_dtype=options.matmul_dtype)
        else:
            q, k, v = self._qkv(x, cos, sin, lambda x, dense: layout.qkv(x, norm, dense))
            q, k, v = layout.heads(q, 2), layout.heads(k, 1), layout.heads(v, 1)
        k_cache, v_cache = cache
        place = options.cache or _rows_anywhere
        if layer is None:
            start = (0, 0, cache_index, 0)
            k_cache = place(_write_cache(k_cache, k, start, as_bits))
            v_cache = place(_write_cache(v_cache, v, start, as_bits))
            k_read, v_read = k_cache, v_cache
        else:  # one slot of one layer written into the stack (in place in the loop's carry), then read
            start = (layer, 0, 0, cache_index, 0)
            place = jax.vmap(place) if options.cache is not None else place  # the layer axis whole
            k_cache = place(_write_cache(k_cache, k[None], start, as_bits))
            v_cache = place(_write_cache(v_cache, v[None], start, as_bits))
            k_read = jax.lax.dynamic_index_in_dim(k_cache, layer, keepdims=False)
            v_read = jax.lax.dynamic_index_in_dim(v_cache, layer, keepdims=False)
        out = _attend(q, k_read.astype(self.compute_dtype), v_read, mask, self.compute_dtype)
        if layout is None:
            return self.o_proj(out, options.matmul_dtype), (k_cache, v_cache)
        return layout.out(layout.heads(out, 2), self.o_proj), (k_cache, v_cache)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, config: Qwen2Config, *, rngs: nnx.Rngs, param_dtype: Any, compute_dtype: Any):
        c, s = config, config.sharding
        common = {"use_bias": False, "bias_axes": (None,), "rngs": rngs, "param_dtype": param_dtype,
                      "compute_dtype": compute_dtype, "std": c.initializer_range}
        self.gate_proj = Dense(c.hidden_size, c.intermediate_size, kernel_axes=s.mlp_in, **common)
        self.up_proj = Dense(c.hidden_size, c.intermediate_size, kernel_axes=s.mlp_in, **common)
        self.down_proj = Dense(c.intermediate_size, c.hidden_size, kernel_axes=s.mlp_out, **common)

    def __call__(self, x: jax.Array, out_dtype: Any = jnp.float32) -> jax.Array:
        gate, up = self.gate_proj.accumulate(x, out_dtype), self.up_proj.accumulate(x, out_dtype)
        return self.down_proj(jax.nn.silu(gate) * up, out_dtype)


class Block(nnx.Module):
    def __init__(self, config: Qwen2Config, *, rngs: nnx.Rngs, param_dtype: Any, compute_dtype: Any):
        norm = {"axes": config.sharding.norm, "param_dtype": param_dtype, "compute_dtype": compute_dtype}
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **norm)
        self.self_attn = Attention(config, rngs=rngs, param_dtype=param_dtype, compute_dtype=compute_dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **norm)
        self.mlp = MLP(config, rngs=rngs, param_dtype=param_dtype, compute_dtype=compute_dtype)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array) -> jax.Array:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))

    def prefill(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array, last_only: bool,
                out_dtype: Any = jnp.float32) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """Forward of a whole prompt, also returning its keys/values (head-major). last_only: the output is
        needed at the last position only (the final layer), so attention output and MLP run for it alone.
        out_dtype: the weight matmuls' (DecodeOptions.matmul_dtype)."""
        q, k, v = self.self_attn._qkv(self.input_layernorm(x), cos, sin, out_dtype=out_dtype)
        if last_only:
            x, q, mask = x[:, -1:], q[:, -1:], mask[:, -1:]
        x = x + self.self_attn.o_proj(_attend(q, k, v, mask, self.self_attn.compute_dtype), out_dtype)
        return x + self.mlp(self.post_attention_layernorm(x), out_dtype), (k, v)

    def decode(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array, cache: tuple,
               cache_index: jax.Array, options: DecodeOptions,
               layer: jax.Array | None = None) -> tuple[jax.Array, tuple]:
        """One block of a cached forward (Attention.decode; layer: of a stacked cache)."""
        layout = options.layout
        if layout is None:
            h, cache = self.self_attn.decode(self.input_layernorm(x), cos, sin, mask, cache, cache_index,
                                             options, layer=layer)
            x = x + h
            return x + self.mlp(self.post_attention_layernorm(x), options.matmul_dtype), cache
        h, cache = self.self_attn.decode(x, cos, sin, mask, cache, cache_index, options,
                                         self.input_layernorm, layer)
        # The block's output, placed by the mlp hook.
        return layout.mlp(layout.residual(x + h), self.post_attention_layernorm, self.mlp), cache


# Per layer (keys, values), each [B, kv_heads, S, head_dim]; a scanned model's (trainer/scanned.py) is one
# (keys, values) pair stacked [layers, B, kv_heads, S, head_dim]. `map_cache` applies a per-layer function.
KVCache = list[tuple[jax.Array, jax.Array]] | tuple[jax.Array, jax.Array]
# Layout hooks (sharding constraints or shard_map'd computations; see DecodeLayout).
RowLayout = Callable[[jax.Array], jax.Array]  # places an activation's rows
HeadsLayout = Callable[[jax.Array, int], jax.Array]  # places q/k/v or the attention output, heads along `dim`
QkvHook = Callable[[jax.Array, "RMSNorm", Sequence["Dense"]], Sequence[jax.Array]]
OutHook = Callable[[jax.Array, "Dense"], jax.Array]
MlpHook = Callable[[jax.Array, "RMSNorm", "MLP"], jax.Array]
EmbedHook = Callable[[jax.Array, jax.Array], jax.Array]
# sample(x, norm, weight, vocab_major, uniform, temperature, top_p, *, top_k, use_top_p, greedy)
SampleHook = Callable[..., tuple[jax.Array, jax.Array]]


@dataclass(frozen=True)
class DecodeLayout:
    """A decode step that lays out its own work across devices: hooks the model calls at fixed points of
    `Qwen2ForCausalLM.decode` instead of its plain code (whose layout the partitioner chooses). The
    explicit rollout layouts, megatron and head_groups, build theirs in trainer/rollout/decode_layouts.py.

    Placement hooks (each returns its input, placed):
    - residual(x): the residual stream [B, T, hidden], after the embedding and after each attention.
    - heads(x, dim): q [B, T, H, D] (dim 2), k and v [B, KV, T, D] (dim 1) and the attention output
      [B, T, H*D] (dim 2); placed so that each row's heads attend over that row's cache.
    - tables(x): the rotary tables cos/sin [B, T, head_dim] and the attention mask [B, T, S], placed once
      before the blocks where the blocks read them (inside a scanned model's loop, the partitioner would
      place these loop invariants again in every layer, a collective each); by default left as they are.
    Computation hooks (each computes what the plain code computes, with collectives of its own choosing):
    - qkv(x, norm, (q_proj, k_proj, v_proj)): the three fp32 projections of norm(x), x the block's input
      (the hook applies the input norm, so it can fold it into its collective);
    - out(attn, o_proj): the attention's output projection;
    - mlp(x, norm, mlp): the block's output x + MLP(norm(x)), placed as the hook chooses;
    - embed(table, ids): the input embeddings [B, T, hidden] from the (split) table;
    - sample(x, norm, weight, vocab_major, uniform, temperature, top_p, *, top_k, use_top_p, greedy): the
      next tokens [B] and their log-probs [B], drawn as `sampling.sample_with_uniform` draws them from the
      logits of norm(x), x the final hidden states [B, hidden]: `decode` returns those hidden states, not
      the logits, which are never gathered."""

    residual: RowLayout
    heads: HeadsLayout
    qkv: QkvHook
    out: OutHook
    mlp: MlpHook
    embed: EmbedHook
    sample: SampleHook
    tables: RowLayout = lambda x: x


@dataclass(frozen=True)
class DecodeOptions:
    """How prefill and a decode step are traced, chosen by the sampler and passed in as one value:
    - matmul_dtype: what the weight matmuls and the head return. fp32 is what the MXU accumulates in; a
      sampler on TPU asks for bf16: where a matmul's contraction is split over chips (FSDP weights), its
      partial sums cross the interconnect in this dtype, half the bytes of fp32.
    - cache_write_as_bits: a 16-bit KV cache written through a bitcast to integers (right on CPU, a copy of
      the whole cache on TPU: see _write_cache).
    - roll_layers: a scanned model's layer loop (trainer/scanned.py) stays a loop, one block's program;
      False has the compiler unroll it (inside a while loop, the partitioner gathers each layer's FSDP
      weights instead of reducing partial sums).
    - rows: places the logits' rows, so each device samples its own (left free, the partitioner may give
      every device all of them: 78 MB of fp32 logits for 128 rows of Qwen2.5, every token); None: free.
    - cache: places each layer's cache right after the write (left free, the partitioner may split a cache
      the loop holds whole over the chips that share its rows, and gather it back every token); None: free.
    - layout: an explicit decode step (DecodeLayout), or None for the plain code."""

    matmul_dtype: Any = jnp.float32
    cache_write_as_bits: bool = True
    roll_layers: bool = True
    rows: RowLayout | None = None
    cache: RowLayout | None = None
    layout: DecodeLayout | None = None


def _rows_anywhere(x: jax.Array) -> jax.Array:
    return x


class Qwen2ForCausalLM(nnx.Module):
    def __init__(self, config: Qwen2Config, rngs: nnx.Rngs, param_dtype: Any = jnp.float32,
                 compute_dtype: Any = jnp.bfloat16, remat: bool = False):
        c, s = config, config.sharding
        self.config = config
        self.compute_dtype = compute_dtype
        self.remat = remat  # recompute each block in the backward pass (training memory)
        self.embed_tokens = nnx.Param(_normal(rngs, (c.vocab_size, c.hidden_size), c.initializer_range,
                                              param_dtype), out_sharding=s.embed)
        self.layers = nnx.List([Block(c, rngs=rngs, param_dtype=param_dtype, compute_dtype=compute_dtype)
                                for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, axes=s.norm, param_dtype=param_dtype,
                            compute_dtype=compute_dtype)
        self.lm_head = None if c.tie_word_embeddings else Dense(
            c.hidden_size, c.vocab_size, use_bias=False, kernel_axes=s.lm_head, bias_axes=(None,),
            std=c.initializer_range, rngs=rngs, param_dtype=param_dtype, compute_dtype=compute_dtype)

    def _embed(self, input_ids: jax.Array) -> jax.Array:
        return jnp.take(self.embed_tokens[...], input_ids, axis=0).astype(self.compute_dtype)

    def head_weight(self) -> tuple[jax.Array, bool]:
        """The output projection's weight and whether it is vocab-major ([vocab, hidden]: tied embeddings)."""
        if self.lm_head is None:
            return self.embed_tokens[...], True
        return self.lm_head.kernel[...], False

    def logits(self, hidden: jax.Array, out_dtype: Any = jnp.float32) -> jax.Array:
        """fp32 logits from final hidden states (already normed) [..., hidden] -> [..., vocab]."""
        weight, vocab_major = self.head_weight()
        return project_logits(hidden, weight, vocab_major, self.compute_dtype, out_dtype)

    def hidden_states(self, input_ids: jax.Array, positions: jax.Array,
                      attention_mask: jax.Array) -> jax.Array:
        """Final normed hidden states [B, T, hidden] (for chunked log-prob computation without [B,T,V])."""
        t = input_ids.shape[1]
        valid = attention_mask.astype(bool)
        mask = jnp.tril(jnp.ones((t, t), bool))[None] & valid[:, None, :]
        cos, sin = rotary_tables(positions, self.config.dim_per_head, self.config.rope_theta)
        x = constrain_batch(self._embed(input_ids), self.config.sharding.batch)
        for layer in self.layers:
            if self.remat:
                x = nnx.remat(lambda blk, *a: blk(*a))(layer, x, cos, sin, mask)
            else:
                x = layer(x, cos, sin, mask)
            # Keep activations split by rows between blocks: left free, the partitioner may gather them.
            x = constrain_batch(x, self.config.sharding.batch)
        return self.norm(x)

    def __call__(self, input_ids: jax.Array, positions: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """Training forward: ids/positions/attention_mask [B, T] (mask 1 = real token) -> fp32 [B, T, V]."""
        return self.logits(self.hidden_states(input_ids, positions, attention_mask))

    def init_cache(self, batch: int, length: int, dtype: Any = None) -> KVCache:
        c = self.config
        shape = (batch, c.num_key_value_heads, length, c.dim_per_head)
        dtype = dtype or self.compute_dtype
        return [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(c.num_hidden_layers)]

    def map_cache(self, fn: Callable[[jax.Array], jax.Array], cache: KVCache) -> KVCache:
        """`fn` applied to each layer's keys and values [B, kv_heads, S, head_dim] (the sampler's row picks,
        padding and layout constraints, written once for either model's cache)."""
        return [(fn(k), fn(v)) for k, v in cache]

    def prefill(self, input_ids: jax.Array, positions: jax.Array, attention_mask: jax.Array,
                cache_length: int, cache_dtype: Any = None,
                options: DecodeOptions = DecodeOptions()) -> tuple[jax.Array, KVCache]:
        """Forward of prompts [B, T] into a fresh KV cache of `cache_length` >= T slots (the prompt in slots
        [0, T)). Same result as `decode` at cache_index 0 on an empty cache, at less cost: attention spans the
        prompt only, and the last layer's MLP runs for the last position only. Returns fp32 logits of the last
        position [B, V] and the cache. options: its matmul_dtype, roll_layers and rows (DecodeOptions)."""
        rows = options.rows or _rows_anywhere
        t = input_ids.shape[1]
        mask = jnp.tril(jnp.ones((t, t), bool))[None] & attention_mask.astype(bool)[:, None, :]
        cos, sin = rotary_tables(positions, self.config.dim_per_head, self.config.rope_theta)
        x = self._embed(input_ids)
        x, cache = self._prefill_layers(x, cos, sin, mask, cache_length, cache_dtype or self.compute_dtype,
                                        options)
        return rows(self.logits(self.norm(x[:, -1]), options.matmul_dtype)), cache

    def _prefill_layers(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array,
                        cache_length: int, dtype: Any, options: DecodeOptions) -> tuple[jax.Array, KVCache]:
        """The blocks of `prefill`: the residual after the last one and the cache, each layer's keys and
        values padded to `cache_length` slots."""
        free = ((0, 0), (0, 0), (0, cache_length - x.shape[1]), (0, 0))
        cache = []
        for index, layer in enumerate(self.layers):
            x, (k, v) = layer.prefill(x, cos, sin, mask, last_only=index == len(self.layers) - 1,
                                      out_dtype=options.matmul_dtype)
            cache.append((jnp.pad(k.astype(dtype), free), jnp.pad(v.astype(dtype), free)))
        return x, cache

    def decode(self, input_ids: jax.Array, positions: jax.Array, kv_mask: jax.Array, cache: KVCache,
               cache_index: jax.Array, options: DecodeOptions = DecodeOptions()) -> tuple[jax.Array, KVCache]:
        """Cached forward of a chunk input_ids [B, T] stored at cache slots [cache_index, cache_index + T).

        kv_mask [B, S] marks the cache slots holding real tokens, including this chunk's. Returns fp32 logits
        of the chunk's last position [B, V] (placed by options.rows) and the updated cache. With an explicit
        layout (options.layout), the last position's final hidden states [B, hidden] (before the final norm)
        instead of logits: the layout samples from them (DecodeLayout.sample).
        """
        t, s = input_ids.shape[1], kv_mask.shape[1]
        causal = jnp.arange(s)[None, :] <= (cache_index + jnp.arange(t))[:, None]  # [T, S]
        mask = causal[None] & kv_mask.astype(bool)[:, None, :]
        cos, sin = rotary_tables(positions, self.config.dim_per_head, self.config.rope_theta)
        layout = options.layout
        if layout is None:
            x = self._embed(input_ids)
        else:
            x = layout.residual(layout.embed(self.embed_tokens[...], input_ids).astype(self.compute_dtype))
            cos, sin, mask = layout.tables(cos), layout.tables(sin), layout.tables(mask)
        x, new_cache = self._decode_layers(x, cos, sin, mask, cache, cache_index, options)
        if layout is not None:
            return x[:, -1], new_cache
        rows = options.rows or _rows_anywhere
        return rows(self.logits(self.norm(x[:, -1]), options.matmul_dtype)), new_cache

    def _decode_layers(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array, cache: KVCache,
                       cache_index: jax.Array, options: DecodeOptions) -> tuple[jax.Array, KVCache]:
        """The blocks of `decode`, one after another: the residual after the last one and the new cache."""
        new_cache = []
        for layer, layer_cache in zip(self.layers, cache, strict=True):
            x, layer_cache = layer.decode(x, cos, sin, mask, layer_cache, cache_index, options)
            new_cache.append(layer_cache)
        return x, new_cache


def project_logits(hidden: jax.Array, weight: jax.Array, vocab_major: bool, compute_dtype: Any,
                   out_dtype: Any = jnp.float32) -> jax.Array:
    """fp32 logits [..., vocab] from normed hidden states [..., hidden] and the head's weight. The weight is
    cast before use, so an FSDP-sharded fp32 weight is gathered in the compute dtype. out_dtype: the
    einsum's own output (DecodeOptions.matmul_dtype)."""
    h, w = hidden.astype(compute_dtype), weight.astype(compute_dtype)
    pattern = "...d,vd->...v" if vocab_major else "...d,dv->...v"
    return jnp.einsum(pattern, h, w, preferred_element_type=out_dtype).astype(jnp.float32)


def create_model(config: Qwen2Config, *, seed: int = 0, param_dtype: Any = jnp.float32,
                 compute_dtype: Any = jnp.bfloat16, remat: bool = False) -> Qwen2ForCausalLM:
    """A randomly initialised model (params on the default device, sharding kept as metadata)."""
    with nnx.use_eager_sharding(False):
        return Qwen2ForCausalLM(config, nnx.Rngs(seed), param_dtype=param_dtype, compute_dtype=compute_dtype,
                                remat=remat)
