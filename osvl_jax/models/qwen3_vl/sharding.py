"""Sharding by rules: parameter path -> logical axis names -> mesh axes ('data', 'fsdp', 'tensor', 'expert').

Two small tables (MaxText / big_vision style); the model code never mentions devices.
  * `PARAM_RULES`: regex over the dot-joined `nnx.state(model, nnx.Param)` path -> one logical name per dim
    (`embed`, `mlp`, `heads`, `kv_heads`, `vocab`, `experts`, `layers`, or None). First match wins; unmatched
    parameters (norms, biases) are replicated.
  * `LOGICAL_RULES`: logical name -> mesh axis (or tuple of axes, or None). Activations use `batch`, `length` and
    `activation_embed`.
A dimension whose size is not divisible by its mesh axes is replicated instead (e.g. 2 kv heads on tensor=4);
mesh axes the mesh does not have are ignored (e.g. a ('data',)-only mesh).

Activations: the text decoder pins its residual stream [B, T, hidden] to ('batch', 'length', 'activation_embed')
with `constrain` (MaxText's `with_logical_constraint`): batch over ('data', 'fsdp'), hidden replicated, so GSPMD
all-gathers FSDP-sharded weights instead of resharding activations. It is a no-op unless a mesh is set with
`jax.set_mesh(mesh)` around the traced call.

Typical use:
  mesh = make_mesh(fsdp=2, tensor=4)
  shard_model(model, mesh)                          # parameters placed in place
  ids = jax.device_put(ids, data_sharding(mesh, 2)) # [B, T] split over ('data', 'fsdp')
  with jax.set_mesh(mesh):                          # activates the activation constraints
    logits = nnx.jit(fwd)(model, ids, ...)          # GSPMD propagates the rest
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ('data', 'fsdp', 'tensor', 'expert')

PARAM_RULES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    # text decoder
    (r'language_model\.embed_tokens\.embedding$', ('vocab', 'embed')),
    (r'lm_head\.kernel$', ('embed', 'vocab')),
    (r'self_attn\.q_proj\.kernel$', ('embed', 'heads')),
    (r'self_attn\.[kv]_proj\.kernel$', ('embed', 'kv_heads')),
    (r'self_attn\.o_proj\.kernel$', ('heads', 'embed')),
    (r'mlp\.(gate|up)_proj\.kernel$', ('embed', 'mlp')),
    (r'mlp\.down_proj\.kernel$', ('mlp', 'embed')),
    (r'mlp\.gate\.kernel$', ('embed', None)),                         # MoE router [hidden, E]
    (r'mlp\.experts\.gate_up_proj$', ('experts', 'embed', 'mlp')),    # [E, hidden, 2I]
    (r'mlp\.experts\.down_proj$', ('experts', 'mlp', 'embed')),       # [E, I, hidden]
    # vision tower
    (r'visual\.patch_embed\.proj\.kernel$', (None, 'embed')),
    (r'visual\.pos_embed\.embedding$', (None, 'embed')),
    (r'attn\.qkv\.kernel$', ('embed', 'heads')),
    (r'attn\.proj\.kernel$', ('heads', 'embed')),
    (r'linear_fc1\.kernel$', ('embed', 'mlp')),
    (r'linear_fc2\.kernel$', ('mlp', 'embed')),
)

LOGICAL_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ('batch', ('data', 'fsdp')),
    ('length', None),
    ('layers', None),               # the stacked-layer axis of scan_layers (MaxText keeps it unsharded)
    ('activation_embed', None),     # the hidden dim of the residual stream stays whole on every device
    ('embed', 'fsdp'),
    ('mlp', 'tensor'),
    ('heads', 'tensor'),
    ('kv_heads', 'tensor'),
    ('vocab', 'tensor'),
    ('experts', 'expert'),
)


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, expert: int = 1, devices=None) -> Mesh:
  """A 4-axis mesh ('data', 'fsdp', 'tensor', 'expert') over the first data*fsdp*tensor*expert devices."""
  shape = (data, fsdp, tensor, expert)
  devices = jax.devices() if devices is None else devices
  n = int(np.prod(shape))
  if n > len(devices):
    raise ValueError(f'mesh {dict(zip(MESH_AXES, shape))} needs {n} devices, have {len(devices)}')
  return Mesh(np.asarray(devices[:n]).reshape(shape), MESH_AXES)


_STACKED_LAYERS = re.compile(r'(?:^|\.)language_model\.layers\.(?!\d)')


def logical_axes(path: str, ndim: int) -> tuple[str | None, ...]:
  """Logical axis names of the parameter at dot-joined `path` (all None = replicated). Stacked decoder layers
  (`scan_layers=True`: `language_model.layers.<p>` [L, ...]) get the logical axis `layers` first."""
  stacked = _STACKED_LAYERS.search(path)
  if stacked:
    return ('layers',) + logical_axes(path[stacked.end():], ndim - 1)
  for pattern, axes in PARAM_RULES:
    if re.search(pattern, path):
      if len(axes) != ndim:
        raise ValueError(f'{path}: rule {pattern} names {len(axes)} axes, parameter has {ndim}')
      return axes
  return (None,) * ndim


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int] | None = None, mesh: Mesh | None = None,
                    rules=LOGICAL_RULES) -> PartitionSpec:
  """PartitionSpec for logical `axes`; with `shape` and `mesh`, dims not divisible by their mesh size (or mapped to
  a mesh axis already used by an earlier dim) are replicated, and mesh axes missing from `mesh` are dropped."""
  table = dict(rules)
  out, used = [], set()
  for i, name in enumerate(axes):
    mesh_axes = table.get(name) if name is not None else None
    if mesh_axes is not None:
      tup = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)
      if mesh is not None:
        tup = tuple(a for a in tup if a in mesh.axis_names)
        mesh_axes = (tup[0] if len(tup) == 1 else tup) if tup else None
    if mesh_axes is not None:
      size = int(np.prod([mesh.shape[a] for a in tup])) if mesh is not None else 1
      if used & set(tup) or (shape is not None and shape[i] % size):
        mesh_axes = None
      else:
        used |= set(tup)
    out.append(mesh_axes)
  return PartitionSpec(*out)


def param_specs(model: nnx.Module, mesh: Mesh | None = None, rules=LOGICAL_RULES) -> nnx.State:
  """`nnx.State` (same structure as `nnx.state(model, nnx.Param)`) of PartitionSpecs."""
  state = nnx.state(model, nnx.Param)
  flat = traverse_util.flatten_dict(nnx.to_pure_dict(state))
  specs = {path: logical_to_spec(logical_axes('.'.join(map(str, path)), len(v.shape)), v.shape, mesh, rules)
           for path, v in flat.items()}
  nnx.replace_by_pure_dict(state, traverse_util.unflatten_dict(specs))
  return state


def shard_model(model: nnx.Module, mesh: Mesh, rules=LOGICAL_RULES) -> nnx.Module:
  """Places every parameter of `model` on `mesh` by the rules (in place) and returns the model."""
  state = nnx.state(model, nnx.Param)
  specs = param_specs(model, mesh, rules)
  shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
  nnx.update(model, jax.device_put(state, shardings))
  return model


def constrain(x: jax.Array, axes: Sequence[str | None], rules=LOGICAL_RULES) -> jax.Array:
  """`jax.lax.with_sharding_constraint` of x by logical `axes` (one per dim) on the mesh set with `jax.set_mesh`.

  A compile-time hint: returns x unchanged when no mesh is set (single device, sampler, tests without a mesh) or
  when x is a concrete array (an eager, un-jitted call).

  Raises:
    ValueError: `axes` does not name one logical axis per dimension of x.
  """
  if len(axes) != x.ndim:
    raise ValueError(f'constrain: {len(axes)} logical axes {tuple(axes)} for an array of shape {x.shape}')
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or not isinstance(x, jax.core.Tracer):
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_spec(axes, x.shape, mesh, rules))


def data_sharding(mesh: Mesh, ndim: int = 2, batch_dim: int = 0, rules=LOGICAL_RULES) -> NamedSharding:
  """Sharding of an activation/input whose dim `batch_dim` is the batch (e.g. ids [B, T]: ndim 2, batch_dim 0;
  position ids [3, B, T]: ndim 3, batch_dim 1); other dims replicated."""
  axes = [None] * ndim
  axes[batch_dim] = 'batch'
  return NamedSharding(mesh, logical_to_spec(axes, rules=rules))
