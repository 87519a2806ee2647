"""Plots of the evaluation: Pass@1 against mean tool calls over the tool-call budget sweep."""

import pathlib
from collections.abc import Sequence

import matplotlib

matplotlib.use('Agg')  # files only; no display
from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top


def plot_budget_sweep(points: Sequence[dict], path: str | pathlib.Path, title: str = '') -> pathlib.Path:
  """Writes the budget sweep plot: x = mean tool calls per item, y = Pass@1 (%), one point per budget.

  Args:
    points: dicts with `budget` (max tool calls), `mean_tool_calls`, `pass_at_1` (in [0, 1]), in budget order.
    path: output image file (.png / .svg / .pdf by suffix).
    title: plot title.
  Returns:
    The path written.
  Raises:
    ValueError: no points.
  """
  if not points:
    raise ValueError('no budget-sweep points to plot')
  path = pathlib.Path(path)
  x = [p['mean_tool_calls'] for p in points]
  y = [100.0 * p['pass_at_1'] for p in points]
  fig, ax = plt.subplots(figsize=(5.5, 4.0), dpi=120)
  ax.plot(x, y, marker='o')
  for p, xi, yi in zip(points, x, y):
    ax.annotate(f"budget {p['budget']}", (xi, yi), textcoords='offset points', xytext=(4, 4), fontsize=8)
  ax.set_xlabel('mean tool calls per item')
  ax.set_ylabel('Pass@1 (%), average over benchmarks')
  ax.set_title(title or 'Accuracy vs. tool-call budget')
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path
