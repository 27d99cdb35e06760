"""Hugging Face checkpoint <-> Qwen2ForCausalLM: safetensors in and out, with an explicit key mapping.

Loading never materialises a full parameter on one device: each array is built with
`jax.make_array_from_callback`, whose callback reads only the slice a device owns from the memory-mapped
safetensors file (transposing HF's [out, in] Linear weights per slice). With a mesh, every parameter lands
with the NamedSharding its `out_sharding` metadata names (axes that do not divide a dimension are dropped).
A scanned model (`train.scan_layers`, trainer/scanned.py) reads each block weight of every layer into one
stacked [layers, ...] array, and saves it back as the per-layer tensors transformers reads.
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from safetensors import safe_open
from safetensors.numpy import save_file

from trainer.model import Qwen2Config, Qwen2ForCausalLM
from trainer.param_sharding import fit_spec

ParamPath = tuple[str | int, ...]

# (HF name, path in the NNX model, transpose). "{i}" is the layer index.
_LAYER_KEYS: list[tuple[str, ParamPath, bool]] = [
    ("model.layers.{i}.input_layernorm.weight", ("input_layernorm", "scale"), False),
    ("model.layers.{i}.self_attn.q_proj.weight", ("self_attn", "q_proj", "kernel"), True),
    ("model.layers.{i}.self_attn.q_proj.bias", ("self_attn", "q_proj", "bias"), False),
    ("model.layers.{i}.self_attn.k_proj.weight", ("self_attn", "k_proj", "kernel"), True),
    ("model.layers.{i}.self_attn.k_proj.bias", ("self_attn", "k_proj", "bias"), False),
    ("model.layers.{i}.self_attn.v_proj.weight", ("self_attn", "v_proj", "kernel"), True),
    ("model.layers.{i}.self_attn.v_proj.bias", ("self_attn", "v_proj", "bias"), False),
    ("model.layers.{i}.self_attn.o_proj.weight", ("self_attn", "o_proj", "kernel"), True),
    ("model.layers.{i}.post_attention_layernorm.weight", ("post_attention_layernorm", "scale"), False),
    ("model.layers.{i}.mlp.gate_proj.weight", ("mlp", "gate_proj", "kernel"), True),
    ("model.layers.{i}.mlp.up_proj.weight", ("mlp", "up_proj", "kernel"), True),
    ("model.layers.{i}.mlp.down_proj.weight", ("mlp", "down_proj", "kernel"), True),
]


def hf_key_map(config: Qwen2Config) -> list[tuple[str, ParamPath, bool]]:
    """Every HF tensor name of a Qwen2 checkpoint with its model path and whether it is transposed."""
    keys: list[tuple[str, ParamPath, bool]] = [("model.embed_tokens.weight", ("embed_tokens",), False)]
    for i in range(config.num_hidden_layers):
        keys += [(name.format(i=i), ("layers", i, *path), t) for name, path, t in _LAYER_KEYS]
    keys.append(("model.norm.weight", ("norm", "scale"), False))
    if not config.tie_word_embeddings:
        keys.append(("lm_head.weight", ("lm_head", "kernel"), True))
    return keys


def resolve_model_dir(path_or_hub_id: str | os.PathLike) -> Path:
    """A local directory as is; anything else is a Hugging Face hub id, downloaded (needs internet)."""
    local = Path(path_or_hub_id).expanduser()
    if local.is_dir():
        return local
    text = str(path_or_hub_id)
    if local.exists() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise FileNotFoundError(f"model path {str(path_or_hub_id)!r} is not a directory; pass an HF model "
                                "directory or a hub id like 'Qwen/Qwen2.5-0.5B-Instruct'")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(path_or_hub_id),
                                  allow_patterns=["*.json", "*.safetensors", "*.txt", "*.jinja", "*.model"]))


def _tensor_files(model_dir: Path) -> dict[str, Path]:
    """HF tensor name -> the safetensors file holding it (single file or sharded with an index)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: model_dir / file for name, file in weight_map.items()}
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"{model_dir} has neither model.safetensors nor model.safetensors.index.json")
    with safe_open(single, framework="numpy") as f:
        return dict.fromkeys(f.keys(), single)


