"""Rollouts with the embedded JAX sampler against the real tool environment, and their rewards (Eq. 9)."""

import ml_collections
import numpy as np

from osvl_jax import trajectory as trajectory_lib
from osvl_jax.judges import rule
from osvl_jax.rl import rewards
from osvl_jax.rollout import agent_loop, jax_sampler
from tools import registry


def image_processor(config: ml_collections.ConfigDict) -> trajectory_lib.ImageProcessor:
  return trajectory_lib.ImageProcessor(min_pixels=config.image.min_pixels, max_pixels=config.image.max_pixels)


def tool_env(config: ml_collections.ConfigDict) -> registry.ToolEnv:
  return registry.ToolEnv(config.get('tools'))


class RolloutRunner:
  """Owns the tokenizer, image processor, tools and sampler for one policy.

  Args:
    config: the job config (`image`, `tools`, `rollout` fields).
    model: the live policy; updates to it in place are seen by the next `run`.
  """

  def __init__(self, config: ml_collections.ConfigDict, model):
    self.config = config
    self.tokenizer = trajectory_lib.load_tokenizer()
    self.image_processor = image_processor(config)
    self.env = tool_env(config)
    r = config.rollout
    self.sampler = jax_sampler.JaxSampler(model, self.tokenizer, self.image_processor,
                                          max_new_tokens=r.max_new_tokens,
                                          max_len=r.max_total_tokens + r.max_new_tokens)
    self.model = model

  def make_builder(self) -> trajectory_lib.TrajectoryBuilder:
    return trajectory_lib.TrajectoryBuilder(self.tokenizer, self.image_processor, self.env.schemas())

  def run(self, items: list[dict], num_generations: int, temperature: float, top_p: float,
          seed: int) -> list[trajectory_lib.Trajectory]:
    """`num_generations` episodes per item, grouped contiguously (item 0's G samples first).

    Args:
      items: dicts with prompt_id, question, image (uint8 [H, W, 3]), answers.
    Returns:
      len(items) * num_generations trajectories.
    """
    r = self.config.rollout
    self.sampler.set_model(self.model)  # the policy's current weights
    self.sampler.temperature, self.sampler.top_p = float(temperature), float(top_p)
    self.sampler.reseed(seed)
    return agent_loop.run_episodes(self.sampler, self.env, self.make_builder, items, num_generations=num_generations,
                                   max_turns=r.max_turns, fatal_k=r.fatal_k, fatal_index=r.fatal_index,
                                   max_new_tokens=r.max_new_tokens, max_total_tokens=r.max_total_tokens)


def score(traj: trajectory_lib.Trajectory, alpha: float = 0.8) -> dict[str, float]:
  """r(τ) = r_fmt · (α r_acc + (1−α) r_query) (Eq. 9) with the rule-based judges (DESIGN §6).

  r_fmt and r_query look only at steps before the fatal step; r_acc is 0 without a final response.
  """
  prefix = traj.steps if traj.fatal_step is None else traj.steps[:traj.fatal_step]
  r_fmt = rewards.format_reward([s.format_ok for s in traj.steps], traj.fatal_step)
  r_acc = rule.accuracy(traj.final_response, traj.answers) if traj.final_response is not None else 0.0
  calls = [(s.action.name, s.action.arguments) for s in prefix if s.action.kind == 'tool_call']
  results = [s.result for s in prefix if s.action.kind == 'tool_call']
  r_query = rule.query_quality(calls, results, traj.question)
  return {'reward': rewards.composite_reward(r_fmt, r_acc, r_query, alpha), 'r_fmt': r_fmt, 'r_acc': r_acc,
          'r_query': r_query}


def format_ok_fraction(trajectories: list[trajectory_lib.Trajectory]) -> float:
  """Fraction of all policy steps with r_fmt^(l) = 1 (the demo's `sft_format_ok`)."""
  oks = [s.format_ok for t in trajectories for s in t.steps]
  return float(np.mean(oks)) if oks else 0.0
