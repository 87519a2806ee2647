"""The embedded sampler's rollout layout on a device mesh (issue 49): tensor-parallel weights within a replica, the
batch over replicas.

The training layout (FSDP) is wrong for decode: every step would all-gather every weight. The rollout layout
(MaxText / Tunix style) uses the trainer's mesh axis names on its own mesh:
  * `data`   = replicas: the batch rows (and the KV cache's batch dim) are split over it;
  * `tensor` = the tensor-parallel degree within a replica: attention heads, KV heads, MLP width and the
    vocabulary are split over it (`DECODE_RULES`); nothing is FSDP-sharded (`embed` replicated);
  * `fsdp`, `expert` have size 1.

`rollout.mesh` (config): {'tensor': T, 'data': R}; `data` may be -1 (default): the devices left over, R = devices / T.
Unset or None: no layout (the sampler runs on one device, today's behaviour).

A `Layout` is what `jax_sampler.JaxSampler(mesh=...)` uses:
  * `place_state`: the sampler's weights resharded to the rollout layout by one `jax.device_put` to the target
    `NamedSharding`s (the trainer keeps its own arrays, so nothing is donated);
  * `init_cache`: the KV cache {'k','v': [L, B, Hkv, S, D], 'mask': bool [B, S]} created sharded
    (k/v: P(None, 'data', 'tensor', None, None), mask: P('data', None)), never whole on one device;
  * `constrain_cache`: the same layout pinned inside the jitted prefill / decode programs;
  * `call`: a jitted program run under `sharding.use_mesh(mesh, DECODE_RULES)`, so the model's activation
    constraints (`sharding.constrain`: batch over `data`) apply when it is traced;
  * `batch_multiple`: the replica count; the sampler pads its (bucketed) batch to a multiple of it.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from osvl_jax.models.qwen3_vl import sharding

# LOGICAL_RULES for decode: the batch over the replicas ('data'), weights tensor-parallel, no FSDP, no expert axis.
DECODE_RULES: tuple[tuple[str, Any], ...] = tuple(
    {**dict(sharding.LOGICAL_RULES), 'batch': 'data', 'embed': None, 'experts': None}.items())

KV_SPEC = P(None, 'data', 'tensor', None, None)   # k, v [L, B, Hkv, S, D]
MASK_SPEC = P('data', None)                       # mask [B, S]


def mesh_sizes(mesh_config, num_devices: int, path: str = 'rollout.mesh') -> dict[str, int]:
  """{'data': replicas, 'tensor': T} of a `rollout.mesh` section on `num_devices` devices.

  Args:
    mesh_config: dict / ConfigDict with 'tensor' (int >= 1, default 1) and optional 'data' (int >= 1, or -1 =
      num_devices // tensor, the default).
    num_devices: the devices the rollout may use.
    path: the section's dotted name, for the errors.
  Raises:
    ValueError: naming `<path>.<field>`: an unknown field, a size that is not an int >= 1 (data: or -1), tensor not
      dividing the devices, or data * tensor more devices than there are.
  """
  given = dict(mesh_config.items())
  unknown = sorted(set(given) - {'data', 'tensor'})
  if unknown:
    raise ValueError(f"{path}.{unknown[0]}: unknown field; the rollout mesh has 'tensor' (tensor-parallel degree) "
                     "and 'data' (replicas, -1 = the remaining devices)")
  sizes = {}
  for axis, default in (('tensor', 1), ('data', -1)):
    size = given.get(axis, default)
    ok = isinstance(size, (int, np.integer)) and not isinstance(size, bool) and (size >= 1 or
                                                                                 (axis == 'data' and size == -1))
    if not ok:
      raise ValueError(f'{path}.{axis}={size!r}: expected an int >= 1' + (', or -1 for the remaining devices'
                                                                           if axis == 'data' else ''))
    sizes[axis] = int(size)
  if num_devices % sizes['tensor']:
    raise ValueError(f'{path}.tensor={sizes["tensor"]} does not divide the {num_devices} devices')
  if sizes['data'] == -1:
    sizes['data'] = num_devices // sizes['tensor']
  if sizes['data'] * sizes['tensor'] > num_devices:
    raise ValueError(f'{path}.data={sizes["data"]} x {path}.tensor={sizes["tensor"]} needs '
                     f'{sizes["data"] * sizes["tensor"]} devices, have {num_devices}')
  return sizes


def mesh_from_config(mesh_config, devices=None, path: str = 'rollout.mesh') -> Mesh | None:
  """The rollout mesh of `rollout.mesh` (None when unset or empty: no layout), axes `sharding.MESH_AXES` with
  `fsdp` = `expert` = 1. Raises ValueError from `mesh_sizes`, naming the field."""
  if not mesh_config:
    return None
  devices = jax.devices() if devices is None else list(devices)
  return sharding.make_mesh(**mesh_sizes(mesh_config, len(devices), path), devices=devices)


class Layout:
  """The rollout layout of a sampler on `mesh` (module docstring).

  Attributes:
    mesh: the rollout `Mesh` (axes `sharding.MESH_AXES`; fsdp and expert of size 1).
    rules: the logical rules (`DECODE_RULES`).
    replicas, tensor: the sizes of 'data' and 'tensor'.
  """

  def __init__(self, mesh: Mesh, rules=DECODE_RULES):
    """Raises ValueError when `mesh` shards over 'fsdp' or 'expert' (the rollout layout has neither)."""
    for axis in ('fsdp', 'expert'):
      if mesh.shape.get(axis, 1) != 1:
        raise ValueError(f'the rollout mesh has {axis}={mesh.shape[axis]}; its axes are data (replicas) and '
                         'tensor only')
    self.mesh, self.rules = mesh, tuple(rules)
    self.replicas, self.tensor = int(mesh.shape.get('data', 1)), int(mesh.shape.get('tensor', 1))

  @property
  def batch_multiple(self) -> int:
    """Batch rows are split over the replicas: a batch is padded to a multiple of this."""
    return self.replicas

  def check_model(self, model) -> None:
    """Refuses a model whose KV heads the tensor axis cannot split.

    Raises:
      ValueError: naming rollout.mesh.tensor and num_key_value_heads, when T does not divide them.
    """
    text = getattr(getattr(model, 'config', None), 'text', None)
    heads = getattr(text, 'num_key_value_heads', None)
    if heads is not None and heads % self.tensor:
      raise ValueError(f'rollout.mesh.tensor={self.tensor} does not divide the model\'s num_key_value_heads={heads}: '
                       'the KV cache splits its heads over the tensor axis')

  def place_state(self, state):
    """The weights `state` (nnx.State of arrays) on the rollout layout: one `jax.device_put` to the NamedShardings
    of `sharding.state_shardings` under `DECODE_RULES` (the input arrays are left to their owner)."""
    return jax.device_put(state, sharding.state_shardings(state, self.mesh, self.rules))

  def cache_shardings(self) -> dict:
    """{'k','v': NamedSharding(KV_SPEC), 'mask': NamedSharding(MASK_SPEC)}."""
    kv = NamedSharding(self.mesh, KV_SPEC)
    return {'k': kv, 'v': kv, 'mask': NamedSharding(self.mesh, MASK_SPEC)}

  def init_cache(self, model, batch: int, cache_len: int, dtype=None) -> dict:
    """`model.init_cache(batch, cache_len, dtype)` created sharded (`cache_shardings`): {'k','v': dtype
    [L, B, Hkv, S, D], 'mask': bool [B, S]}; `batch` must be a multiple of `batch_multiple`."""
    if batch % self.replicas:
      raise ValueError(f'batch {batch} is not a multiple of the {self.replicas} rollout replicas')
    shapes = jax.eval_shape(lambda: model.init_cache(batch, cache_len, dtype))   # an empty cache is all zeros
    shardings = self.cache_shardings()
    return {k: jnp.zeros(x.shape, x.dtype, device=shardings[k]) for k, x in shapes.items()}

  def constrain_cache(self, cache: dict) -> dict:
    """`with_sharding_constraint` of a traced cache to `cache_shardings` (inside a jitted program)."""
    shardings = self.cache_shardings()
    return {k: jax.lax.with_sharding_constraint(v, shardings[k]) for k, v in cache.items()}

  def put_cache(self, cache: dict) -> dict:
    """A concrete cache moved to `cache_shardings` (no copy where it already is)."""
    return jax.device_put(cache, self.cache_shardings())

  def call(self, fn):
    """`fn` (a jitted program) called under `sharding.use_mesh(mesh, rules)`: traced with the activation
    constraints of the rollout layout."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
      with sharding.use_mesh(self.mesh, self.rules):
        return fn(*args, **kwargs)
    run.lower = lambda *a, **k: self._lower(fn, *a, **k)
    return run

  def _lower(self, fn, *args, **kwargs):
    with sharding.use_mesh(self.mesh, self.rules):
      return fn.lower(*args, **kwargs)


def kv_bytes(cache: dict) -> int:
  """Bytes of a cache's k and v arrays, all shards together."""
  return int(sum(np.prod(cache[k].shape) * jnp.dtype(cache[k].dtype).itemsize for k in ('k', 'v')))
