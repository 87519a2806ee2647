"""Multi-host runs: when to call `jax.distributed.initialize`, who writes, and which rows each host feeds.

Every entry point (SFT, GRPO, the demo) calls `initialize()` first thing in its `main`. It starts JAX's
distributed runtime only when the job runs as more than one process, decided from the environment:

  OSVL_COORDINATOR_ADDRESS (or JAX's own JAX_COORDINATOR_ADDRESS), OSVL_NUM_PROCESSES, OSVL_PROCESS_ID
      explicit settings (CPU tests, hand-made clusters): `host:port` of process 0, the process count, this
      process's index. All three, or none.
  OSVL_DISTRIBUTED=auto
      let JAX detect the cluster (Cloud TPU VM pods, GKE, Slurm, Open MPI); `tpu_scripts/launch.sh` sets it on
      every worker of a multi-host TPU.
  OSVL_DISTRIBUTED=0
      never initialize (a single host, even on a pod slice's worker).

Without any of these (a laptop, CI, one TPU VM host) nothing is initialized and the job is one process. A
multi-host TPU also announces itself with `TPU_WORKER_HOSTNAMES` listing more than one host or with
`MEGASCALE_NUM_SLICES` > 1 (multi-slice); those count as `auto`.

After `initialize`, `jax.devices()` is the global device list (every host's chips), `jax.process_index()` says
who this host is: process 0 alone writes metrics and logs (`is_main`), every process takes part in the
checkpoint (orbax writes each host's shards), and each host puts on its devices only its rows of a batch
(`host_rows`, `host_batch`). What one host makes and all need (GRPO's rollout batch, made by process 0 alone) goes
to every process with `broadcast_object`; arrays split over several hosts come back to the host with `to_host`
(`jax.device_get` cannot read another host's shards); `barrier` waits for every process.
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Mapping

import jax
import numpy as np

ENV_COORDINATOR = 'OSVL_COORDINATOR_ADDRESS'
ENV_NUM_PROCESSES = 'OSVL_NUM_PROCESSES'
ENV_PROCESS_ID = 'OSVL_PROCESS_ID'
ENV_MODE = 'OSVL_DISTRIBUTED'


def settings(env: Mapping[str, str] | None = None) -> dict | None:
  """What `initialize` would do in `env` (default `os.environ`).

  Returns:
    None (one process: nothing to initialize), {} (JAX auto-detects the cluster), or
    {'coordinator_address', 'num_processes', 'process_id'} from the explicit variables.
  Raises:
    ValueError: only some of the explicit variables are set, or they are not integers / out of range.
  """
  env = os.environ if env is None else env
  mode = env.get(ENV_MODE, '').strip().lower()
  if mode in ('0', 'false', 'no', 'off'):
    return None
  coordinator = env.get(ENV_COORDINATOR) or env.get('JAX_COORDINATOR_ADDRESS')
  explicit = {ENV_COORDINATOR: coordinator, ENV_NUM_PROCESSES: env.get(ENV_NUM_PROCESSES),
              ENV_PROCESS_ID: env.get(ENV_PROCESS_ID)}
  given = [k for k, v in explicit.items() if v]
  if given and len(given) < 3:
    missing = sorted(set(explicit) - set(given))
    raise ValueError(f'distributed run: {", ".join(given)} set but not {", ".join(missing)} (set all three)')
  if given:
    try:
      num, pid = int(explicit[ENV_NUM_PROCESSES]), int(explicit[ENV_PROCESS_ID])
    except ValueError as e:
      raise ValueError(f'{ENV_NUM_PROCESSES} and {ENV_PROCESS_ID} must be integers: {e}') from None
    if not 0 <= pid < num:
      raise ValueError(f'{ENV_PROCESS_ID}={pid} is not in [0, {ENV_NUM_PROCESSES}={num})')
    if num == 1:
      return None
    return {'coordinator_address': coordinator, 'num_processes': num, 'process_id': pid}
  if mode in ('1', 'auto', 'true', 'yes', 'on'):
    return {}
  hosts = [h for h in env.get('TPU_WORKER_HOSTNAMES', '').split(',') if h.strip()]
  if len(hosts) > 1 or int(env.get('MEGASCALE_NUM_SLICES', '1') or 1) > 1:
    return {}
  return None


def initialize(env: Mapping[str, str] | None = None) -> bool:
  """Starts `jax.distributed` when the environment describes a multi-process job (see the module docstring).

  Call it before anything touches a JAX device. Idempotent.

  Returns:
    True when this is a distributed run (now or already initialized), False for a single process.
  """
  if jax.distributed.is_initialized():
    return True
  kwargs = settings(env)
  if kwargs is None:
    return False
  jax.distributed.initialize(**kwargs)
  return True


def is_main() -> bool:
  """True on the process that writes metrics, logs and other single-writer files (process 0)."""
  return jax.process_index() == 0


def broadcast_object(obj: Any) -> Any:
  """Process 0's `obj` on every process (a collective: every process calls it at the same point).

  Process 0 pickles `obj`; its size, then its bytes (as uint32 words), go to every process with
  `multihost_utils.broadcast_one_to_all`, and the others unpickle them. A single process returns `obj` unchanged.

  Args:
    obj: any picklable value on process 0 (e.g. GRPO's rollout batch: trajectories, scores); ignored elsewhere.
  Returns:
    process 0's `obj` (on process 0 the object itself, elsewhere an equal copy).
  Raises:
    ValueError: the pickle of `obj` is 2 GiB or more (the size travels as an int32).
  """
  if jax.process_count() == 1:
    return obj
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8) if is_main() else None
  if data is not None and data.size >= 2 ** 31 - 4:
    raise ValueError(f'broadcast_object: the pickled object is {data.size} bytes, over the 2 GiB limit')
  size = int(multihost_utils.broadcast_one_to_all(np.int32(data.size if is_main() else 0)))
  words = np.zeros(-(-size // 4), np.uint32)  # sums in uint32 keep their dtype (uint8 would be promoted)
  if is_main():
    words.view(np.uint8)[:size] = data
  words = np.asarray(multihost_utils.broadcast_one_to_all(words), np.uint32)
  return obj if is_main() else pickle.loads(words.view(np.uint8)[:size].tobytes())


def to_host(tree: Any) -> Any:
  """`jax.device_get` of a pytree whose arrays may span several hosts: numpy arrays of the global values.

  An array split over several processes' devices (e.g. [B, K] log-probs with rows over ('data', 'fsdp')) is
  gathered with `multihost_utils.process_allgather` (a collective: every process must call `to_host` on the same
  arrays in the same order); a replicated or fully addressable one is read locally.
  """
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  def get(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
      return multihost_utils.process_allgather(x, tiled=True)
    return jax.device_get(x)

  return jax.tree.map(get, tree)


def barrier(name: str) -> None:
  """Waits until every process reaches `barrier(name)` (`multihost_utils.sync_global_devices`); a single process
  returns at once."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


def host_rows(mesh: jax.sharding.Mesh | None, batch_size: int, rules=None) -> slice:
  """The rows of a global batch that this host feeds when the batch is split over the mesh axes of the logical
  'batch' axis (('data', 'fsdp'); `sharding.data_sharding` with `rules`, default `sharding.LOGICAL_RULES`).

  They are the rows held by this process's devices: one contiguous block (a mesh over `jax.devices()` lists each
  process's devices together). Without a mesh, or in a single process, all rows.

  Raises:
    ValueError: the rows of this host's devices are not one contiguous block (a mesh that interleaves hosts), or
      `batch_size` does not split over the batch axes.
  """
  from osvl_jax.models.qwen3_vl import sharding  # pylint: disable=g-import-not-at-top
  if mesh is None or jax.process_count() == 1:
    return slice(0, batch_size)
  rules = sharding.LOGICAL_RULES if rules is None else rules
  shards = sharding.batch_shards(mesh, rules)
  if batch_size % shards:
    raise ValueError(f'global batch of {batch_size} rows does not split over the {shards} data x fsdp devices')
  rows = sorted({index[0].indices(batch_size)[:2] for index in
                 sharding.data_sharding(mesh, 1, rules=rules).addressable_devices_indices_map((batch_size,)).values()})
  start, stop = rows[0][0], rows[-1][1]
  if any(a[1] != b[0] for a, b in zip(rows, rows[1:])):
    raise ValueError(f'process {jax.process_index()} holds rows {rows}, not one contiguous block')
  return slice(start, stop)


def global_array(sharding: jax.sharding.NamedSharding, local: np.ndarray, axis: int | None,
                 batch_size: int) -> jax.Array:
  """One global array from this host's part: its rows (`host_rows`) along `axis`, or, for axis None, the whole
  value (identical on every host; replicated or split by `sharding` as it says)."""
  local = np.asarray(local)
  shape = local.shape
  if axis is not None:
    shape = shape[:axis] + (batch_size,) + shape[axis + 1:]
  return jax.make_array_from_process_local_data(sharding, local, shape)


def host_batch(trajectories: list, mesh: jax.sharding.Mesh, length: int, num_loss: int, rules=None,
               vision_config=None, patches_per_shard: int = 0) -> dict:
  """The global training batch of `trajectories`, of which this host collates only its own rows.

  Text fields (ids, masks, positions, loss gathers) are collated from this host's rows alone and become global
  arrays split over the batch axes ('data', 'fsdp') (`policy.batch_sharding`). The images are laid out per batch
  shard with their geometry as arrays (`batching.shard_vision_inputs`: pixel_values [S, P, 1536], vision_* [S, P,
  ...], split like the rows): each host lays out the whole batch's images from the trajectories (their grids give
  each row's patches; no tokenizing, no collation of other hosts' rows) and places its devices' shards. In a single
  process this is `collate` + `policy.shard_batch`.

  Args:
    trajectories: the B rows of the global batch, the same list on every host.
    mesh: the trainer's mesh (`sharding.mesh_from_config`).
    length, num_loss: the run's fixed T and K (`batching.padded_sizes`).
    rules: logical rules (`sharding.rules_from_config`); None = `sharding.LOGICAL_RULES`.
    vision_config: the policy's `VisionConfig` (needed when a trajectory has images or a patch budget is set).
    patches_per_shard: the patch budget P (`sft.patches_per_shard`); 0 = the fullest shard of this batch.
  Returns:
    the batch of jax arrays (no image_grid_thw: nothing of it is static under jit).
  Raises:
    ValueError: B does not split over the mesh's batch axes; a shard over the patch budget.
  """
  from osvl_jax.models.qwen3_vl import sharding  # pylint: disable=g-import-not-at-top
  from osvl_jax.train import batching, policy  # pylint: disable=g-import-not-at-top
  rules = sharding.LOGICAL_RULES if rules is None else rules
  if jax.process_count() == 1:
    batch = batching.collate(trajectories, length=length, num_loss=num_loss)
    return policy.shard_batch(batch, mesh, rules, vision_config, patches_per_shard)
  size = len(trajectories)
  local = batching.collate(trajectories[host_rows(mesh, size, rules)], length=length, num_loss=num_loss)
  local.pop('image_grid_thw')
  local.pop('pixel_values')
  images = [image for traj in trajectories for image in traj.images]
  per_row = np.array([sum(int(np.prod(i.grid_thw)) for i in traj.images) for traj in trajectories], np.int64)
  vision = batching.shard_vision_inputs(
      np.concatenate([np.asarray(i.pixel_values, np.float32) for i in images]) if images else None,
      np.array([np.asarray(i.grid_thw) for i in images], np.int32).reshape(-1, 3), per_row,
      sharding.batch_shards(mesh, rules), vision_config, patches_per_shard) if images or patches_per_shard else {}
  out = {}
  for key, value in local.items():
    if value is None:
      out[key] = None
      continue
    target, row_axis = policy.batch_sharding(key, np.ndim(value), mesh, rules)
    out[key] = global_array(target, value, row_axis, size)
  for key, value in vision.items():   # the whole batch's layout on every host: each places its devices' shards
    if value is None:
      out[key] = None
      continue
    target, _ = policy.batch_sharding(key, value.ndim, mesh, rules)
    out[key] = jax.make_array_from_callback(value.shape, target, lambda index, value=value: value[index])
  if 'pixel_values' not in out:
    out['pixel_values'] = None
  return out
