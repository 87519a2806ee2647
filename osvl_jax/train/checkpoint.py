"""Orbax checkpoints of (model params, optimizer state, step, metadata) in `<workdir>/<name>/`."""

import pathlib

import jax
import orbax.checkpoint as ocp
from flax import nnx


def manager(workdir: str | pathlib.Path, name: str, max_to_keep: int = 2) -> ocp.CheckpointManager:
  """A CheckpointManager writing `<workdir>/<name>/<step>/`."""
  path = pathlib.Path(workdir).resolve() / name
  return ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))


def save(mngr: ocp.CheckpointManager, step: int, model: nnx.Module, optimizer: nnx.Optimizer | None,
         meta: dict) -> None:
  """Saves params (and optimizer state when given) at `step`, with JSON `meta`; blocks until written."""
  items = {'params': ocp.args.StandardSave(nnx.state(model, nnx.Param)), 'meta': ocp.args.JsonSave(meta)}
  if optimizer is not None:
    items['opt'] = ocp.args.StandardSave(nnx.state(optimizer))
  mngr.save(step, args=ocp.args.Composite(**items))
  mngr.wait_until_finished()


def restore(mngr: ocp.CheckpointManager, model: nnx.Module, optimizer: nnx.Optimizer | None = None,
            step: int | None = None) -> dict | None:
  """Restores the latest (or `step`) checkpoint into `model` (and `optimizer`, when given) in place.

  Args:
    mngr: from `manager`.
    model: live model whose parameter shapes define what is read.
    optimizer: live optimizer to restore too; None reads only the params (e.g. GRPO starting from SFT).
    step: which step; None = latest.
  Returns:
    The checkpoint's meta dict (with 'step'), or None when there is no checkpoint.
  """
  step = mngr.latest_step() if step is None else step
  if step is None:
    return None
  abstract = lambda tree: jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
  items = {'params': ocp.args.StandardRestore(abstract(nnx.state(model, nnx.Param))),
           'meta': ocp.args.JsonRestore()}
  if optimizer is not None:
    items['opt'] = ocp.args.StandardRestore(abstract(nnx.state(optimizer)))
  restored = mngr.restore(step, args=ocp.args.Composite(**items))
  nnx.update(model, restored['params'])
  if optimizer is not None:
    nnx.update(optimizer, restored['opt'])
  return {**restored['meta'], 'step': int(step)}
