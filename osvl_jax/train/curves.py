"""GRPO training curves: per-step series from the metric records, first / last window means, and their plots (the
demo's `grpo_reward.png`, bench/learning.py's `learning.png` and `fatal_advantages.png`); the validation records
(stage 'val', `train.validation`) drawn beside the training curve as points at their steps (`step_points`)."""

import pathlib
from collections.abc import Mapping, Sequence

import matplotlib
import numpy as np

matplotlib.use('Agg')  # files only; no display
from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top


def series(records: Sequence[dict], key: str) -> np.ndarray:
  """float64 [steps]: `key` of each GRPO step's record, in step order; a step logged twice (resumed) counts once,
  its last record (`metrics.read_metrics` order).

  Raises:
    KeyError: a step's record has no `key` (naming it and the step).
  """
  by_step = {r['step']: r for r in records if 'step' in r}
  out = []
  for step in sorted(by_step):
    if key not in by_step[step]:
      raise KeyError(f'GRPO step {step} logged no {key!r}')
    out.append(float(by_step[step][key]))
  return np.asarray(out, np.float64)


def step_points(records: Sequence[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps int64 [n], values float64 [n]): `key` at each logged step, in step order, each step's last record; the
  steps need not be consecutive (validation's 0, val_every, 2 val_every, ..., the last step).

  Raises:
    KeyError: a step's record has no `key` (naming it and the step).
  """
  by_step = {r['step']: r for r in records if 'step' in r}
  missing = [step for step in sorted(by_step) if key not in by_step[step]]
  if missing:
    raise KeyError(f'step {missing[0]} logged no {key!r}')
  steps = np.array(sorted(by_step), np.int64)
  return steps, np.array([float(by_step[s][key]) for s in steps], np.float64)


def window_means(values: Sequence[float], window: int) -> tuple[float, float]:
  """(mean of the first `window` values, mean of the last `window`); fewer values than `window` use them all, so
  with under 2 x window values the windows overlap.

  Raises:
    ValueError: no values, or window < 1.
  """
  values = np.asarray(values, np.float64)
  if values.size == 0 or window < 1:
    raise ValueError(f'window_means: {values.size} values, window={window}: need >= 1 of each')
  return float(values[:window].mean()), float(values[-window:].mean())


def plot_curves(runs: Mapping[str, Sequence[Sequence[float]]], path: str | pathlib.Path, ylabel: str,
                title: str = '', ax=None,
                points: Mapping[str, tuple[Sequence[int], Sequence[float]]] | None = None) -> pathlib.Path | None:
  """Per-step curves, one line per label: the mean over that label's runs (seeds) and, with 2+ runs, a band of
  ± one standard error of the mean; then `points`, each label's values at its own steps (markers on a line).

  Args:
    runs: label -> runs, each a per-step series of steps 1, 2, ... (runs of one label cut to the shortest).
    path: output image (.png / .svg / .pdf by suffix); ignored when `ax` is given.
    ylabel, title: axis label and title.
    ax: draw into this matplotlib axis instead of a new figure (nothing is written; returns None).
    points: label -> (steps, values), e.g. `step_points` of the validation records (step 0: before training).
  Returns:
    The path written, or None with `ax`.
  Raises:
    ValueError: no runs, or a label with no steps.
  """
  if not runs:
    raise ValueError('plot_curves: no runs')
  own = ax is None
  if own:
    fig, ax = plt.subplots(figsize=(6.0, 4.0), dpi=120)
  for label, label_runs in runs.items():
    length = min((len(r) for r in label_runs), default=0)
    if length == 0:
      raise ValueError(f'plot_curves: {label!r} has no steps')
    values = np.stack([np.asarray(r[:length], np.float64) for r in label_runs])    # [runs, steps]
    steps = np.arange(1, length + 1)
    mean = values.mean(0)
    line, = ax.plot(steps, mean, label=f'{label} (n={len(values)})')
    if len(values) > 1:
      se = values.std(0, ddof=1) / np.sqrt(len(values))
      ax.fill_between(steps, mean - se, mean + se, color=line.get_color(), alpha=0.2)
  for label, (steps, values) in (points or {}).items():
    ax.plot(np.asarray(steps), np.asarray(values, np.float64), 'o--', label=f'{label} (n={len(values)})')
  ax.set_xlabel('GRPO step')
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  if not own:
    return None
  path = pathlib.Path(path)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path


def plot_panels(panels: Sequence[tuple], path: str | pathlib.Path) -> pathlib.Path:
  """Side-by-side `plot_curves` panels in one image, e.g. [(reward runs, 'mean batch reward', 'GRPO reward'),
  (turn runs, 'turns per rollout', 'GRPO turns')].

  Args:
    panels: (runs, ylabel, title) or (runs, ylabel, title, points) per panel, as in `plot_curves`.
    path: output image (.png / .svg / .pdf by suffix).
  Returns:
    The path written.
  Raises:
    ValueError: no panels, or `plot_curves`' errors.
  """
  if not panels:
    raise ValueError('plot_panels: no panels')
  fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 3.8), dpi=120, squeeze=False)
  try:
    for ax, (runs, ylabel, title, *points) in zip(axes[0], panels):
      plot_curves(runs, None, ylabel, title, ax=ax, points=points[0] if points else None)
    fig.tight_layout()
    path = pathlib.Path(path)
    fig.savefig(path)
  finally:
    plt.close(fig)
  return path


def plot_histogram(values: Mapping[str, Sequence[float]], path: str | pathlib.Path, xlabel: str,
                   title: str = '', bins: int = 20) -> pathlib.Path:
  """Overlaid histograms (one per label, shared bins) of e.g. the r̃ of fatal samples (the paper's Figure 5).

  Raises:
    ValueError: no label has any value.
  """
  chunks = [np.asarray(v, np.float64) for v in values.values() if len(v)]
  if not chunks:
    raise ValueError('plot_histogram: no values')
  edges = np.histogram_bin_edges(np.concatenate(chunks), bins=bins)
  fig, ax = plt.subplots(figsize=(6.0, 4.0), dpi=120)
  for label, v in values.items():
    if len(v):
      ax.hist(np.asarray(v, np.float64), bins=edges, alpha=0.5, label=f'{label} (n={len(v)})')
  ax.axvline(0.0, color='k', lw=0.8)
  ax.set_xlabel(xlabel)
  ax.set_ylabel('samples')
  ax.set_title(title)
  ax.legend(fontsize=8)
  fig.tight_layout()
  path = pathlib.Path(path)
  fig.savefig(path)
  plt.close(fig)
  return path
