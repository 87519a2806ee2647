"""Fatal-error detection and the post-fatal loss mask (DESIGN.md §6, paper Eq. 10).

A multi-turn rollout becomes *fatal* when the agent produces K consecutive tool-execution errors (the cascade
counter n_err resets on every successful call). Everything the policy emitted from the fatal step f_i onwards is
excluded from the policy-gradient loss; the pre-fatal prefix still learns.

`fatal_mode` names the four rows of the paper's Table 3b; each is a `FatalMode` in `FATAL_MODES` that gives the
loss-mask function and whether the fatal advantage is clamped (the clamp itself lives in `advantages.py`, Eq. 11).
The trainer resolves the name once and passes `mode.mask_fn` to `loss_mask` and `mode.clamp_fatal_advantage` to
`advantages.group_advantages`:

  none        vanilla GRPO: M = M_gen, Â = r̃
  hard        whole fatal trajectory masked: M = M_gen · 1[f_i = none], Â = r̃
  mask        Eq. 10 only: M = M_gen · 1[s(t) < f_i], Â = r̃
  mask_clamp  Eq. 10 + Eq. 11 (default): M = M_gen · 1[s(t) < f_i], Â = max(r̃, 0) for fatal samples
"""

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from osvl_jax import registry

# Value of `fatal_step` arrays for a non-fatal trajectory.
NOT_FATAL = -1

MaskFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


# ----------------------------------------------------------------------------------------------------------------
# f_i: the fatal step.
# ----------------------------------------------------------------------------------------------------------------

# fatal_index name -> f(step at which n_err reaches K, K) -> f_i. Config `rollout.fatal_index`.
FATAL_INDEX: registry.Registry[Callable[[int, int], int]] = registry.Registry('fatal_index')


@FATAL_INDEX.register('first')  # official code and the paper's main text
def _first_step_of_run(step: int, k: int) -> int:
  return step - k + 1


@FATAL_INDEX.register('kth')  # the appendix formula
def _kth_step_of_run(step: int, k: int) -> int:
  del k
  return step


def fatal_step(execution_errors: Sequence[bool], k: int = 3, index: str = 'first') -> int | None:
  """The fatal step f_i of one trajectory, or None when it is not fatal (DESIGN.md §6).

  n_err counts consecutive tool-execution errors and resets to 0 on a step without one; the trajectory is fatal
  at the first step where n_err reaches `k`.

  Args:
    execution_errors: one bool per step l = 0..L, True when step l's tool call ended in a tool-execution error
      (`ToolResult.is_execution_error`: every error kind but `no_result`; a malformed call counts). A final
      `<response>` step has no tool call and is False.
    k: cascade length K that makes a trajectory fatal (paper: 3).
    index: 'first' -> f_i is the first step of the K-error run (official code, main text); 'kth' -> f_i is the
      K-th error of the run, the step where n_err reaches K (appendix formula).

  Returns:
    f_i as a 0-based step index, or None when n_err never reaches `k`.

  Raises:
    ValueError: k < 1, or `index` is not in `FATAL_INDEX`.
  """
  if k < 1:
    raise ValueError(f'fatal k must be >= 1, got {k}')
  index_fn = FATAL_INDEX.get(index)
  n_err = 0
  for step, is_error in enumerate(execution_errors):
    n_err = n_err + 1 if is_error else 0
    if n_err >= k:
      return index_fn(step, k)
  return None


def fatal_cascade(execution_errors: Sequence[bool], k: int = 3) -> tuple[int, int] | None:
  """The steps [start, end] (inclusive, 0-based) of the first run of `k` consecutive execution errors, the cascade
  that makes the trajectory fatal (`fatal_step`: f_i = start for 'first', end for 'kth'); None when there is none.

  Raises:
    ValueError: k < 1.
  """
  if k < 1:
    raise ValueError(f'fatal k must be >= 1, got {k}')
  n_err = 0
  for step, is_error in enumerate(execution_errors):
    n_err = n_err + 1 if is_error else 0
    if n_err >= k:
      return step - k + 1, step
  return None


# How tool errors the environment caused (a backend timeout, an HTTP 5xx, a failing backend:
# `tools.base.ENVIRONMENT_ERROR_KINDS`) are treated. Config `rollout.env_errors`:
#   count    every execution error counts toward the fatal cascade (the paper; default)
#   retry    the agent loop retries an environment error up to rollout.env_retries times, with backoff, before the
#            policy sees it (`rollout.limits.Limits`); one that still fails counts
#   exclude  a trajectory cut by environment errors (`cut_by_environment`) is dropped from its group's advantages and
#            from the loss (`advantages.group_advantages_by_id(exclude=...)`, `train.grpo_batch.prepare_batch`)
ENV_ERROR_MODES = ('count', 'retry', 'exclude')


