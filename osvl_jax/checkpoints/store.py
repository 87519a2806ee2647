"""Orbax checkpoints of (model params, optimizer state, step, metadata) in `<workdir>/<name>/`.

`workdir` may be a local folder or a cloud URL (`gs://bucket/run`): it is handled as an `etils.epath.Path`
(`storage.path`), never as a `pathlib.Path`, so the URL reaches orbax and tensorstore unchanged. In a multi-host
run every process calls `save` / `restore` (orbax writes and reads each host's shards; process 0 the metadata).
Saves are asynchronous when asked (`wait=False`): the arrays are copied off the devices before `save` returns and
written in the background; the next save, `wait_until_finished` or a `wait=True` save waits for them.
"""

import os

import jax
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from osvl_jax.checkpoints import storage


def manager(workdir: str | os.PathLike, name: str, max_to_keep: int = 2) -> ocp.CheckpointManager:
  """A CheckpointManager writing `<workdir>/<name>/<step>/`, keeping the newest `max_to_keep` steps."""
  return ocp.CheckpointManager(directory(workdir, name), options=ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=True, enable_async_checkpointing=True))


def directory(workdir: str | os.PathLike, name: str) -> epath.Path:
  """`<workdir>/<name>` as orbax sees it: a URL stays a URL, a local path becomes absolute."""
  return storage.path(workdir) / name


def _architecture(model: nnx.Module) -> dict:
  """{'model_config': HF config dict, 'scan_layers': bool} of a Qwen3VLModel; {} for other modules."""
  if not hasattr(model, 'config') or not hasattr(model.config, 'to_hf_dict'):
    return {}
  return {'model_config': model.config.to_hf_dict(), 'scan_layers': bool(model.language_model.scan_layers)}


def save(mngr: ocp.CheckpointManager, step: int, model: nnx.Module, optimizer: nnx.Optimizer | None,
         meta: dict, wait: bool = True) -> None:
  """Saves params (and optimizer state when given) at `step`, with JSON `meta`.

  The meta also records the model's architecture (`model_config`, the HF config dict, and `scan_layers`), which
  `export_hf` reads and `restore` names when a checkpoint does not fit.

  Args:
    wait: block until the checkpoint is written (True), or return once the arrays are off the devices and let
      orbax write in the background (False; the trainers wait on their last save).
  """
  meta = {**meta, **_architecture(model)}
  items = {'params': ocp.args.StandardSave(nnx.state(model, nnx.Param)), 'meta': ocp.args.JsonSave(meta)}
  if optimizer is not None:
    items['opt'] = ocp.args.StandardSave(nnx.state(optimizer))
  mngr.save(step, args=ocp.args.Composite(**items))
  if wait:
    mngr.wait_until_finished()


def restore(mngr: ocp.CheckpointManager, model: nnx.Module, optimizer: nnx.Optimizer | None = None,
            step: int | None = None) -> dict | None:
  """Restores the latest (or `step`) checkpoint into `model` (and `optimizer`, when given) in place.

  Args:
    mngr: from `manager`.
    model: live model whose parameter shapes, dtypes and shardings define what is read: a checkpoint written on
      another mesh (or another number of hosts) is resharded onto the model's placement.
    optimizer: live optimizer to restore too; None reads only the params (e.g. GRPO starting from SFT).
    step: which step; None = latest.
  Returns:
    The checkpoint's meta dict (with 'step'), or None when there is no checkpoint.

  Raises:
    ValueError: the checkpoint's `scan_layers` layout differs from the model's; the step cannot be read — damaged
      or its parameters do not fit (`unreadable_step`: naming the step folder and the step kept before it).
  """
  step = mngr.latest_step() if step is None else step
  if step is None:
    return None
  saved = read_meta(mngr, step)
  want = _architecture(model)
  if saved.get('scan_layers', want.get('scan_layers')) != want.get('scan_layers'):
    raise ValueError(f'checkpoint {mngr.directory}/{step} was written with scan_layers={saved["scan_layers"]} but '
                     f'the model has scan_layers={want["scan_layers"]}: set config.model.scan_layers to match')
  abstract = lambda tree: jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
  items = {'params': ocp.args.StandardRestore(abstract(nnx.state(model, nnx.Param))),
           'meta': ocp.args.JsonRestore()}
  if optimizer is not None:
    items['opt'] = ocp.args.StandardRestore(abstract(nnx.state(optimizer)))
  try:
    restored = mngr.restore(step, args=ocp.args.Composite(**items))
  except Exception as e:  # pylint: disable=broad-except  # orbax / tensorstore: KeyError, ValueError, OSError, ...
    raise unreadable_step(mngr, step, e) from e
  nnx.update(model, restored['params'])
  if optimizer is not None:
    nnx.update(optimizer, restored['opt'])
  return {**restored['meta'], 'step': int(step)}


def read_meta(mngr: ocp.CheckpointManager, step: int | None = None) -> dict:
  """The JSON meta of the latest (or `step`) checkpoint, without reading any array; {} when there is none.

  Raises:
    ValueError: the meta cannot be read (`unreadable_step`).
  """
  step = mngr.latest_step() if step is None else step
  if step is None:
    return {}
  try:
    return dict(mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))['meta'])
  except Exception as e:  # pylint: disable=broad-except  # a cut JSON file, a missing item
    raise unreadable_step(mngr, step, e) from e


def unreadable_step(mngr: ocp.CheckpointManager, step: int, error: Exception) -> ValueError:
  """The error of a finished step folder that orbax cannot read: it names the folder, the cause (cut to 300
  characters) and the step kept before it. A damaged step is refused rather than skipped, as orbax and MaxText do:
  a silent fallback would train on and later write that step again over the damaged folder."""
  folder = epath.Path(mngr.directory) / str(step)
  earlier = [s for s in mngr.all_steps() if s < step]
  then = (f'if it is damaged (a file cut short or deleted), move it aside to resume from step {max(earlier)}'
          if earlier else 'no earlier step is kept')
  why = f'{type(error).__name__}: {error}'
  return ValueError(f'checkpoint {folder} cannot be read ({why[:300]}); {then}; if the model differs from the one '
                    'that wrote it, fix config.model')
