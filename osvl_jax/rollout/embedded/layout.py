"""The embedded sampler's rollout layout on a device mesh (issue 49): tensor-parallel weights within a replica, the
batch over replicas.

The training layout (FSDP) is wrong for decode: every step would all-gather every weight. The rollout layout
(MaxText / Tunix style) uses the trainer's mesh axis names on its own mesh:
  * `data`   = replicas: the batch rows (and the KV cache's batch dim) are split over it;
  * `tensor` = the tensor-parallel degree within a replica: attention heads, KV heads, MLP width and the
    vocabulary are split over it (`DECODE_RULES`); nothing is FSDP-sharded (`embed` replicated);
  * `fsdp`, `expert` have size 1.

`rollout.mesh` (config): {'tensor': T, 'data': R}.
  * tensor: 0 (or the section unset / empty) = no layout: the sampler runs on one device, the policy's own
    placement; -1 = auto (`auto_tensor`: the smallest T whose replica holds the weights and its share of the
    rollout's KV cache within `FIT_FRACTION` of a device's memory); T >= 1 explicit.
  * data: -1 (default) = the devices left over, R = devices / T; R >= 1 explicit (R x T <= devices).
`rollout_mesh` resolves a rollout section to its `Mesh` (auto included); `mesh_from_config` builds one from the
sizes. The sizing functions (`kv_bytes_per_token`, `rollout_bytes_per_device`, `auto_tensor`) are pure: the plan
(`python -m osvl_jax.plan`) counts with them.

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
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from osvl_jax.models.qwen3_vl import sharding

# LOGICAL_RULES for decode: the batch over the replicas ('data'), weights tensor-parallel, no FSDP, no expert axis.
DECODE_RULES: tuple[tuple[str, Any], ...] = tuple(
    {**dict(sharding.LOGICAL_RULES), 'batch': 'data', 'embed': None, 'experts': None}.items())

KV_SPEC = P(None, 'data', 'tensor', None, None)   # k, v [L, B, Hkv, S, D]
MASK_SPEC = P('data', None)                       # mask [B, S]
# The share of a device's memory `auto_tensor` lets a replica's weights and KV cache take (the rest: activations,
# the prefill's transients, XLA's scratch).
FIT_FRACTION = 0.9


def mesh_sizes(mesh_config, num_devices: int, path: str = 'rollout.mesh') -> dict[str, int]:
  """{'data': replicas, 'tensor': T} of a `rollout.mesh` section on `num_devices` devices.

  Args:
    mesh_config: dict / ConfigDict with 'tensor' (int >= 1, default 1: 0 = no layout and -1 = auto are resolved
      before, by `mesh_from_config`) and optional 'data' (int >= 1, or -1 = num_devices // tensor, the default).
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
                                                                           if axis == 'data' else
                                                                           ' (0 = no layout, -1 = auto)'))
    sizes[axis] = int(size)
  if num_devices % sizes['tensor']:
    raise ValueError(f'{path}.tensor={sizes["tensor"]} does not divide the {num_devices} devices')
  if sizes['data'] == -1:
    sizes['data'] = num_devices // sizes['tensor']
  if sizes['data'] * sizes['tensor'] > num_devices:
    raise ValueError(f'{path}.data={sizes["data"]} x {path}.tensor={sizes["tensor"]} needs '
                     f'{sizes["data"] * sizes["tensor"]} devices, have {num_devices}')
  return sizes


