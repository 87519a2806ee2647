"""JaxSampler + agent loop + real ToolEnv on a tiny random Qwen3-VL: the trainer's view of a trajectory (one full
forward over its token_ids and images) reproduces the log-probs the sampler reported turn by turn."""

import jax
import numpy as np
import pytest
from flax import nnx

from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.rollout import agent_loop
from osvl_jax.rollout.embedded import jax_sampler
from tools import env as tools_env


@pytest.fixture(scope='module')
def rollout():
  tokenizer = tj.load_tokenizer()
  model = model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(0))
  env = tools_env.ToolEnv({'enabled': ('crop', 'sharpen')})
  processor = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
  sampler = jax_sampler.JaxSampler(model, tokenizer, max_new_tokens=8, temperature=1.0, top_p=0.95, seed=0,
                                   max_len=2048, bucket=128)
  image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
  items = [{'prompt_id': f'q{k}', 'question': f'Where is building {k}?', 'image': image, 'answers': ['x']}
           for k in range(2)]
  turns = []
  trajs = agent_loop.run_episodes(sampler, env, lambda: tj.TrajectoryBuilder(tokenizer, processor, env.schemas()),
                                  items, num_generations=2, max_turns=4, fatal_k=3, log_fn=turns.append)
  return model, trajs, turns


def test_random_policy_output_is_malformed_until_fatal(rollout):
  _, trajs, turns = rollout
  assert [(t.prompt_id, t.sample_index) for t in trajs] == [('q0', 0), ('q0', 1), ('q1', 0), ('q1', 1)]
  assert [r['active'] for r in turns] == [4, 4, 4]  # one batched generate per turn, then all fatal
  for t in trajs:
    assert tj.check_trajectory(t) == []
    assert [s.result.error_kind for s in t.steps] == ['malformed_call'] * 3
    assert t.fatal_step == 0 and t.final_response is None


def test_trainer_forward_reproduces_rollout_logprobs(rollout):
  model, trajs, _ = rollout
  t = trajs[0]
  ids = t.token_ids[None]
  pos, _ = rope.get_rope_index(ids, t.image_grid_thw)
  hidden, _ = model(ids, pos, None, t.pixel_values, t.image_grid_thw)
  logp = jax.nn.log_softmax(model.logits(hidden)[0, :-1])
  targets = np.flatnonzero(t.gen_mask)
  recomputed = np.asarray(logp[targets - 1, t.token_ids[targets]])
  np.testing.assert_allclose(t.rollout_logprobs[targets], recomputed, atol=2e-4)
  assert np.all(t.rollout_logprobs[~t.gen_mask] == 0)
