"""Fatal-error detection and the post-fatal loss mask (DESIGN.md §6, paper Eq. 10).

A multi-turn rollout becomes *fatal* when the agent produces K consecutive tool-execution errors (the cascade
counter n_err resets on every successful call). Everything the policy emitted from the fatal step f_i onwards is
excluded from the policy-gradient loss; the pre-fatal prefix still learns.

`fatal_mode` names the four rows of the paper's Table 3b; each is a registered `FatalMode` that says how the loss
mask is built and whether the fatal advantage is clamped (the clamp itself lives in `advantages.py`, Eq. 11):

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

# Value of `fatal_step` arrays for a non-fatal trajectory.
NOT_FATAL = -1

MaskFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


# ----------------------------------------------------------------------------------------------------------------
# f_i: the fatal step.
# ----------------------------------------------------------------------------------------------------------------

def _first_step_of_run(step: int, k: int) -> int:
  return step - k + 1


def _kth_step_of_run(step: int, k: int) -> int:
  del k
  return step


# fatal_index name -> f(step at which n_err reaches K, K) -> f_i. Config `fatal_index`.
FATAL_INDEX = {
    'first': _first_step_of_run,  # official code and the paper's main text
    'kth': _kth_step_of_run,  # the appendix formula
}


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
  """
  if k < 1:
    raise ValueError(f'fatal k must be >= 1, got {k}')
  if index not in FATAL_INDEX:
    raise ValueError(f'fatal index {index!r} is not one of {sorted(FATAL_INDEX)}')
  n_err = 0
  for step, is_error in enumerate(execution_errors):
    n_err = n_err + 1 if is_error else 0
    if n_err >= k:
      return FATAL_INDEX[index](step, k)
  return None


def fatal_step_array(fatal_steps: Sequence[int | None]) -> np.ndarray:
  """Per-trajectory f_i (None = not fatal) -> int32 [B] with `NOT_FATAL` (-1) for non-fatal rows."""
  return np.asarray([NOT_FATAL if f is None else int(f) for f in fatal_steps], dtype=np.int32)


# ----------------------------------------------------------------------------------------------------------------
# M: the loss mask (Eq. 10), one registered function per fatal_mode.
# ----------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FatalMode:
  """One `fatal_mode`: how the loss mask is built and whether fatal advantages are clamped (Eq. 11)."""
  name: str
  mask_fn: MaskFn  # (gen_mask f32 [B,T], step_of_token i32 [B,T], fatal_step i32 [B]) -> f32 [B,T]
  clamp_fatal_advantage: bool


_FATAL_MODES: dict[str, FatalMode] = {}


def register_fatal_mode(name: str, *, clamp_fatal_advantage: bool) -> Callable[[MaskFn], MaskFn]:
  """Decorator registering a mask function as fatal_mode `name`."""
  def decorator(fn: MaskFn) -> MaskFn:
    if name in _FATAL_MODES:
      raise ValueError(f'fatal_mode {name!r} is already registered')
    _FATAL_MODES[name] = FatalMode(name, fn, clamp_fatal_advantage)
    return fn
  return decorator


def get_fatal_mode(name: str) -> FatalMode:
  if name not in _FATAL_MODES:
    raise ValueError(f'fatal_mode {name!r} is not one of {sorted(_FATAL_MODES)}')
  return _FATAL_MODES[name]


def fatal_modes() -> list[str]:
  return sorted(_FATAL_MODES)


def _pre_fatal(step_of_token: jax.Array, fatal_step: jax.Array) -> jax.Array:
  """1[s(t) < f_i] as bool [B,T]; f_i = -1 (not fatal) counts as +infinity."""
  is_fatal = (fatal_step >= 0)[:, None]
  return jnp.logical_or(~is_fatal, step_of_token < fatal_step[:, None])


@register_fatal_mode('none', clamp_fatal_advantage=False)
def _mask_none(gen_mask, step_of_token, fatal_step):
  del step_of_token, fatal_step
  return gen_mask


@register_fatal_mode('hard', clamp_fatal_advantage=False)
def _mask_hard(gen_mask, step_of_token, fatal_step):
  del step_of_token
  return gen_mask * (fatal_step < 0).astype(gen_mask.dtype)[:, None]


@register_fatal_mode('mask', clamp_fatal_advantage=False)
def _mask_post_fatal(gen_mask, step_of_token, fatal_step):
  return gen_mask * _pre_fatal(step_of_token, fatal_step).astype(gen_mask.dtype)


@register_fatal_mode('mask_clamp', clamp_fatal_advantage=True)
def _mask_post_fatal_clamp(gen_mask, step_of_token, fatal_step):
  return _mask_post_fatal(gen_mask, step_of_token, fatal_step)


def loss_mask(gen_mask: jax.Array, step_of_token: jax.Array, fatal_step: jax.Array,
              mode: str = 'mask_clamp') -> jax.Array:
  """The policy-gradient loss mask M (Eq. 10: M_it = M_gen,it · 1[s(t) < f_i]).

  Args:
    gen_mask: M_gen, bool or float [B, T]: 1 on tokens the policy emitted (Trajectory.gen_mask).
    step_of_token: s(t), int32 [B, T]: step index of each token, -1 for the prompt (Trajectory.step_of_token).
    fatal_step: f_i, int32 [B]: fatal step per trajectory, -1 (`NOT_FATAL`) for non-fatal ones.
    mode: fatal_mode name: 'none' (M = M_gen), 'hard' (fatal trajectories fully masked), 'mask' and
      'mask_clamp' (Eq. 10; they differ only in the advantage, Eq. 11).

  Returns:
    M, float32 [B, T].
  """
  gen_mask = jnp.asarray(gen_mask).astype(jnp.float32)
  step_of_token = jnp.asarray(step_of_token, dtype=jnp.int32)
  fatal_step = jnp.asarray(fatal_step, dtype=jnp.int32)
  if gen_mask.shape != step_of_token.shape or fatal_step.shape != gen_mask.shape[:1]:
    raise ValueError(f'loss_mask shapes: gen_mask {gen_mask.shape}, step_of_token {step_of_token.shape}, '
                     f'fatal_step {fatal_step.shape}; want [B,T], [B,T], [B]')
  return get_fatal_mode(mode).mask_fn(gen_mask, step_of_token, fatal_step)