def _variable(model: nnx.Module, path: ParamPath) -> nnx.Variable:
    obj: Any = model
    for part in path:
        obj = obj[part] if isinstance(part, int) else getattr(obj, part)
    return obj


def _weight(model: nnx.Module, path: ParamPath) -> tuple[tuple[int, ...], Any]:
    """The shape of the weight at `path` (an unrolled model's path: layers, i, ...) and a function giving its
    value; in a scanned model a block's weight is layer i of its stack."""
    from trainer.scanned import ScannedQwen2

    if path[0] == "layers" and isinstance(model, ScannedQwen2):  # one block, its weights stacked
        var = _variable(model, ("layers", 0, *path[2:]))
        return tuple(var.shape[1:]), lambda: var[...][path[1]]
    var = _variable(model, path)
    return tuple(var.shape), lambda: var[...]


def _target_sharding(var: nnx.Variable, mesh: Mesh | None) -> jax.sharding.Sharding:
    if mesh is None:
        return SingleDeviceSharding(jax.local_devices()[0])
    axes = var.get_metadata().get("out_sharding") or ()
    return NamedSharding(mesh, fit_spec(var.shape, axes, mesh))


def _read_one(tensor: Any, index: tuple[slice, ...], transpose: bool, dtype: np.dtype) -> np.ndarray:
    """The slice `index` of a model-layout weight from its HF tensor (HF Linear weights are [out, in])."""
    if transpose:
        return np.ascontiguousarray(tensor[index[::-1]].T.astype(dtype))
    return tensor[index].astype(dtype)


def load_model(path_or_hub_id: str | os.PathLike, mesh: Mesh | None = None, param_dtype: Any = jnp.float32,
               compute_dtype: Any = jnp.bfloat16, remat: bool = False,
               scan_layers: bool = False) -> tuple[Qwen2ForCausalLM, Qwen2Config]:
    """Load an HF Qwen2 directory (or hub id) into a Qwen2ForCausalLM, each param placed with its sharding.
    scan_layers: a ScannedQwen2 (trainer/scanned.py), each block weight stacked from the checkpoint's
    per-layer tensors into one [layers, ...] array (a device reads only its slice of every layer's)."""
    model_dir = resolve_model_dir(path_or_hub_id)
    config = Qwen2Config.from_hf(json.loads((model_dir / "config.json").read_text()))
    if scan_layers:
        from trainer.scanned import scanned_model_shapes

        model: Qwen2ForCausalLM = scanned_model_shapes(config, param_dtype=param_dtype,
                                                       compute_dtype=compute_dtype, remat=remat)
    else:
        with nnx.use_eager_sharding(False):
            model = nnx.eval_shape(lambda: Qwen2ForCausalLM(config, nnx.Rngs(0), param_dtype=param_dtype,
                                                            compute_dtype=compute_dtype, remat=remat))
    files = _tensor_files(model_dir)
    missing = [name for name, _, _ in hf_key_map(config) if name not in files]
    if missing:
        raise KeyError(f"{model_dir} lacks {len(missing)} Qwen2 tensors, e.g. {missing[:3]}")
    with ExitStack() as stack:
        handles = {f: stack.enter_context(safe_open(f, framework="numpy")) for f in set(files.values())}
        for var, names, transpose, stacked in _load_targets(model, config, scan_layers):
            tensors = [handles[files[name]].get_slice(name) for name in names]
            expected = tuple(var.shape[1:]) if stacked else tuple(var.shape)
            for name, tensor in zip(names, tensors, strict=True):
                stored = tuple(tensor.get_shape())
                if stored != (expected[::-1] if transpose else expected):
                    raise ValueError(f"{name}: shape {stored} in checkpoint, "
                                     f"{expected[::-1] if transpose else expected} from config.json")
            dtype = np.dtype(var.dtype)
            if stacked:
                def read(index: tuple[slice, ...], tensors=tensors, transpose=transpose,
                         dtype=dtype) -> np.ndarray:
                    return np.stack([_read_one(t, index[1:], transpose, dtype) for t in tensors[index[0]]])
            else:
                def read(index: tuple[slice, ...], tensor=tensors[0], transpose=transpose,
                         dtype=dtype) -> np.ndarray:
                    return _read_one(tensor, index, transpose, dtype)

            var.set_value(jax.make_array_from_callback(var.shape, _target_sharding(var, mesh), read))
    return model, config


