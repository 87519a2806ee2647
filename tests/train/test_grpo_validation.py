"""Validation during GRPO (`train.validation`, grpo.val_every; verl's test_freq / val_before_train): a tiny run's
'val' records sit at steps 0 (before training), val_every, 2 val_every, ... and the last; their figures are those a
direct evaluation of the same held-out prompts with the same seed gives; validation leaves the training rollouts
unchanged; a resumed run writes each validation once; the demo plots them beside the training curve."""

import pathlib
import shutil
import sys

import ml_collections
import numpy as np
import pytest
from matplotlib import pyplot as plt

from osvl_jax import checkpoints, demo
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.train import curves, data, grpo, metrics, policy, rollouts, validation

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / 'configs'))
import demo as demo_config  # noqa: E402

LENGTH_BUCKETS = (512, 768)
COMPARED = ('mean_reward', 'accuracy', 'r_fmt', 'r_query', 'mean_turns', 'fatal_fraction', 'answered_fraction',
            'judge_errors', 'prompts', 'temperature', 'top_p', 'seed')
TRAINING = ('mean_reward', 'r_fmt', 'mean_turns', 'fatal_fraction', 'unmasked_tokens', 'tool_errors',
            'injected_tool_failures', 'loss')


def _config(steps: int, val_every: int) -> ml_collections.ConfigDict:
  """The demo config on the tiny model: 1 prompt x G = 2 per step, 3 turns of 8 tokens, injected backend errors
  (so fatal cascades happen), 2 held-out prompts, validation sampling 0.7 / 0.95."""
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.model.text = ml_collections.ConfigDict()   # Qwen3VLConfig.tiny()
  c.image.min_pixels, c.image.max_pixels = 32 * 32, 64 * 64
  c.tools.enabled = ('crop',)
  c.tools.failure_injection = {'rate': 0.5, 'kind': 'backend_error', 'seed': 3}
  c.rollout.update(max_turns=3, max_new_tokens=8, max_total_tokens=768, prefix_cache_slots=0)
  c.grpo.update(steps=steps, prompts_per_step=1, num_generations=2, ckpt_every=2, val_every=val_every,
                heldout_prompts=2, lr=0.05, lr_schedule='constant')
  c.grpo.length_buckets, c.grpo.max_loss_tokens, c.grpo.loss_bucket = LENGTH_BUCKETS, 0, 16
  c.eval.temperature, c.eval.top_p = 0.7, 0.95
  return c


PROMPTS = {part: [{'prompt_id': f'{part}{i}', 'question': 'Which city is this?', 'answers': ['Agra'],
                   'image': np.random.default_rng(i + 10 * (part == 'heldout')).integers(0, 256, (64, 64, 3),
                                                                                         dtype=np.uint8)}
                  for i in range(3 if part == 'train' else 2)] for part in data.PARTS}


def _workdir(path: pathlib.Path, monkeypatch) -> pathlib.Path:
  """An SFT checkpoint of the tiny model (seed 5) and the prompts (3 to train on, 2 held out)."""
  c = _config(1, 0)
  checkpoints.save(checkpoints.manager(path, 'sft_ckpt'), 1,
                   policy.create_model(c, sharding.mesh_from_config(c.mesh), seed=5), None, {'stage': 'sft'})
  monkeypatch.setattr(data, 'load_prompts', lambda config, workdir, part='train': PROMPTS[part])
  return path


@pytest.fixture(scope='module')
def validated_run(tmp_path_factory):
  """(workdir, final policy) of a 3-step run validating every 2 steps: validations at 0, 2 and the last, 3;
  checkpoints at 2 and 3."""
  with pytest.MonkeyPatch.context() as monkeypatch:
    workdir = _workdir(tmp_path_factory.mktemp('validated'), monkeypatch)
    model = grpo.train(_config(3, 2), workdir)
  return workdir, model


def _direct(config, model, step: int) -> dict:
  """A validation by hand: a fresh runner on `model`, the held-out prompts, the validation seed of `step`."""
  return validation.evaluate(config, rollouts.RolloutRunner(config, model), PROMPTS['heldout'], None, step)


