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
(`host_rows`, `global_array`; the trainers' `train.placement.host_batch`). What one host makes and all need (GRPO's
rollout batch, made by process 0 alone) goes to every process with `broadcast_object`; arrays split over several
hosts come back to the host with `to_host` (`jax.device_get` cannot read another host's shards); `barrier` waits
for every process.
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
