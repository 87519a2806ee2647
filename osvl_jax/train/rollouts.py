"""Rollouts with the embedded JAX sampler against the real tool environment, and their rewards (Eq. 9)."""

import concurrent.futures

import ml_collections
import numpy as np

from osvl_jax import trajectory as trajectory_lib
from osvl_jax.judges import base as judges_base
from osvl_jax.judges import rule as rule_judge
from osvl_jax.rl import rewards
from osvl_jax.rollout import agent_loop, jax_sampler
from tools import env as tools_env


def image_processor(config: ml_collections.ConfigDict) -> trajectory_lib.ImageProcessor:
  return trajectory_lib.ImageProcessor(min_pixels=config.image.min_pixels, max_pixels=config.image.max_pixels)


def tool_env(config: ml_collections.ConfigDict) -> tools_env.ToolEnv:
  return tools_env.ToolEnv(config.get('tools'))


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
                                   max_new_tokens=r.max_new_tokens, max_total_tokens=r.max_total_tokens,
                                   max_concurrency=r.get('max_concurrency'), tool_workers=r.get('tool_workers', 1),
                                   max_seconds=r.get('max_seconds'))


_RULE_JUDGE = rule_judge.RuleJudge()


def score(traj: trajectory_lib.Trajectory, alpha: float = 0.8,
          judge: judges_base.Judge | None = None) -> dict:
  """r(τ) = r_fmt · (α r_acc + (1−α) r_query) (Eq. 9) with `judge` (default: the offline rule judge, DESIGN §6).

  r_fmt and r_query look only at steps before the fatal step; r_acc is 0 without a final response (no judge
  call). A judge error never raises: the judge's fallback score is used and the error is recorded.

  Returns:
    {'reward', 'r_fmt', 'r_acc', 'r_query': float, 'judge_errors': int (judgements that fell back),
     'judge_error_messages': list[str]}.
  """
  judge = judge or _RULE_JUDGE
  prefix = traj.steps if traj.fatal_step is None else traj.steps[:traj.fatal_step]
  r_fmt = rewards.format_reward([s.format_ok for s in traj.steps], traj.fatal_step)
  if traj.final_response is not None:
    acc = judge.accuracy(traj.question, traj.final_response, list(traj.answers))
  else:
    acc = judges_base.Verdict(0.0)
  calls = [(s.action.name, s.action.arguments) for s in prefix if s.action.kind == 'tool_call']
  results = [s.result for s in prefix if s.action.kind == 'tool_call']
  query = judge.query_quality(traj.question, calls, results)
  errors = [v.error for v in (acc, query) if v.error is not None]
  r_acc, r_query = float(acc.score), float(query.score)
  return {'reward': rewards.composite_reward(r_fmt, r_acc, r_query, alpha), 'r_fmt': r_fmt, 'r_acc': r_acc,
          'r_query': r_query, 'judge_errors': len(errors), 'judge_error_messages': errors}


def score_all(trajectories: list[trajectory_lib.Trajectory], alpha: float = 0.8,
              judge: judges_base.Judge | None = None, max_concurrency: int = 1) -> list[dict]:
  """`score` of each trajectory, in order; `max_concurrency` threads when the judge is remote (I/O bound)."""
  if max_concurrency <= 1 or judge is None or judge.name == 'rule' or len(trajectories) <= 1:
    return [score(t, alpha, judge) for t in trajectories]
  with concurrent.futures.ThreadPoolExecutor(min(max_concurrency, len(trajectories))) as pool:
    return list(pool.map(lambda t: score(t, alpha, judge), trajectories))


def format_ok_fraction(trajectories: list[trajectory_lib.Trajectory]) -> float:
  """Fraction of all policy steps with r_fmt^(l) = 1 (the demo's `sft_format_ok`)."""
  oks = [s.format_ok for t in trajectories for s in t.steps]
  return float(np.mean(oks)) if oks else 0.0
