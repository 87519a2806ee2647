"""Table 5's two budgets in the GRPO trainer (rollout.max_prompt_tokens, rollout.max_response_tokens): a prompt over
its budget is refused in the rollout and its group dropped from the update and counted (verl filters overlong
prompts out of its dataset); the response budget bounds the loss positions the update needs; the config checks name
the fields."""

import pathlib
import pickle
import sys

import ml_collections
import numpy as np
import pytest

from osvl_jax import checkpoints
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.train import data, grpo, metrics, policy

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / 'configs'))
import demo as demo_config  # noqa: E402

IMAGE = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
PROMPTS = [{'prompt_id': 'short', 'question': 'Which city is this?', 'answers': ['Agra'], 'image': IMAGE},
           {'prompt_id': 'long', 'question': 'Which city is this? ' * 40, 'answers': ['Agra'], 'image': IMAGE}]


def _config() -> ml_collections.ConfigDict:
  """The demo config on the tiny model; 2 prompts x G = 2 per step; 3 turns of 8 tokens; a prompt budget between
  the short prompt's and the long one's, a response budget of 200 tokens."""
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.model.text = ml_collections.ConfigDict()   # Qwen3VLConfig.tiny()
  c.image.min_pixels, c.image.max_pixels = 32 * 32, 64 * 64
  c.tools.enabled = ('crop',)
  c.rollout.update(max_turns=3, max_new_tokens=8, max_total_tokens=768, max_prompt_tokens=400,
                   max_response_tokens=200, prefix_cache_slots=0)
  c.grpo.update(steps=1, prompts_per_step=2, num_generations=2, ckpt_every=1)
  c.grpo.length_buckets, c.grpo.max_loss_tokens, c.grpo.loss_bucket = (512, 768), 0, 16
  return c


def test_a_prompt_over_its_budget_is_dropped_from_the_update_and_counted(tmp_path, monkeypatch):
  c = _config()
  checkpoints.save(checkpoints.manager(tmp_path, 'sft_ckpt'), 1,
                   policy.create_model(c, sharding.mesh_from_config(c.mesh), seed=5), None, {'stage': 'sft'})
  monkeypatch.setattr(data, 'load_prompts', lambda config, workdir, part='train': PROMPTS)
  c.grpo.dump_rollouts = True
  c.rollout.env_errors = 'exclude'   # the trainer's path of rollout.env_errors='exclude' (test_env_errors_update.py)
  grpo.train(c, tmp_path)
  (record,) = metrics.read_metrics(tmp_path, 'grpo')
  assert record['prompts_over_budget'] == 1
  assert record['num_excluded'] == record['env_cut_trajectories'] == 0 and record['env_errors'] == 0  # no backend
  batch = pickle.loads((tmp_path / 'rollouts' / '00000001.pkl').read_bytes())
  trajectories = batch['trajectories']
  assert [t.prompt_id for t in trajectories] == ['short', 'short']   # the long prompt's group is gone
  for t in trajectories:
    prompt = int(np.sum(t.step_of_token == -1))
    assert prompt <= 400 and t.num_tokens - prompt <= 200            # both budgets hold
  assert record['mean_turns'] == pytest.approx(np.mean([len(t.steps) for t in trajectories]))


def test_the_response_budget_bounds_the_loss_positions_the_update_needs():
  c = demo_config.get_config()    # 10 turns x 128 new tokens, T = 4096: K >= 1280 without a response budget
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.grpo.max_loss_tokens = 1024
  with pytest.raises(ValueError, match=r'grpo.max_loss_tokens=1024 is below .* = 1280'):
    grpo.check_config(c)
  c.rollout.max_response_tokens = 1000   # what a rollout can emit is now at most 1000 tokens
  grpo.check_config(c)
  c.grpo.max_loss_tokens = 999
  with pytest.raises(ValueError, match=r'max_response_tokens, max_turns x max_new_tokens\) = 1000; set it to 1000'):
    grpo.check_config(c)


@pytest.mark.parametrize('fields, match', [
    ({'max_prompt_tokens': 3000, 'max_response_tokens': 2000},
     r'rollout.max_total_tokens=4096 < rollout.max_prompt_tokens=3000 \+ rollout.max_response_tokens=2000: '
     r'.*set it to 5000'),
    ({'max_prompt_tokens': -1}, r'rollout.max_prompt_tokens=-1: must be >= 0'),
    ({'max_response_tokens': -5}, r'rollout.max_response_tokens=-5: must be >= 0'),
])
def test_check_config_names_the_bad_budget(fields, match):
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.rollout.update(fields)
  with pytest.raises(ValueError, match=match):
    grpo.check_config(c)
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.rollout.update(max_prompt_tokens=1000, max_response_tokens=3096)   # the neighbour: both fit T = 4096
  grpo.check_config(c)
