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

The trainers build their mesh from the config once, in main (`mesh_from_config(config.mesh)`, rules from
`rules_from_config`), pass it down, and place the model and optimizer state with `state_shardings`
(`osvl_jax.train.policy.create`). Config checks compute with its shape alone (`mesh_shape_from_config`: an
`AbstractMesh`, no devices), so checking a config never builds a mesh.

Typical use:
  mesh = make_mesh(fsdp=2, tensor=4)                # or mesh_from_config(config.mesh)
  shard_model(model, mesh)                          # parameters placed in place
  ids = jax.device_put(ids, data_sharding(mesh, 2)) # [B, T] split over ('data', 'fsdp')
  with jax.set_mesh(mesh):                          # activates the activation constraints
    logits = nnx.jit(fwd)(model, ids, ...)          # GSPMD propagates the rest
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Sequence

import jax
import numpy as np
from absl import logging
from flax import nnx
from flax import traverse_util
from jax.experimental import mesh_utils
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

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
  """A 4-axis mesh ('data', 'fsdp', 'tensor', 'expert') over the first data*fsdp*tensor*expert of `devices`
  (default `jax.devices()`, every host's after `jax.distributed.initialize`).

  The device order comes from `jax.experimental.mesh_utils.create_device_mesh` (topology-aware on TPU/GPU), or a
  plain reshape where it does not apply (a subset of a TPU slice).

  Raises:
    ValueError: the mesh needs more devices than there are.
  """
  shape = (data, fsdp, tensor, expert)
  devices = jax.devices() if devices is None else list(devices)
  n = int(np.prod(shape))
  if n > len(devices):
    raise ValueError(f'mesh {dict(zip(MESH_AXES, shape))} needs {n} devices, have {len(devices)}')
  try:
    grid = mesh_utils.create_device_mesh(shape, devices[:n], allow_split_physical_axes=True)
  except (ValueError, NotImplementedError, AssertionError):
    grid = np.asarray(devices[:n]).reshape(shape)
  return Mesh(grid, MESH_AXES)


def mesh_from_config(mesh_config, devices=None) -> Mesh:
  """The training mesh of `config.mesh` (big_vision style): `make_mesh` with the sizes of `mesh_sizes`.

  Args:
    mesh_config: `config.mesh` (ConfigDict or dict), e.g. {'data': 1, 'fsdp': -1, 'tensor': 1, 'expert': 1};
      None = the trivial mesh (all sizes 1).
    devices: the devices to lay out (default `jax.devices()`: every host's after `jax.distributed.initialize`).
  Returns:
    A `Mesh` with axes ('data', 'fsdp', 'tensor', 'expert').
  Raises:
    ValueError: from `mesh_sizes`, naming `mesh.<axis>`.
  """
  devices = jax.devices() if devices is None else list(devices)
  sizes = mesh_sizes(mesh_config, len(devices), multi_host=jax.process_count() > 1)
  if int(np.prod(list(sizes.values()))) < len(devices):
    logging.warning('mesh %s uses %d of the %d devices', sizes, int(np.prod(list(sizes.values()))), len(devices))
  return make_mesh(**sizes, devices=devices)


def abstract_mesh(sizes: dict[str, int]) -> AbstractMesh:
  """A device-free mesh with axes `MESH_AXES` of the given sizes (missing axes 1)."""
  return AbstractMesh(tuple(int(sizes.get(a, 1)) for a in MESH_AXES), MESH_AXES)


def mesh_shape_from_config(mesh_config) -> AbstractMesh:
  """The shape of the mesh `mesh_from_config` would build on this job's devices, without building it: what config
  checks compute with (batch shards, device fit), so that a run builds its one `Mesh` in main.

  Raises:
    ValueError: from `mesh_sizes`, naming `mesh.<axis>` (the same faults `mesh_from_config` refuses).
  """
  return abstract_mesh(mesh_sizes(mesh_config, jax.device_count(), multi_host=jax.process_count() > 1))


