"""The embedded rollout engine's prefix cache (`rollout.prefix_cache_slots`, osvl_jax/train/rollouts.py): each turn
of an episode re-sends its whole context, and with slots the sampler prefills only what follows the prefix an
earlier turn computed. Greedy rollouts of the tiny Qwen3-VL with and without the cache are the same episodes (ids
equal, log-probs to float32 rounding), the cached run reuses prompt tokens on the later turns, and a negative slot
count is refused naming the field."""

import pathlib
import sys

import numpy as np
import pytest
from flax import nnx

from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.train import rollouts

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / 'configs'))
import demo as demo_config  # noqa: E402


def _config(slots: int):
  c = demo_config.get_config()
  c.model.vocab = 'full'   # the tests' datasets list no vocab_ids.json
  c.model.hf_path = ''
  c.tools.enabled = ('crop',)
  c.rollout.update(max_turns=3, max_new_tokens=12, prefix_cache_slots=slots)
  return c


def _rollout(model, slots: int):
  runner = rollouts.RolloutRunner(_config(slots), model)
  cached = []
  generate = runner.engine.generate

  def counting(*args, **kwargs):
    out = generate(*args, **kwargs)
    cached.append(sum(runner.engine.cached_tokens))
    return out

  runner.engine.generate = counting
  rng = np.random.default_rng(0)
  items = [{'prompt_id': f'q{i}', 'question': 'Which city is this?', 'answers': ['Agra'],
            'image': rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)} for i in range(2)]
  return runner, runner.run(items, 1, 0.0, 1.0, 0), cached


def test_cached_rollouts_are_the_uncached_episodes_and_reuse_the_earlier_turns():
  model = model_lib.Qwen3VLModel(config_lib.Qwen3VLConfig.tiny(), rngs=nnx.Rngs(0))
  plain_runner, plain, plain_cached = _rollout(model, 0)
  runner, cached_run, cached = _rollout(model, 8)
  assert plain_runner.engine.prefix_cache is None and runner.engine.prefix_cache is not None
  assert max(len(t.steps) for t in plain) >= 2, [len(t.steps) for t in plain]   # later turns exist to reuse
  for a, b in zip(plain, cached_run):
    assert np.asarray(b.token_ids).tolist() == np.asarray(a.token_ids).tolist()
    np.testing.assert_allclose(np.asarray(b.rollout_logprobs, np.float64), np.asarray(a.rollout_logprobs),
                               atol=1e-4)
  assert sum(plain_cached) == 0 and cached[0] == 0   # nothing to reuse on the first call
  assert sum(cached[1:]) > 0, cached


def test_a_negative_slot_count_is_refused_naming_the_field():
  c = _config(0)
  rollouts.check_engine_config(c)
  c.rollout.prefix_cache_slots = -1
  with pytest.raises(ValueError, match='rollout.prefix_cache_slots'):
    rollouts.check_engine_config(c)
