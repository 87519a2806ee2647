"""Trajectory rewards (DESIGN.md §6, paper Eq. 9): r(τ) = r_fmt · (α r_acc + (1 − α) r_query).

r_acc and r_query come from the judges (`osvl_jax.judges`); this module only combines them with the format
reward, which is computed here from per-step flags.
"""

from typing import Sequence, TypeVar

import numpy as np

ArrayOrFloat = TypeVar('ArrayOrFloat', float, np.ndarray)


def format_reward(step_format_ok: Sequence[bool], fatal_step: int | None) -> float:
  """r_fmt: mean of the per-step format flags over the pre-fatal prefix l < f_i.

  Args:
    step_format_ok: r_fmt^(l) per step l = 0..L: True iff step l has exactly one think block followed by exactly
      one tool_call (l < L) or response (l = L) and its tool result is not an execution error
      (Trajectory.steps[l].format_ok).
    fatal_step: f_i, or None for a non-fatal trajectory (then every step counts).

  Returns:
    r_fmt in [0, 1]; 0.0 for an empty prefix (f_i = 0, or no steps at all).
  """
  flags = list(step_format_ok)
  if fatal_step is not None:
    if fatal_step < 0:
      raise ValueError(f'fatal_step must be None or >= 0, got {fatal_step}')
    flags = flags[:fatal_step]
  if not flags:
    return 0.0
  return float(sum(bool(f) for f in flags)) / len(flags)


def composite_reward(r_fmt: ArrayOrFloat, r_acc: ArrayOrFloat, r_query: ArrayOrFloat,
                     alpha: float = 0.8) -> ArrayOrFloat:
  """r(τ) = r_fmt · (α r_acc + (1 − α) r_query) (DESIGN.md §6); scalars or same-shape arrays.

  Args:
    r_fmt: format reward in [0, 1] (`format_reward`).
    r_acc: accuracy in {0, 1}; 0 when there is no final response.
    r_query: query quality in [0, 1] over the pre-fatal prefix.
    alpha: weight of accuracy (paper: 0.8).
  """
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f'alpha must be in [0, 1], got {alpha}')
  return r_fmt * (alpha * r_acc + (1.0 - alpha) * r_query)