def mesh_sizes(mesh_config, num_devices: int, multi_host: bool = False) -> dict[str, int]:
  """Axis sizes {'data', 'fsdp', 'tensor', 'expert'} of `config.mesh` on `num_devices` devices.

  Missing axes are 1; one axis may be -1: the devices left over by the others. The sizes should multiply to
  `num_devices`; in a single process a smaller product is allowed (the mesh takes the first devices and the rest
  idle: e.g. the demo's trivial mesh in an 8-device test run); in a multi-host job every device must be in it.

  Raises:
    ValueError: naming `mesh.<axis>`: an unknown axis, a size that is not an int >= 1 or -1, more than one -1,
      sizes needing more devices than there are, not dividing them (with a -1), or (multi-host) fewer.
  """
  given = dict(mesh_config.items()) if mesh_config is not None else {}
  unknown = sorted(set(given) - set(MESH_AXES))
  if unknown:
    raise ValueError(f'mesh.{unknown[0]}: unknown mesh axis; the axes are {MESH_AXES}')
  sizes = {}
  for axis in MESH_AXES:
    size = given.get(axis, 1)
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or (size < 1 and size != -1):
      raise ValueError(f'mesh.{axis}={size!r}: expected an int >= 1, or -1 for the remaining devices')
    sizes[axis] = int(size)
  rest = [a for a, s in sizes.items() if s == -1]
  if len(rest) > 1:
    raise ValueError(f'mesh.{rest[1]}=-1: only one axis may be -1 (also mesh.{rest[0]}=-1)')
  fixed = int(np.prod([s for s in sizes.values() if s != -1]))
  if rest:
    if num_devices % fixed:
      raise ValueError(f'mesh.{rest[0]}=-1: the other axes need {fixed} devices, which do not divide the '
                       f'{num_devices} devices')
    sizes[rest[0]] = num_devices // fixed
  elif fixed > num_devices or (fixed < num_devices and multi_host):
    named = next((a for a in MESH_AXES if sizes[a] > 1), 'fsdp')
    raise ValueError(f'mesh.{named}: axis sizes {sizes} make {fixed} devices, but there are {num_devices}'
                     f'{" (a multi-host mesh must hold them all)" if multi_host else ""}; set one axis to -1 for '
                     'the rest')
  return sizes


def rules_from_config(config) -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
  """`LOGICAL_RULES` with the entries of `config.sharding_rules` (optional; (logical name, mesh axes) pairs, e.g.
  (('embed', None), ('mlp', ('fsdp', 'tensor')))) replacing those of the same logical name.

  Raises:
    ValueError: naming `sharding_rules`: an entry that is not a (name, axes) pair, or axes outside `MESH_AXES`.
  """
  extra = config.get('sharding_rules') if config is not None else None
  if not extra:
    return LOGICAL_RULES
  table = dict(LOGICAL_RULES)
  for entry in extra:
    if not isinstance(entry, (tuple, list)) or len(entry) != 2 or not isinstance(entry[0], str):
      raise ValueError(f'sharding_rules: {entry!r} is not a (logical name, mesh axes) pair')
    name, axes = entry
    tup = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    if any(a not in MESH_AXES for a in tup):
      raise ValueError(f'sharding_rules: {name!r} -> {axes!r} names an axis outside {MESH_AXES}')
    table[name] = axes if not isinstance(axes, list) else tuple(axes)
  return tuple(table.items())


_CURRENT_RULES: contextvars.ContextVar = contextvars.ContextVar('logical_rules', default=LOGICAL_RULES)


@contextlib.contextmanager
def use_mesh(mesh: Mesh, rules=LOGICAL_RULES):
  """`jax.set_mesh(mesh)` for the block, with `constrain` (activation constraints) mapping logical names by `rules`.

  Both are read when a step is traced: enter the block around the jitted call (the trainers wrap their loop).
  """
  token = _CURRENT_RULES.set(tuple(rules))
  try:
    with jax.set_mesh(mesh):
      yield mesh
  finally:
    _CURRENT_RULES.reset(token)