def cut_by_environment(execution_errors: Sequence[bool], environment_errors: Sequence[bool], k: int = 3) -> bool:
  """Whether a trajectory was cut by environment errors: its fatal cascade (`fatal_cascade`, the first K
  consecutive execution errors) holds at least one environment error, so the policy's own errors alone would not
  have reached K there. A non-fatal trajectory is never cut (an environment error it recovered from stays in it,
  with its r_fmt); nor is a fatal one whose cascade is the policy's errors alone.

  Args:
    execution_errors: per step l, the result is an execution error (`Step.is_execution_error`).
    environment_errors: per step l, the result is an environment error (`Step.is_environment_error`; implies an
      execution error).
    k: K of the fatal cascade.
  Raises:
    ValueError: the two lists differ in length; k < 1.
  """
  if len(execution_errors) != len(environment_errors):
    raise ValueError(f'{len(execution_errors)} execution and {len(environment_errors)} environment error flags')
  cascade = fatal_cascade(execution_errors, k)
  return cascade is not None and any(environment_errors[cascade[0]:cascade[1] + 1])


def fatal_step_array(fatal_steps: Sequence[int | None]) -> np.ndarray:
  """Per-trajectory f_i (None = not fatal) -> int32 [B] with `NOT_FATAL` (-1) for non-fatal rows."""
  return np.asarray([NOT_FATAL if f is None else int(f) for f in fatal_steps], dtype=np.int32)


# ----------------------------------------------------------------------------------------------------------------
# M: the loss mask (Eq. 10); one mask function per fatal_mode.
# ----------------------------------------------------------------------------------------------------------------

def _pre_fatal(step_of_token: jax.Array, fatal_step: jax.Array) -> jax.Array:
  """1[s(t) < f_i] as bool [B,T]; f_i = -1 (not fatal) counts as +infinity."""
  is_fatal = (fatal_step >= 0)[:, None]
  return jnp.logical_or(~is_fatal, step_of_token < fatal_step[:, None])


def mask_none(gen_mask: jax.Array, step_of_token: jax.Array, fatal_step: jax.Array) -> jax.Array:
  """M = M_gen (vanilla GRPO)."""
  del step_of_token, fatal_step
  return gen_mask


def mask_hard(gen_mask: jax.Array, step_of_token: jax.Array, fatal_step: jax.Array) -> jax.Array:
  """M = M_gen · 1[f_i = none]: a fatal trajectory is masked whole."""
  del step_of_token
  return gen_mask * (fatal_step < 0).astype(gen_mask.dtype)[:, None]


def mask_post_fatal(gen_mask: jax.Array, step_of_token: jax.Array, fatal_step: jax.Array) -> jax.Array:
  """M = M_gen · 1[s(t) < f_i] (Eq. 10)."""
  return gen_mask * _pre_fatal(step_of_token, fatal_step).astype(gen_mask.dtype)


@dataclasses.dataclass(frozen=True)
class FatalMode:
  """One `fatal_mode`: how the loss mask is built and whether fatal advantages are clamped (Eq. 11)."""
  name: str
  mask_fn: MaskFn  # (gen_mask f32 [B,T], step_of_token i32 [B,T], fatal_step i32 [B]) -> f32 [B,T]
  clamp_fatal_advantage: bool


# fatal_mode name -> FatalMode. Config `grpo.fatal_mode`.
FATAL_MODES: registry.Registry[FatalMode] = registry.Registry('fatal_mode')
for _mode in (FatalMode('none', mask_none, clamp_fatal_advantage=False),
              FatalMode('hard', mask_hard, clamp_fatal_advantage=False),
              FatalMode('mask', mask_post_fatal, clamp_fatal_advantage=False),
              FatalMode('mask_clamp', mask_post_fatal, clamp_fatal_advantage=True)):
  FATAL_MODES.register(_mode.name)(_mode)
del _mode


def loss_mask(gen_mask: jax.Array, step_of_token: jax.Array, fatal_step: jax.Array,
              mask_fn: MaskFn = mask_post_fatal) -> jax.Array:
  """The policy-gradient loss mask M (Eq. 10: M_it = M_gen,it · 1[s(t) < f_i]).

  Args:
    gen_mask: M_gen, bool or float [B, T]: 1 on tokens the policy emitted (Trajectory.gen_mask).
    step_of_token: s(t), int32 [B, T]: step index of each token, -1 for the prompt (Trajectory.step_of_token).
    fatal_step: f_i, int32 [B]: fatal step per trajectory, -1 (`NOT_FATAL`) for non-fatal ones.
    mask_fn: the fatal_mode's mask (`FATAL_MODES.get(name).mask_fn`): `mask_none` (M = M_gen), `mask_hard`
      (fatal trajectories fully masked), `mask_post_fatal` (Eq. 10, modes 'mask' and 'mask_clamp'; default).

  Returns:
    M, float32 [B, T].

  Raises:
    ValueError: the shapes are not [B, T], [B, T], [B].
  """
  gen_mask = jnp.asarray(gen_mask).astype(jnp.float32)
  step_of_token = jnp.asarray(step_of_token, dtype=jnp.int32)
  fatal_step = jnp.asarray(fatal_step, dtype=jnp.int32)
  if gen_mask.shape != step_of_token.shape or fatal_step.shape != gen_mask.shape[:1]:
    raise ValueError(f'loss_mask shapes: gen_mask {gen_mask.shape}, step_of_token {step_of_token.shape}, '
                     f'fatal_step {fatal_step.shape}; want [B,T], [B,T], [B]')
  return mask_fn(gen_mask, step_of_token, fatal_step)