def mesh_from_config(mesh_config, devices=None, path: str = 'rollout.mesh',
                     auto: Callable[[int, int], int] | None = None) -> Mesh | None:
  """The rollout mesh of a `rollout.mesh` section, axes `sharding.MESH_AXES` with `fsdp` = `expert` = 1.

  Args:
    mesh_config: {'tensor': T, 'data': R} (module docstring); None, empty or tensor 0: no layout (returns None).
    devices: the devices the rollout may use (default `jax.devices()`: every host's).
    path: the section's dotted name, for the errors.
    auto: for tensor -1, `auto(num_devices, replicas)` -> T (replicas: `data`, -1 = the rest), e.g. `auto_tensor`
      over the model's sizes (`rollout_mesh`).
  Raises:
    ValueError: naming `<path>.<field>`: tensor 0 beside a data other than -1, tensor -1 without `auto`, and those
      of `mesh_sizes` (an unknown field, a size out of range, sizes the devices do not fit).
  """
  if not mesh_config:
    return None
  given = dict(mesh_config.items())
  tensor, data = given.get('tensor', 1), given.get('data', -1)
  if tensor == 0 and not isinstance(tensor, bool):
    if data not in (-1, None):
      raise ValueError(f'{path}.data={data!r} with {path}.tensor=0 (no rollout layout): set {path}.tensor (>= 1, or '
                       '-1 = auto) to lay the rollout out, or data back to -1')
    return None
  devices = jax.devices() if devices is None else list(devices)
  if tensor == -1 and not isinstance(tensor, bool):
    if auto is None:
      raise ValueError(f'{path}.tensor=-1 (auto) is sized from the model and the rollout\'s KV budget: build the mesh '
                       'with layout.rollout_mesh')
    given['tensor'] = auto(len(devices), data if isinstance(data, int) and data >= 1 else -1)   # data: checked below
  return sharding.make_mesh(**mesh_sizes(given, len(devices), path), devices=devices)


def device_bytes() -> int:
  """Bytes of memory one device offers: its allocator's `bytes_limit` (TPU, GPU), else (CPU, whose devices share
  the host) the host's RAM divided by the local devices."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if stats.get('bytes_limit'):
    return int(stats['bytes_limit'])
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') // jax.local_device_count()


def weight_bytes(model) -> int:
  """Bytes of a model's parameters (`nnx.Param`s, all shards together); the model may be abstract
  (`nnx.eval_shape`)."""
  leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
  return int(sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in leaves))


def kv_bytes_per_token(text_config, dtype) -> int:
  """KV-cache bytes of one token of one row: 2 (k and v) x num_hidden_layers x num_key_value_heads x head_dim x
  the dtype's bytes (Qwen3-VL-8B in bfloat16: 2 x 36 x 8 x 128 x 2 = 147,456)."""
  return (2 * int(text_config.num_hidden_layers) * int(text_config.num_key_value_heads) * int(text_config.head_dim)
          * jnp.dtype(dtype).itemsize)


