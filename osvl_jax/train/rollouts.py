"""Rollouts of the policy against the real tool environment, and their rewards (Eq. 9).

The engine (`config.rollout.engine`, DESIGN.md §6b; built by `rollout.factory.make_engine`): 'embedded' (default)
is the in-process `JaxSampler`; 'sglang' is any server of SGLang's native API at `rollout.urls` (SGLang on GPUs,
`python -m osvl_jax.serve`, an `sglang-router`), whose weights are updated at `rollout.admin_urls` (default: the
urls) from HF folders exported under `rollout.weights_dir` (default `<workdir>/weights`; a local folder the servers
can read). The agent loop is the same for both; `RolloutRunner.publish` hands each policy version to the engine
(`weight_publish.WeightPublisher`); each rollout states its sampling per call (`engine.Sampling`) and its budgets once
(`agent_loop.Limits.from_config(config.rollout)`).
"""

import concurrent.futures
import pathlib

import ml_collections
import numpy as np

from osvl_jax import config_checks as checks
from osvl_jax import trajectory as trajectory_lib
from osvl_jax.checkpoints import storage
from osvl_jax.judges import base as judges_base
from osvl_jax.judges import registry as judges_registry
from osvl_jax.rl import rewards
from osvl_jax.rollout import agent_loop, factory, weight_publish
from osvl_jax.rollout import engine as engine_lib
from tools import env as tools_env


# The image-blind counter-test (bench/learning_world.py; the failure peers report most: images lost between rollout and
# update): `grpo.zero_pixels` 'rollout' zeroes every prompt's input image before the agent loop (the policy never
# sees it, so the trajectories and the update hold zeros too); 'update' zeroes the update's pixel_values only
# (`grpo_batch.prepare_batch`); 'none' (default) is the real run.
ZERO_PIXELS = ('none', 'rollout', 'update')


def zero_pixels(config: ml_collections.ConfigDict) -> str:
  """`config.grpo.zero_pixels` ('none' when absent)."""
  return (config.get('grpo') or {}).get('zero_pixels') or 'none'


def image_processor(config: ml_collections.ConfigDict) -> trajectory_lib.ImageProcessor:
  return trajectory_lib.ImageProcessor(min_pixels=config.image.min_pixels, max_pixels=config.image.max_pixels)


def tool_env(config: ml_collections.ConfigDict) -> tools_env.ToolEnv:
  return tools_env.ToolEnv(config.get('tools'))


def check_engine_config(config: ml_collections.ConfigDict, workdir: str | pathlib.Path | None = None) -> None:
  """Checks the rollout engine fields (called by `grpo.check_config`).

  Fields (config.rollout): those of `rollout.factory` (engine 'embedded' default | 'sglang'; 'openai' is refused:
  RL needs the policy's own tokens and log-probs); with 'sglang' also weights_dir (local folder; default
  `<workdir>/weights`), weights_dtype ('bfloat16' default | 'float32'), weights_keep (int >= 1, default 2).

  Raises:
    ValueError: naming the field: from `factory.check_engine_config(training=True)`; a bad weights_dtype /
      weights_keep; weights_dir a URL, or unset while `workdir` is a URL (gs://...).
  """
  if factory.check_engine_config(config.rollout, training=True) != 'sglang':
    return
  if config.rollout.get('weights_dtype'):
    checks.choice(config, 'rollout.weights_dtype', weight_publish.DTYPES)
  checks.number(config, 'rollout.weights_keep', integer=True, low=1, optional=True)
  weights_dir(config, workdir)


def weights_dir(config: ml_collections.ConfigDict, workdir: str | pathlib.Path | None) -> pathlib.Path | None:
  """Where HF folders are exported for the servers: `rollout.weights_dir`, else `<workdir>/weights`.

  Raises:
    ValueError: naming rollout.weights_dir: it is a URL, or it is unset and `workdir` is a URL (servers load
      from a local or shared filesystem, never from gs://).
  """
  folder = config.rollout.get('weights_dir') or ''
  if folder and storage.is_remote(folder):
    raise ValueError(f'rollout.weights_dir={folder!r} is a URL: the servers load weights from a local folder')
  if not folder and workdir is not None and storage.is_remote(workdir):
    raise ValueError(f'workdir {workdir} is a URL: set rollout.weights_dir to a local folder the rollout servers '
                     'can read (exported weights)')
  if folder:
    return pathlib.Path(folder)
  return None if workdir is None else pathlib.Path(workdir) / 'weights'


