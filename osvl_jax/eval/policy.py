"""The evaluated policy: where it comes from (`policy_identity`, read without building it), and loading it.

  config.checkpoint ''      the tiny random model of `config.model` (or `config.model.hf_path`), seed `config.seed`
  config.checkpoint PATH    a `*_ckpt` folder, or a workdir holding grpo_ckpt / sft_ckpt (its latest step)

`policy_identity` is part of the eval fingerprint (`eval.results`): a checkpoint is named by its folder, step,
the sha256 of its metadata and the modification time of its step folder, so a retrained or replaced checkpoint at
the same path is another policy.
"""

import hashlib
import json
import os
import pathlib

import ml_collections


def train_settings(train_data: str | os.PathLike) -> dict:
  """The build settings (`build_config.json`) of the dataset folder `train_data`; {} when `train_data` is ''.

  Raises:
    FileNotFoundError: naming `train_data` when it has no build_config.json (not a pipeline dataset folder).
  """
  if not train_data:
    return {}
  path = pathlib.Path(train_data) / 'build_config.json'
  if not path.is_file():
    raise FileNotFoundError(f'train_data={train_data}: no build_config.json there (expected the dataset folder '
                            'the policy was trained on, e.g. <workdir>/data)')
  return json.loads(path.read_text())


CHECKPOINT = 'checkpoint'   # config.system_prompt: the checkpoint's own (its meta), the default
HF_SYSTEM_PROMPT = 'agent_system_v3'   # ... for a policy with no checkpoint meta (an HF folder): the paper's


def _open(config: ml_collections.ConfigDict, step: int | None = None):
  """(checkpoint folder, step (default: the latest), meta) of `config.checkpoint`: a `*_ckpt` folder, one step of
  it, or a workdir holding grpo_ckpt / sft_ckpt (`checkpoints.resolve`).

  Raises:
    FileNotFoundError: no checkpoint there.
  """
  from osvl_jax import checkpoints  # pylint: disable=g-import-not-at-top
  folder, step = checkpoints.resolve(None, str(config.checkpoint), step)
  folder = pathlib.Path(str(folder)).resolve()
  return folder, step, checkpoints.read_meta(checkpoints.manager(folder.parent, folder.name), step)


def system_prompt(config: ml_collections.ConfigDict) -> tuple[str, str]:
  """(name, text) of the agent's system prompt for the tool modes: `config.system_prompt` resolved by
  `trajectory.system_prompt_text`, or for 'checkpoint' (the default) the one the checkpoint was trained with (its
  meta's `system_prompt`; a checkpoint from before it was recorded: 'builder_default', what those were trained on)
  and, for an HF folder (`model.hf_path`), `HF_SYSTEM_PROMPT` (the paper's agent prompt).

  Raises:
    ValueError: an unknown prompt name (`trajectory.system_prompt_text`).
  """
  from osvl_jax import trajectory as traj_lib  # pylint: disable=g-import-not-at-top
  spec = config.get('system_prompt') or CHECKPOINT
  if spec != CHECKPOINT:
    return spec, traj_lib.system_prompt_text(spec)
  if not config.get('checkpoint'):
    return HF_SYSTEM_PROMPT, traj_lib.system_prompt_text(HF_SYSTEM_PROMPT)
  meta = _open(config)[2]
  recorded = (meta or {}).get('system_prompt') or {}
  name = recorded.get('name') or traj_lib.BUILDER_DEFAULT
  return f'{CHECKPOINT}:{name}', recorded.get('text') or traj_lib.system_prompt_text(name)


def policy_identity(config: ml_collections.ConfigDict) -> dict:
  """What the policy of `config` is, as JSON values, without building it (module docstring).

  Returns:
    {'checkpoint', 'step', 'meta_sha256', 'mtime_ns'} for a checkpoint; {'hf_path', 'files': {name: [bytes,
    mtime_ns]}} for an HF folder (its *.json and *.safetensors); {'model', 'seed'} for a random init.
  Raises:
    FileNotFoundError: a checkpoint path without a checkpoint.
  """
  if config.get('checkpoint'):
    folder, step, meta = _open(config)
    blob = json.dumps(meta, sort_keys=True, default=str).encode('utf-8')
    step_dir = folder / str(step)
    return {'checkpoint': str(folder), 'step': step, 'meta_sha256': hashlib.sha256(blob).hexdigest(),
            'mtime_ns': step_dir.stat().st_mtime_ns if step_dir.exists() else None}
  hf_path = config.model.get('hf_path')
  if hf_path:
    folder = pathlib.Path(hf_path)
    if not folder.is_dir():
      return {'hf_path': str(hf_path)}
    files = sorted(p for p in folder.iterdir() if p.suffix in ('.json', '.safetensors') and p.is_file())
    return {'hf_path': str(folder.resolve()),
            'files': {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in files}}
  return {'model': config.model.to_dict(), 'seed': int(config.seed)}


def shape(config: ml_collections.ConfigDict, step: int | None = None):
  """The evaluated policy (`build`'s) abstract (`nnx.eval_shape`: shapes and dtypes, no weight read): what the
  rollout layout is sized from before the weights are placed (`rollout.factory.rollout_mesh`).

  Raises:
    FileNotFoundError: a checkpoint path without a checkpoint.
  """
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from osvl_jax import checkpoints  # pylint: disable=g-import-not-at-top
  if config.get('checkpoint'):
    folder, step, _ = _open(config, step)
    return checkpoints.policy_shape(str(folder), step=step)
  if config.model.get('hf_path'):
    return checkpoints.policy_shape(config.model.hf_path, scan_layers=bool(config.model.get('scan_layers', False)),
                                    **checkpoints.model_dtypes(config))
  return nnx.eval_shape(lambda: checkpoints.build_model(config, seed=config.seed))


def build(config: ml_collections.ConfigDict, step: int | None = None, mesh=None):
  """(model, description) of the evaluated policy: `config.checkpoint` restored at `step` (default: the latest; the
  evaluator passes the step its fingerprint names, so a checkpoint written meanwhile is not evaluated under it;
  `checkpoints.load_policy`), else `config.model` (`checkpoints.build_model`: an HF folder or the random tiny one).
  With `mesh` (the rollout mesh, `rollout.factory.rollout_mesh`), a checkpoint or an HF folder is read straight
  into the rollout layout's shardings (`layout.DECODE_RULES`), with no whole copy of the model; the tiny model is
  built on one device (the sampler reshards it).

  Raises:
    FileNotFoundError: a checkpoint path without a checkpoint.
    ValueError: a checkpoint that does not fit its recorded architecture.
  """
  from osvl_jax import checkpoints  # pylint: disable=g-import-not-at-top
  from osvl_jax.rollout.embedded import layout  # pylint: disable=g-import-not-at-top
  if not config.get('checkpoint'):
    model = checkpoints.build_model(config, seed=config.seed, mesh=mesh, rules=layout.DECODE_RULES)
    return model, (f'hf:{config.model.hf_path}' if config.model.get('hf_path') else
                   f'{config.model.name} (random init, seed {config.seed})')
  folder, step, _ = _open(config, step)
  model, meta = checkpoints.load_policy(str(folder), step=step, mesh=mesh, rules=layout.DECODE_RULES)
  return model, f'{folder} step {meta["step"]}'