def test_validation_before_step_1_every_val_every_steps_and_the_last_with_a_direct_evaluations_values(
    validated_run, tmp_path, monkeypatch):
  workdir, model = validated_run
  config = _config(3, 2)
  val = metrics.read_metrics(workdir, 'val')
  assert [r['step'] for r in val] == [0, 2, 3]                # before step 1, every 2 steps, the last
  assert [r['policy_version'] for r in val] == [0, 2, 3]      # the policy published after that many steps
  assert [r['step'] for r in metrics.read_metrics(workdir, 'grpo')] == [1, 2, 3]
  for r in val:
    assert 0.0 <= r['accuracy'] <= 1.0 and 0.0 <= r['fatal_fraction'] <= 1.0 and r['prompts'] == 2
    assert (r['temperature'], r['top_p'], r['seed']) == (0.7, 0.95, validation.SEED_OFFSET + r['step'])
  assert any(r['fatal_fraction'] > 0 for r in val) and any(r['mean_turns'] > 1 for r in val)   # real episodes
  # the same figures as a direct evaluation: of the SFT checkpoint at step 0, of the returned policy at step 3
  sft_model = policy.create_model(config, sharding.mesh_from_config(config.mesh), seed=5)
  for record, direct in ((val[0], _direct(config, sft_model, 0)), (val[2], _direct(config, model, 3))):
    assert {k: record[k] for k in COMPARED} == {k: direct[k] for k in COMPARED}
  # validation takes nothing from the training rollouts: the same run without it logs the same steps (the first
  # two: validation at step 0 sits before step 1's rollout, at step 2 before step 3's)
  plain = _workdir(tmp_path / 'plain', monkeypatch)
  grpo.train(_config(2, 0), plain)
  assert metrics.read_metrics(plain, 'val') == []
  want = [{k: r[k] for k in TRAINING} for r in metrics.read_metrics(plain, 'grpo')]
  assert [{k: r[k] for k in TRAINING} for r in metrics.read_metrics(workdir, 'grpo')[:2]] == want


def test_a_resumed_run_writes_each_validation_once(validated_run, tmp_path, monkeypatch):
  """The 3-step run loses its step-3 checkpoint and is rerun: step 3 is trained and logged again (resumed at 2),
  its validation is not."""
  workdir = tmp_path / 'run'
  shutil.copytree(validated_run[0], workdir)
  _workdir(tmp_path / 'unused', monkeypatch)                   # the prompts
  first = metrics.read_metrics(workdir, 'val')
  shutil.rmtree(workdir / 'grpo_ckpt' / '3')
  grpo.train(_config(3, 2), workdir)
  assert [r['step'] for r in metrics.read_metrics(workdir, 'grpo')] == [1, 2, 3, 3]
  assert metrics.read_metrics(workdir, 'val') == first


def test_due_steps_and_seeds():
  assert [s for s in range(13) if validation.due(s, 5, 12)] == [0, 5, 10, 12]
  assert [s for s in range(11) if validation.due(s, 5, 10)] == [0, 5, 10]
  assert not any(validation.due(s, 0, 10) for s in range(11))
  config = ml_collections.ConfigDict({'seed': 2})
  assert validation.seed(config, 5) == 2 * 100_003 + 50_000 + 5   # apart from step 5's training seed, 200_011


@pytest.mark.parametrize('fields, match', [
    ({'grpo.val_every': -1}, r'grpo.val_every=-1: must be >= 0'),
    ({'grpo.val_every': 5}, r'grpo.val_every=5 validates on held-out RL prompts, but grpo.heldout_prompts=0'),
    ({'grpo.val_every': 5, 'grpo.heldout_prompts': 3, 'eval.top_p': 0.0}, r'eval.top_p=0.0'),
    ({'grpo.val_every': 5, 'grpo.heldout_prompts': 3, 'eval.temperature': -0.1}, r'eval.temperature=-0.1'),
])
def test_check_config_names_the_bad_validation_field(fields, match):
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  for path, value in fields.items():
    section, name = path.split('.')
    c[section][name] = value
  with pytest.raises(ValueError, match=match):
    grpo.check_config(c)


def test_check_config_accepts_validation_on_held_out_prompts():
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.grpo.val_every, c.grpo.heldout_prompts = 5, 3
  grpo.check_config(c)
  assert validation.check_config(c) == 5


def test_the_validation_points_are_plotted_at_their_steps_beside_the_training_curve(tmp_path):
  records = [{'step': s, 'mean_reward': r} for s, r in ((0, 0.1), (5, 0.3), (10, 0.2), (5, 0.4))]   # 5 rewritten
  steps, values = curves.step_points(records, 'mean_reward')
  np.testing.assert_array_equal(steps, [0, 5, 10])
  np.testing.assert_array_equal(values, [0.1, 0.4, 0.2])
  with pytest.raises(KeyError, match="step 0 logged no 'accuracy'"):
    curves.step_points(records, 'accuracy')
  fig, ax = plt.subplots()
  curves.plot_curves({'mask_clamp': [[0.0] * 10]}, None, 'reward', ax=ax, points={'validation': (steps, values)})
  np.testing.assert_array_equal(ax.lines[0].get_xdata(), np.arange(1, 11))   # training: steps 1..10
  np.testing.assert_array_equal(ax.lines[1].get_xdata(), [0, 5, 10])
  np.testing.assert_array_equal(ax.lines[1].get_ydata(), [0.1, 0.4, 0.2])
  plt.close(fig)
  train = [{'step': s, 'mean_reward': 0.5, 'fatal_fraction': 0.0, 'mean_turns': 2.0} for s in range(1, 11)]
  val = [{'step': s, 'mean_reward': 0.2, 'mean_turns': 3.0} for s in (0, 5, 10)]
  line = demo.summary(demo_config.get_config(), {'sft_format_ok': 1.0}, train, tmp_path, val)
  assert line.startswith('demo: sft_format_ok=1.000 grpo_steps=10') and 'grpo_reward_last=0.5000' in line
  assert (tmp_path / 'grpo_reward.png').read_bytes()[:4] == b'\x89PNG'