def current_rules() -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
  """The logical rules of the enclosing `use_mesh` block (else `LOGICAL_RULES`), read when a step is traced."""
  return _CURRENT_RULES.get()


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


def state_shardings(state, mesh: Mesh, rules=LOGICAL_RULES):
  """`NamedSharding`s, by the rules, for every array of `state` (an nnx.State or pytree, of arrays or
  ShapeDtypeStructs), read from its dot-joined path: parameters, and the optimizer state, whose Adam `mu` / `nu`
  paths end in their parameter's path and so get its sharding. Leaves no rule matches (norms, step counts) are
  replicated. Same structure as `state` (usable as `jax.jit`'s `out_shardings`).
  """
  def leaf(path, x):
    return path_sharding(jax.tree_util.keystr(path, simple=True, separator='.').removesuffix('.value'), x.shape,
                         mesh, rules)
  return jax.tree_util.tree_map_with_path(leaf, state)


def path_sharding(path: str, shape: Sequence[int], mesh: Mesh, rules=LOGICAL_RULES) -> NamedSharding:
  """`NamedSharding` of the array of `shape` at dot-joined parameter `path` (`logical_axes`, `logical_to_spec`)."""
  return NamedSharding(mesh, logical_to_spec(logical_axes(path, len(shape)), shape, mesh, rules))


def shard_model(model: nnx.Module, mesh: Mesh, rules=LOGICAL_RULES) -> nnx.Module:
  """Places every parameter of `model` on `mesh` by the rules (in place) and returns the model."""
  state = nnx.state(model, nnx.Param)
  nnx.update(model, jax.device_put(state, state_shardings(state, mesh, rules)))
  return model


def constrain(x: jax.Array, axes: Sequence[str | None], rules=None) -> jax.Array:
  """`jax.lax.with_sharding_constraint` of x by logical `axes` (one per dim) on the mesh set with `jax.set_mesh`,
  by `rules` (default: those of the enclosing `use_mesh` block, else `LOGICAL_RULES`).

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
  rules = current_rules() if rules is None else rules
  return jax.lax.with_sharding_constraint(x, logical_to_spec(axes, x.shape, mesh, rules))


def constrain_state(state):
  """`jax.lax.with_sharding_constraint` of every array of `state` (nnx.State or pytree: parameters, gradients,
  optimizer state) to the PartitionSpec the rules give its path (as `state_shardings`), on the mesh set with
  `jax.set_mesh` / `use_mesh`, by that block's rules. Pins a jitted step's updated state to the placement it came
  in with, so the compiler cannot pick another one (and the next call does not recompile). Returns `state`
  unchanged when no mesh is set.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return state
  rules = current_rules()

  def leaf(path, x):
    name = jax.tree_util.keystr(path, simple=True, separator='.').removesuffix('.value')
    return jax.lax.with_sharding_constraint(x, logical_to_spec(logical_axes(name, x.ndim), x.shape, mesh, rules))
  return jax.tree_util.tree_map_with_path(leaf, state)


def data_sharding(mesh: Mesh, ndim: int = 2, batch_dim: int = 0, rules=LOGICAL_RULES) -> NamedSharding:
  """Sharding of an activation/input whose dim `batch_dim` is the batch (e.g. ids [B, T]: ndim 2, batch_dim 0;
  position ids [3, B, T]: ndim 3, batch_dim 1), split over the mesh axes of the logical 'batch' axis (('data',
  'fsdp') by default); other dims replicated."""
  axes = [None] * ndim
  axes[batch_dim] = 'batch'
  return NamedSharding(mesh, logical_to_spec(axes, mesh=mesh, rules=rules))


def batch_shards(mesh: Mesh | AbstractMesh, rules=LOGICAL_RULES) -> int:
  """How many pieces `data_sharding` cuts the batch into: the product of the sizes of the 'batch' mesh axes (of a
  `Mesh`, or of its shape alone: `mesh_shape_from_config`)."""
  spec = logical_to_spec(('batch',), mesh=mesh, rules=rules)[0]
  axes = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
  return int(np.prod([mesh.shape[a] for a in axes]))
