"""The update's forward (`batching.collate` -> `policy.loss_logprobs`) reproduces the log-probs the JaxSampler
reported for a turn that came after two tool-returned images: same ids, same pixels, same 3-D positions, and the
same temperature (the sampler reports log_softmax(logits / T), the trainer recomputes it at grpo.temperature)."""

import dataclasses

import numpy as np
import pytest
from flax import nnx

from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.rollout import agent_loop
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.rollout.embedded import jax_sampler
from osvl_jax.train import batching
from osvl_jax.train import grpo_update
from osvl_jax.train import placement
from tools import env as tools_env

SCRIPT = [
    tj.render_assistant_text('Zoom in.', tool_call={'name': 'crop', 'arguments': {
        'image': 'img_1', 'x': 8, 'y': 0, 'width': 56, 'height': 40}}),
    tj.render_assistant_text('Sharpen.', tool_call={'name': 'sharpen', 'arguments': {'image': 'img_2'}}),
]


class ScriptThenSample(engine_lib.Engine):
  """Steps 0-1 from the script (tool calls returning images), later steps sampled by the model."""

  def __init__(self, scripted, sampler, tokenizer):
    self.scripted, self.sampler, self.tokenizer = scripted, sampler, tokenizer

  def generate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
    contexts = [engine_lib.as_context(c) for c in contexts]
    if engine_lib.count_assistant_turns(contexts[0].prompt_ids, self.tokenizer) < len(SCRIPT):
      return self.scripted.generate(contexts, max_new_tokens, stop, sampling)
    return self.sampler.generate(contexts, max_new_tokens, stop, sampling)


@pytest.mark.parametrize('temperature', [1.0, 0.7])
def test_loss_logprobs_of_the_collated_batch_equal_the_samplers(temperature):
  tokenizer = tj.load_tokenizer()
  model = model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(0))
  env = tools_env.ToolEnv({'enabled': ('crop', 'sharpen')})
  processor = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
  sampler = jax_sampler.JaxSampler(model, tokenizer, max_new_tokens=1, temperature=temperature, seed=0, max_len=1024,
                                   bucket=64, pad_batch_pow2=False)
  engine = ScriptThenSample(engine_lib.ScriptedEngine(SCRIPT, tokenizer), sampler, tokenizer)
  image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
  item = {'prompt_id': 'q0', 'question': 'Where is this?', 'image': image, 'answers': ['x']}
  (traj,) = agent_loop.run_episodes(engine, env, lambda: tj.TrajectoryBuilder(tokenizer, processor, env.schemas()),
                                    [item], max_turns=3)
  assert len(traj.images) == 3 and len(traj.steps) == 3 and traj.stop_reason == 'max_turns'
  batch = batching.collate([traj], length_multiple=64, loss_multiple=16)
  # as the trainer calls it: images laid out per shard with their geometry as arrays (grpo_update.default_place)
  device = placement.device_batch(grpo_update.default_place(model.config.vision)(batch))
  logprobs = np.asarray(grpo_update.logprob_fn(model, device, np.float32(temperature)))[0]
  sampled = batch['completion_mask'][0] & (batch['loss_step'][0] == 2)
  assert sampled.sum() == 1
  np.testing.assert_allclose(logprobs[sampled], batch['rollout_logprobs'][0][sampled], atol=2e-4)
  if temperature != 1.0:   # the untempered recomputation is off by far more (a trainer at T = 1 fails here)
    untempered = np.asarray(grpo_update.logprob_fn(model, device))[0]
    assert abs(untempered[sampled] - batch['rollout_logprobs'][0][sampled]).max() > 1e-2


class ImageBlind(engine_lib.Engine):
  """An engine that drops what the images show (each image's patches zeroed; ids and grids kept), as an engine whose
  multimodal inputs were lost would: it samples from another policy than the one the trainer scores."""

  def __init__(self, engine):
    self.engine = engine

  def generate(self, contexts, max_new_tokens=None, stop=None, sampling=None):
    blind = [engine_lib.Context(c.prompt_ids, [dataclasses.replace(im, pixel_values=np.zeros_like(im.pixel_values))
                                               for im in c.images])
             for c in map(engine_lib.as_context, contexts)]
    return self.engine.generate(blind, max_new_tokens, stop, sampling)


def test_the_mismatch_alarm_stops_an_image_blind_rollout_and_passes_a_healthy_one():
  """`grpo.max_logprob_mismatch`: the trainer's log-probs of the sampled tokens against the engine's. A healthy
  rollout agrees to float32 rounding (<= 2e-4 per token, above); an engine that did not see the images disagrees by
  what the images change in the model's predictions, and the update stops before any optimizer step."""
  tokenizer = tj.load_tokenizer()
  model = model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(0))
  env = tools_env.ToolEnv({'enabled': ('crop', 'sharpen')})
  processor = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
  image = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
  item = {'prompt_id': 'q0', 'question': 'Where is this?', 'image': image, 'answers': ['x']}
  figures = {}
  for name in ('healthy', 'blind'):
    sampler = jax_sampler.JaxSampler(model, tokenizer, max_new_tokens=8, temperature=1.0, seed=0, max_len=1024,
                                     bucket=64, pad_batch_pow2=False)
    engine = ScriptThenSample(engine_lib.ScriptedEngine(SCRIPT, tokenizer),
                              sampler if name == 'healthy' else ImageBlind(sampler), tokenizer)
    (traj,) = agent_loop.run_episodes(engine, env, lambda: tj.TrajectoryBuilder(tokenizer, processor, env.schemas()),
                                      [item], max_turns=3)
    batch = batching.collate([traj], length_multiple=64, loss_multiple=16)
    device = placement.device_batch(grpo_update.default_place(model.config.vision)(batch))
    old = np.asarray(grpo_update.logprob_fn(model, device, np.float32(1.0)))
    sampled = (batch['completion_mask'] & (batch['loss_step'] == 2)).astype(np.float32)  # the sampled turn
    figures[name] = grpo_update.mismatch_metrics(old, batch['rollout_logprobs'], np.array([True]), sampled)
  healthy, blind = (figures[k]['logprob_mismatch_abs_mean'] for k in ('healthy', 'blind'))
  assert figures['blind']['logprob_mismatch_tokens'] >= 1 and healthy <= 2e-4, figures
  threshold = 1e-3
  assert blind > 10 * threshold, figures  # what the images change, far above the threshold
  grpo_update.check_mismatch(figures['healthy'], threshold)
  with pytest.raises(grpo_update.MismatchAlarm, match=r'logprob_mismatch_abs_mean=.* exceeds '
                                                      r'grpo.max_logprob_mismatch=0.001'):
    grpo_update.check_mismatch(figures['blind'], threshold)
  grpo_update.check_mismatch(figures['blind'], None)  # off