class RolloutRunner:
  """Owns the tokenizer, image processor, tools, rollout engine and weight sync for one policy.

  Args:
    config: the job config (`image`, `tools`, `rollout` fields). `check_engine_config` must have accepted it.
    model: the policy; the embedded engine starts on its weights.
    workdir: the job folder (`<workdir>/weights` is the default export folder of the 'sglang' engine).
  Attributes:
    engine: the `JaxSampler` ('embedded') or `SGLangEngine` ('sglang'), `rollout.factory.make_engine`.
    limits: the budgets of every rollout (`agent_loop.Limits.from_config(config.rollout)`).
    sync: the `weight_publish.WeightPublisher` that `publish` goes through.

  In a multi-host job ('sglang' only) every process builds one; process 0 alone calls `run` (`grpo.train` sends
  its batch to the others), and every process calls `publish` (it gathers the parameters; process 0 exports).
  """

  def __init__(self, config: ml_collections.ConfigDict, model, workdir: str | pathlib.Path | None = None):
    self.config = config
    self.tokenizer = trajectory_lib.load_tokenizer()
    self.image_processor = image_processor(config)
    self.env = tool_env(config)
    self.system_prompt = trajectory_lib.system_prompt_text(config.get('system_prompt'))   # one per run
    r = config.rollout
    remote = factory.engine_name(r) == 'sglang'
    self.engine = factory.make_engine(r, self.tokenizer, model=model, processor=self.image_processor,
                                      training=True)
    self.limits = agent_loop.Limits.from_config(r)   # the budgets of every rollout of the run
    self.sync = weight_publish.WeightPublisher(
        self.engine, root=weights_dir(config, workdir) if remote else None, min_pixels=config.image.min_pixels,
        max_pixels=config.image.max_pixels, dtype=r.get('weights_dtype') or 'bfloat16',
        keep=r.get('weights_keep') or 2)

  @property
  def version(self) -> int | None:
    """The last published policy version (None before the first `publish`)."""
    return self.sync.version

  def publish(self, model, version: int) -> dict:
    """`WeightPublisher.publish`: `model`'s weights as `version` on the engine (every server for 'sglang')."""
    return self.sync.publish(model, version)

  def make_builder(self) -> trajectory_lib.TrajectoryBuilder:
    """A builder of this run's episodes (`rollout.factory.make_builder`: the tool env's schemas and profile)."""
    return factory.make_builder(self.tokenizer, self.image_processor, self.env, self.system_prompt)()

  def run(self, items: list[dict], num_generations: int, temperature: float, top_p: float, seed: int,
          env: tools_env.ToolEnv | None = None, require_tokens: bool = True) -> list[trajectory_lib.Trajectory]:
    """`num_generations` episodes per item, grouped contiguously (item 0's G samples first), with the weights of
    the last `publish` (the construction model's for an embedded engine never published to).

    Args:
      items: dicts with prompt_id, question, image (uint8 [H, W, 3]; zeroed first under `grpo.zero_pixels`
        'rollout'), answers.
      seed: the embedded sampler's PRNG seed (servers sample with their own).
      env: the tool environment (None: the runner's, `self.env`); validation passes a fresh one of the same
        config, so its calls draw nothing from the training's failure injection.
      require_tokens: refuse a batch with no policy token (`check_not_all_failed`); validation passes False.
    Returns:
      len(items) * num_generations trajectories; `policy_version` is the oldest emitted token's version as the
      engine reports it (the last published version for prompt-only trajectories).
    Raises:
      RuntimeError: with `require_tokens`, every trajectory ended on an error before a policy token
        (`check_not_all_failed`): nothing to train on.
    """
    self.engine.reseed(seed)
    if zero_pixels(self.config) == 'rollout':
      items = [{**item, 'image': None if item.get('image') is None else np.zeros_like(item['image'])}
               for item in items]
    trajectories = agent_loop.run_episodes(self.engine, self.env if env is None else env, self.make_builder, items,
                                           num_generations=num_generations, limits=self.limits,
                                           sampling=engine_lib.Sampling(temperature, top_p),
                                           policy_version=self.version or 0)
    if require_tokens:
      check_not_all_failed(trajectories)
    return trajectories