def rollout_bytes_per_device(weight_bytes: int, kv_bytes_per_row: int, rows: int, tensor: int, replicas: int,
                             shared_rows: int = 0) -> float:
  """Bytes one device holds in the rollout layout: its replica's weights and KV cache split T ways.

  A replica holds the whole weights and the KV of its ceil(rows / replicas) batch rows plus `shared_rows` (rows
  every replica holds whole: the prefix cache's slots); all of it is split over its `tensor` devices (weights
  tensor-parallel, KV heads over 'tensor').

  Args:
    weight_bytes: the model's parameter bytes (`weight_bytes`).
    kv_bytes_per_row: the KV bytes of one row at the rollout's context (`kv_bytes_per_token` x tokens).
    rows: the rows decoded at once (the rollout's concurrent episodes), split over the replicas.
    tensor, replicas: the layout's sizes (>= 1).
    shared_rows: rows of KV every replica keeps whole (prefix-cache slots of the same context).
  """
  per_replica = -(-int(rows) // int(replicas)) + int(shared_rows)
  return (weight_bytes + per_replica * kv_bytes_per_row) / tensor


def auto_tensor(weight_bytes: int, kv_bytes_per_row: int, rows: int, device_bytes: int, num_devices: int,
                num_kv_heads: int, replicas: int = -1, shared_rows: int = 0,
                fraction: float = FIT_FRACTION) -> int:
  """`rollout.mesh.tensor=-1`: the smallest tensor-parallel degree T whose replica fits (the issue's default
  layout: tensor-parallel within a replica sized to hold the weights and a KV budget, replicas over the rest).

  T ranges over the divisors of both `num_devices` and `num_kv_heads` (the KV cache splits its heads over
  'tensor'), ascending; T fits when `rollout_bytes_per_device(weight_bytes, kv_bytes_per_row, rows, T, R,
  shared_rows)` <= fraction x device_bytes, with R = `replicas` or, for -1, num_devices // T. A larger T spends
  fewer devices on replicas for less memory per device: the smallest that fits keeps the most replicas.

  Args:
    weight_bytes: bytes of the model's parameters (`weight_bytes`).
    kv_bytes_per_row: KV bytes of one row at the rollout's context, max_total_tokens + max_new_tokens tokens
      (`kv_bytes_per_token` x tokens).
    rows: rows decoded at once (`rollout.max_concurrency`), >= 1.
    device_bytes: memory of one device (`device_bytes`).
    num_devices: devices of the rollout mesh.
    num_kv_heads: the model's `num_key_value_heads`.
    replicas: `rollout.mesh.data` (-1 = num_devices // T).
    shared_rows: rows every replica keeps whole (`rollout.prefix_cache_slots`).
    fraction: the share of `device_bytes` a replica's weights and KV may take.
  Returns:
    T, an int >= 1 dividing num_devices and num_kv_heads.
  Raises:
    ValueError: naming rollout.mesh.tensor=-1 and the bytes per device at the largest T, when no T fits.
  """
  candidates = [t for t in range(1, num_devices + 1)
                if num_devices % t == 0 and num_kv_heads % t == 0 and (replicas == -1 or replicas * t <= num_devices)]
  need = {}
  for t in candidates:
    need[t] = rollout_bytes_per_device(weight_bytes, kv_bytes_per_row, rows, t,
                                       num_devices // t if replicas == -1 else replicas, shared_rows)
    if need[t] <= fraction * device_bytes:
      return t
  worst = max(candidates) if candidates else None
  detail = (f'at tensor={worst} a device would hold {need[worst] / 2**30:.2f} GiB' if worst is not None else
            f'no tensor size with data={replicas} fits the {num_devices} devices')
  raise ValueError(f'rollout.mesh.tensor=-1 (auto): no tensor-parallel degree dividing the {num_devices} devices and '
                   f'the {num_kv_heads} KV heads holds a replica ({weight_bytes / 2**30:.2f} GiB of weights, '
                   f'{rows} rows of {kv_bytes_per_row / 2**20:.1f} MiB of KV) in {fraction:.0%} of '
                   f'{device_bytes / 2**30:.2f} GiB per device: {detail}; lower rollout.max_concurrency or the '
                   'context, or use more devices')


def rollout_mesh(mesh_config, model, rows: int | None, tokens: int, shared_rows: int = 0, devices=None,
                 path: str = 'rollout.mesh') -> Mesh | None:
  """The rollout mesh of a `rollout.mesh` section over `model` (None: no layout), tensor -1 sized by `auto_tensor`.

  Args:
    mesh_config: {'tensor', 'data'} (module docstring).
    model: the policy (`Qwen3VLModel`, concrete or `nnx.eval_shape`d): its parameters, text config and dtype.
    rows: the rows decoded at once (`rollout.max_concurrency`; the server's `--max_batch`); needed for tensor -1.
    tokens: a row's context (max_total_tokens + max_new_tokens; the server's `--max_len`).
    shared_rows: rows every replica keeps whole (the prefix cache's slots).
    devices: the devices the rollout may use (default `jax.devices()`).
    path: the section's dotted name, for the errors.
  Raises:
    ValueError: from `mesh_from_config` / `auto_tensor`, naming the field; tensor -1 without `rows`.
  """
  def auto(num_devices: int, replicas: int) -> int:
    if not rows:
      raise ValueError(f'{path}.tensor=-1 (auto) sizes the KV cache for the rollout\'s concurrent rows: none given '
                       '(rollout.max_concurrency)')
    text = model.config.text
    return auto_tensor(weight_bytes(model), kv_bytes_per_token(text, model.dtype) * int(tokens), int(rows),
                       device_bytes(), num_devices, int(text.num_key_value_heads), replicas, int(shared_rows))
  return mesh_from_config(mesh_config, devices, path, auto)


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
