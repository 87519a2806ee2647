"""How a rollout's parts are made from what a caller holds, one way for every caller (GRPO's rollouts, evaluation,
the pipeline's expert): `make_builder`."""

from collections.abc import Callable

from osvl_jax import trajectory as traj_lib


def make_builder(tokenizer, processor: traj_lib.ImageProcessor, env=None,
                 system_prompt: str | None = None) -> Callable[[], traj_lib.TrajectoryBuilder]:
  """A zero-argument factory of `TrajectoryBuilder`s (what `agent_loop.run_episodes` takes) that render the system
  turn with `env`'s tool schemas and parse the policy's calls in `env`'s tool-schema profile (`tools.tool_schema`:
  'osvl' or 'official'), so a call is parsed and checked in the same profile.

  Args:
    tokenizer: the Qwen tokenizer (`trajectory.load_tokenizer`).
    processor: the policy's `ImageProcessor`.
    env: the `tools.env.ToolEnv` the episodes call, or None for an episode without tools (no schemas; the 'osvl'
      profile).
    system_prompt: the agent's instructions (`trajectory.system_prompt_text`); None = the builder's default.
  """
  schemas = env.schemas() if env is not None else []
  profile = env.profile if env is not None else 'osvl'
  return lambda: traj_lib.TrajectoryBuilder(tokenizer, processor, schemas, system_prompt=system_prompt,
                                            profile=profile)