def _load_targets(model: Qwen2ForCausalLM, config: Qwen2Config,
                  scan_layers: bool) -> list[tuple[nnx.Variable, list[str], bool, bool]]:
    """(variable, the HF tensors it is read from, transposed, stacked) for every weight: one tensor each,
    or with scan_layers every layer's tensor of a block weight, in layer order, for its stacked variable."""
    if not scan_layers:
        return [(_variable(model, path), [name], t, False) for name, path, t in hf_key_map(config)]
    targets: dict[ParamPath, tuple[nnx.Variable, list[str], bool, bool]] = {}
    for name, path, t in hf_key_map(config):
        stacked = path[0] == "layers"
        inner = ("layers", 0, *path[2:]) if stacked else path
        targets.setdefault(inner, (_variable(model, inner), [], t, stacked))[1].append(name)
    return list(targets.values())


def _host_array(x: jax.Array) -> np.ndarray:
    if not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


_DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(ml_dtypes.bfloat16): "bfloat16",
                np.dtype(np.float16): "float16"}


def _plan_shards(model: Qwen2ForCausalLM, config: Qwen2Config, itemsize: int,
                 max_shard_bytes: int) -> list[list[tuple[str, ParamPath, bool]]]:
    """Group tensors into files of at most max_shard_bytes, from shapes alone (nothing gathered yet)."""
    shards: list[list[tuple[str, ParamPath, bool]]] = [[]]
    size = 0
    for entry in hf_key_map(config):
        nbytes = int(np.prod(_weight(model, entry[1])[0])) * itemsize
        if size and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += nbytes
    return shards


def save_model(model: Qwen2ForCausalLM, config: Qwen2Config, out_dir: str | os.PathLike, dtype: Any = None,
               max_shard_bytes: int = 4 * 1024**3) -> Path:
    """Write `config.json` and `model.safetensors` (or shards + index) that transformers loads.

    dtype: storage dtype (default: the params' dtype). Host memory holds one file's tensors at a time.
    Multi-host: every process must call it (arrays are gathered collectively); only process 0 writes.
    """
    out = Path(out_dir).expanduser()
    np_dtype = np.dtype(dtype if dtype is not None else model.embed_tokens[...].dtype)
    if np_dtype not in _DTYPE_NAMES:
        raise ValueError(f"cannot save weights as {np_dtype}; use float32, bfloat16 or float16")
    writer = jax.process_index() == 0
    if writer:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(config.to_hf(_DTYPE_NAMES[np_dtype]), indent=2) + "\n")
    plan = _plan_shards(model, config, np_dtype.itemsize, max_shard_bytes)
    weight_map: dict[str, str] = {}
    total = 0
    for i, entries in enumerate(plan, start=1):
        file = "model.safetensors" if len(plan) == 1 else f"model-{i:05d}-of-{len(plan):05d}.safetensors"
        tensors = {}
        for name, path, transpose in entries:
            array = _host_array(_weight(model, path)[1]()).astype(np_dtype)
            tensors[name] = np.ascontiguousarray(array.T if transpose else array)
            weight_map[name] = file
            total += tensors[name].nbytes
        if writer:
            save_file(tensors, out / file, metadata={"format": "pt"})  # transformers expects the marker
    if writer and len(plan) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return out
