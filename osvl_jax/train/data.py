"""The built dataset as the trainers read it: SFT trajectories and RL prompts."""

import pathlib

import ml_collections

from data_pipeline import build as build_lib


def dataset_dir(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> pathlib.Path:
  """`config.data.dir` if set, else `<workdir>/data`."""
  return pathlib.Path(config.data.get('dir') or pathlib.Path(workdir) / 'data')


def _check(path: pathlib.Path) -> pathlib.Path:
  if not path.exists():
    raise FileNotFoundError(f'dataset {path} does not exist; build it with '
                            f'`python -m data_pipeline.build --out_dir={path}` or run `make demo`')
  return path


def load_sft_trajectories(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> list:
  """The expert trajectories (`Trajectory`) of the `sft` split."""
  return build_lib.load_sft(_check(dataset_dir(config, workdir)))


def load_prompts(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> list[dict]:
  """RL prompts: dicts with prompt_id, question, image (uint8 [H, W, 3]), answers."""
  return build_lib.load_prompts(_check(dataset_dir(config, workdir)))
