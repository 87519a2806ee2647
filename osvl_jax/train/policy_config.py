"""What both trainers hold the same of a run's policy: its config checks (seed, model, mesh, sharding rules,
dtypes, system prompt, image processor budget), the one system prompt of a run, and what a checkpoint records of
them beside the weights (`checkpoint_meta`: evaluation and export read it back)."""

import ml_collections

from osvl_jax import checkpoints
from osvl_jax import config_checks as checks
from osvl_jax import trajectory as traj_lib
from osvl_jax.models.qwen3_vl import sharding


def check_model_config(config: ml_collections.ConfigDict) -> None:
  """Checks what every trainer shares: seed, model choice, mesh, the policy's image processor budget.

  Builds no mesh: the mesh is checked by its shape on this job's devices (`sharding.mesh_shape_from_config`).

  Raises:
    ValueError: naming the field: a non-int seed, an unknown model.name without model.hf_path, a `mesh.<axis>`
      that does not fit the devices (`sharding.mesh_sizes`), a malformed `sharding_rules` entry, a
      model.dtype / param_dtype outside `checkpoints.DTYPES`, a model.vocab `checkpoints.vocab_ids` refuses
      (its file read now unless it is the workdir's dataset's), an unknown system_prompt, image pixel
      limits that are not ints >= 1 with min <= max, or data.min_pixels / max_pixels (the budget the dataset's
      trajectories were rendered with) differing from image.min_pixels / max_pixels.
  """
  checks.number(config, 'seed', integer=True)
  traj_lib.system_prompt_text(config.get('system_prompt'))   # ValueError naming it
  sharding.mesh_shape_from_config(config.get('mesh'))
  sharding.rules_from_config(config)
  checkpoints.model_dtypes(config)
  if checks.get(config, 'model.vocab') != 'dataset' or checks.get(config, 'data.dir'):
    checkpoints.vocab_ids(config)   # 'dataset' under the workdir: checked when the model is built
  if not checks.get(config, 'model.hf_path') and checks.get(config, 'model.name') != 'tiny':
    raise ValueError(f"model.name={checks.get(config, 'model.name')!r}: only 'tiny' is built in; set model.hf_path")
  limits = checks.pixel_limits(config, 'image')
  if checks.get(config, 'data.min_pixels') is not None:
    data_limits = checks.pixel_limits(config, 'data')
    if data_limits != limits:
      raise ValueError(f'data.min_pixels/max_pixels={data_limits} differ from image.min_pixels/max_pixels={limits}: '
                       "the dataset's image tokens must come from the policy's image processor")


def batch_shards(config: ml_collections.ConfigDict) -> int:
  """The data x fsdp pieces the rows of a step split into on `config.mesh` (by its shape: no mesh is built)."""
  return sharding.batch_shards(sharding.mesh_shape_from_config(config.get('mesh')), sharding.rules_from_config(config))


def checkpoint_meta(config: ml_collections.ConfigDict) -> dict:
  """What a checkpoint records of the config beside the architecture: the policy's image processor budget and the
  agent's system prompt (`system_prompt`: {name, text}; evaluation uses it by default)."""
  spec = config.get('system_prompt') or traj_lib.BUILDER_DEFAULT
  return {'image_processor': {'min_pixels': int(config.image.min_pixels), 'max_pixels': int(config.image.max_pixels)},
          'system_prompt': {'name': spec, 'text': traj_lib.system_prompt_text(spec)}}


def check_system_prompt(config: ml_collections.ConfigDict, text: str, source: str) -> None:
  """One system prompt per run: `text` (what `source` was made with: the dataset's trajectories, the SFT
  checkpoint) must be the instructions of `config.system_prompt` (`trajectory.system_prompt_text`).

  Raises:
    ValueError: naming config.system_prompt, the source and the start of both texts.
  """
  spec = config.get('system_prompt') or traj_lib.BUILDER_DEFAULT
  want = traj_lib.system_prompt_text(spec)
  if text != want:
    raise ValueError(f'config.system_prompt={spec!r} ({want[:60]!r}...) is not the system prompt {source} was made '
                     f'with ({text[:60]!r}...): one system prompt per run; set --config.system_prompt to that one')
