"""GRPO's runtime faults stop the trainer with an error naming the input, before anything is written where possible
(osvl_jax/train/grpo.py, rollouts.py, preflight.py; osvl_jax/checkpoints): a rollout batch in which every
trajectory ended on an error (an engine answering out-of-vocabulary ids) is no step to take."""

import pathlib
import sys

import ml_collections
import numpy as np
import pytest

from osvl_jax import checkpoints
from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout import factory
from osvl_jax.train import data, grpo, metrics, policy

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / 'configs'))
import demo as demo_config  # noqa: E402

LENGTH_BUCKETS = (64, 128, 256, 512, 1024)


def _config() -> ml_collections.ConfigDict:
  """The demo config on the tiny model, 1 prompt x G = 2 per step, the embedded engine."""
  c = demo_config.get_config()
  c.model.text = ml_collections.ConfigDict()   # Qwen3VLConfig.tiny()
  c.image.min_pixels, c.image.max_pixels = 32 * 32, 64 * 64
  c.tools.enabled = ('text_search',)
  c.rollout.update(max_turns=2, max_new_tokens=8, max_total_tokens=480)
  c.grpo.update(steps=2, prompts_per_step=1, num_generations=2, ckpt_every=1)
  c.grpo.length_buckets, c.grpo.max_loss_tokens, c.grpo.loss_bucket = LENGTH_BUCKETS, 0, 16
  return c


@pytest.fixture
def workdir(tmp_path, monkeypatch):
  """An SFT checkpoint of the tiny model and two prompts with 64x64 images."""
  c = _config()
  checkpoints.save(checkpoints.manager(tmp_path, 'sft_ckpt'), 1,
                   policy.create_model(c, sharding.mesh_from_config(c.mesh), seed=5), None, {'stage': 'sft'})
  rng = np.random.default_rng(0)
  items = [{'prompt_id': f'q{i}', 'question': 'Which city is this?', 'answers': ['Agra'],
            'image': rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)} for i in range(2)]
  monkeypatch.setattr(data, 'load_prompts', lambda config, workdir: items)
  return tmp_path


class _OutOfVocabulary(engine_lib.Engine):
  """An engine whose every turn holds an id past the model's vocabulary (a server serving another model)."""
  weight_updates = 'in_process'

  def set_model(self, model, weight_version=None):
    del model, weight_version

  def generate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
    ids = [9707, tj.VOCAB_SIZE + 5, tj.IM_END_ID]
    return [engine_lib.Generation(np.asarray(ids), np.full(3, -0.5), '', engine_lib.FINISH_STOP) for _ in contexts]


def test_a_step_whose_every_trajectory_failed_stops_the_trainer_naming_the_cause(workdir, monkeypatch):
  monkeypatch.setattr(factory, 'make_engine', lambda *args, **kwargs: _OutOfVocabulary())
  with pytest.raises(RuntimeError, match=r'rollout: all 2 trajectories ended on an error, nothing to train on '
                                         r'\(the step is not taken\); first: engine _OutOfVocabulary failed at '
                                         r'step 0: ValueError: id 151941 at position 1 is outside the vocabulary'):
    grpo.train(_config(), workdir)
  assert metrics.read_metrics(workdir, 'grpo') == []           # no step recorded, no checkpoint
  assert not (workdir / 'grpo_ckpt').exists() or not any((workdir / 'grpo_ckpt').iterdir())
