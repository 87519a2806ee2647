"""Which checkpoint a name or path means, and the architecture it records.

A checkpoint reference (`resolve`) is one of: 'latest' (the latest step of `<workdir>/grpo_ckpt`, else of
`<workdir>/sft_ckpt`), 'sft', 'grpo' (that folder of the workdir); a checkpoint folder (`.../sft_ckpt`), one step
of it (`.../sft_ckpt/150`, whose name gives the step), or a workdir holding grpo_ckpt / sft_ckpt (as 'latest').
Paths may be cloud URLs (`storage.path`).
"""

import json
import os
import pathlib

from etils import epath

from osvl_jax.checkpoints import storage, store

CHECKPOINT_DIRS = ('grpo_ckpt', 'sft_ckpt')   # in order of preference for 'latest'
CHECKPOINT_CHOICES = {'latest': CHECKPOINT_DIRS, 'grpo': ('grpo_ckpt',), 'sft': ('sft_ckpt',)}


def read_config(hf_config: str | pathlib.Path | None, meta: dict | None = None):
  """The model architecture (`Qwen3VLConfig`): from a config.json (or a folder containing one), else the checkpoint
  meta's `model_config`, else `Qwen3VLConfig.tiny()`."""
  from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig  # pylint: disable=g-import-not-at-top
  if not hf_config:
    if meta and meta.get('model_config'):
      return Qwen3VLConfig.from_hf_dict(meta['model_config'])
    return Qwen3VLConfig.tiny()
  path = pathlib.Path(hf_config)
  path = path / 'config.json' if path.is_dir() else path
  return Qwen3VLConfig.from_hf_dict(json.loads(path.read_text()))


def resolve(workdir: str | os.PathLike | None, checkpoint: str = 'latest',
            step: int | None = None) -> tuple[epath.Path, int]:
  """(checkpoint folder, step) of a checkpoint reference (module docstring).

  Args:
    workdir: the job folder (needed for 'latest' / 'sft' / 'grpo'); a local path or a cloud URL.
    checkpoint: a name or a path / URL (module docstring).
    step: the step; None = the latest of the folder (or the step folder's).
  Returns:
    (folder holding the step folders, step).
  Raises:
    FileNotFoundError: no such checkpoint folder / no checkpoint in it / no such step.
    ValueError: no workdir for a named choice, or a step folder path together with another `step`.
  """
  if checkpoint in CHECKPOINT_CHOICES:
    if not workdir:
      raise ValueError(f'--checkpoint={checkpoint} needs --workdir')
    candidates = [storage.path(workdir) / name for name in CHECKPOINT_CHOICES[checkpoint]]
  else:
    path = storage.path(checkpoint)
    if not path.is_dir():
      raise FileNotFoundError(f'--checkpoint={checkpoint}: no such checkpoint folder')
    if path.name.isdigit():   # one step folder of a checkpoint folder
      if step is not None and step != int(path.name):
        raise ValueError(f'--checkpoint={checkpoint} is step {path.name}, but --step={step}')
      step, path = int(path.name), path.parent
    if not path.name.endswith('_ckpt') and any((path / name).is_dir() for name in CHECKPOINT_DIRS):
      candidates = [path / name for name in CHECKPOINT_DIRS]   # a workdir: its latest
    else:
      candidates = [path]
  for folder in candidates:
    if not folder.is_dir():
      continue
    steps = store.manager(folder.parent, folder.name).all_steps()
    if not steps:
      continue
    if step is None:
      return folder, int(max(steps))
    if step not in steps:
      raise FileNotFoundError(f'{folder} has no step {step}; it has {sorted(int(s) for s in steps)}')
    return folder, int(step)
  raise FileNotFoundError(f'no checkpoint in {", ".join(str(c) for c in candidates)}')


def latest(workdir: str | os.PathLike) -> tuple[str, int]:
  """(checkpoint dir name, step) of 'latest': the latest step of `grpo_ckpt`, else of `sft_ckpt`.

  Raises:
    FileNotFoundError: when neither holds a checkpoint.
  """
  folder, step = resolve(workdir, 'latest')
  return folder.name, step