def check_not_all_failed(trajectories: list[trajectory_lib.Trajectory]) -> None:
  """Refuses a rollout batch in which every trajectory ended on an error before the policy emitted a token (an
  engine that answers ids outside the vocabulary or NaN log-probs on every first turn, a server that refuses every
  request, prompts that cannot be rendered): a step on it would train on no token, silently. A trajectory that ended
  on an error after some turns of the policy is trained on (its reward counts in its group), and one failed
  trajectory among others is the agent loop's business (it ends alone, DESIGN.md §6b).

  Raises:
    RuntimeError: naming the count and the first trajectory's error.
  """
  if trajectories and all(t.stop_reason == 'error' and not np.asarray(t.gen_mask).any() for t in trajectories):
    raise RuntimeError(f'rollout: all {len(trajectories)} trajectories ended on an error before a policy token, '
                       f'nothing to train on (the step is not taken); first: {trajectories[0].error}')


def score(traj: trajectory_lib.Trajectory, alpha: float = 0.8,
          judge: judges_base.Judge | None = None) -> dict:
  """r(τ) = r_fmt · (α r_acc + (1−α) r_query) (Eq. 9) with `judge` (None: the registry's default, the offline rule
  judge, DESIGN §6).

  r_fmt and r_query look only at steps before the fatal step (the query judge is also given the reference answers
  and the final response, as the paper's is); r_acc is 0 without a final response (no judge call). A judge error
  never raises: the judge's fallback score is used and the error is recorded.

  Returns:
    {'reward', 'r_fmt', 'r_acc', 'r_query': float, 'judge_errors': int (judgements that fell back),
     'judge_error_messages': list[str]}.
  """
  judge = judge if judge is not None else judges_registry.get_judge(None)
  prefix = traj.steps if traj.fatal_step is None else traj.steps[:traj.fatal_step]
  r_fmt = rewards.format_reward([s.format_ok for s in traj.steps], traj.fatal_step)
  if traj.final_response is not None:
    acc = judge.accuracy(traj.question, traj.final_response, list(traj.answers))
  else:
    acc = judges_base.Verdict(0.0)
  calls = [(s.action.name, s.action.arguments) for s in prefix if s.action.kind == 'tool_call']
  results = [s.result for s in prefix if s.action.kind == 'tool_call']
  query = judge.query_quality(traj.question, calls, results, answers=list(traj.answers),
                              response=traj.final_response)
  errors = [v.error for v in (acc, query) if v.error is not None]
  r_acc, r_query = float(acc.score), float(query.score)
  return {'reward': rewards.composite_reward(r_fmt, r_acc, r_query, alpha), 'r_fmt': r_fmt, 'r_acc': r_acc,
          'r_query': r_query, 'judge_errors': len(errors), 'judge_error_messages': errors}


def score_all(trajectories: list[trajectory_lib.Trajectory], alpha: float = 0.8,
              judge: judges_base.Judge | None = None) -> list[dict]:
  """`score` of each trajectory, in order, in the judge's `max_concurrency` threads (a remote judge is I/O bound);
  `judge` None: the registry's default (the rule judge), built once for the batch."""
  judge = judge if judge is not None else judges_registry.get_judge(None)
  threads = judge.max_concurrency
  if threads <= 1 or len(trajectories) <= 1:
    return [score(t, alpha, judge) for t in trajectories]
  with concurrent.futures.ThreadPoolExecutor(min(threads, len(trajectories))) as pool:
    return list(pool.map(lambda t: score(t, alpha, judge), trajectories))


def format_ok_fraction(trajectories: list[trajectory_lib.Trajectory]) -> float:
  """Fraction of all policy steps with r_fmt^(l) = 1 (the demo's `sft_format_ok`)."""
  oks = [s.format_ok for t in trajectories for s in t.steps]
  return float(np.mean(oks)) if oks else 0.0
