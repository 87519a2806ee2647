"""The built dataset as the trainers read it: SFT trajectories and RL prompts (through `osvl_jax.data`), and the
seeded order in which a run draws them (`batch_indices`)."""

import json
import pathlib

import ml_collections
import numpy as np

from osvl_jax import config_checks as checks
from osvl_jax.checkpoints import storage
from osvl_jax.data import pipeline as pipeline_data


def dataset_dir(config: ml_collections.ConfigDict, workdir) -> pathlib.Path:
  """`pipeline.dataset_dir`: `config.data.dir`, else `<workdir>/data`.

  Raises:
    ValueError: the workdir is a cloud URL and `config.data.dir` is unset: datasets are read from local disk
      (a URL must not become a local folder named `gs:`).
  """
  if not config.data.get('dir') and storage.is_remote(workdir):
    raise ValueError(f'workdir {workdir} is a URL: set --config.data.dir to the local dataset folder')
  return pipeline_data.dataset_dir(config, workdir)


def _check(path: pathlib.Path) -> pathlib.Path:
  if not path.exists():
    raise FileNotFoundError(f'dataset {path} does not exist; build it with '
                            f'`{pipeline_data.BUILD_COMMAND} --config.data.dir={path}` or run `make demo`')
  return path


def load_sft_trajectories(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> list:
  """The expert trajectories (`Trajectory`) of the `sft` split."""
  return pipeline_data.load_sft(_check(dataset_dir(config, workdir)))


def build_system_prompt(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> str | None:
  """The instructions the dataset's trajectories were rendered with: its build_config.json's `system_prompt`
  (`trajectory.system_prompt_text`; a build from before the field: 'builder_default'), None for a dataset without
  build_config.json (a converted release carries its own system turns)."""
  from osvl_jax import trajectory as traj_lib  # pylint: disable=g-import-not-at-top
  path = dataset_dir(config, workdir) / 'build_config.json'
  if not path.is_file():
    return None
  return traj_lib.system_prompt_text(json.loads(path.read_text()).get('system_prompt') or traj_lib.BUILDER_DEFAULT)


PARTS = ('train', 'heldout')


def load_prompts(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, part: str = 'train') -> list[dict]:
  """RL prompts (the `rl` split: items with no SFT trajectory): dicts with prompt_id, question, image (uint8
  [H, W, 3]), answers, in the split's order.

  `config.grpo.heldout_prompts` (optional int >= 0, default 0) holds the split's last prompts out of training: `part`
  'train' (what GRPO trains on) is every prompt but those, 'heldout' only those (bench/learning.py evaluates on
  them).

  Raises:
    ValueError: an unknown `part`; an empty `rl` split (naming the folder); grpo.heldout_prompts not an int in
      [0, number of RL prompts) (naming both).
    FileNotFoundError: no dataset or no `rl` split there.
  """
  if part not in PARTS:
    raise ValueError(f'part={part!r}: expected one of {PARTS}')
  folder = _check(dataset_dir(config, workdir))
  prompts = pipeline_data.load_prompts(folder)
  if not prompts:
    raise ValueError(f'{folder}: the `rl` split holds no prompts (every accepted item has an SFT trajectory); build '
                     'more items (data.num_items) or hold some out (data.rl_fraction)')
  held = checks.number(config, 'grpo.heldout_prompts', integer=True, low=0, optional=True) or 0
  if held >= len(prompts):
    raise ValueError(f'grpo.heldout_prompts={held!r}: must be < {len(prompts)} (the dataset has {len(prompts)} RL '
                     'prompts; at least one must stay for training)')
  cut = len(prompts) - held
  return prompts[:cut] if part == 'train' else prompts[cut:]


def batch_indices(step: int, batch_size: int, num_examples: int, seed: int) -> np.ndarray:
  """Example indices of `step`: epochs are seeded permutations, so a resumed run sees the same order (SFT's
  trajectories; GRPO's prompts with seed + 1)."""
  flat = np.arange(step * batch_size, (step + 1) * batch_size)
  epochs, offsets = np.divmod(flat, num_examples)
  return np.array([np.random.default_rng([seed, e]).permutation(num_examples)[o] for e, o in zip(epochs, offsets)])
