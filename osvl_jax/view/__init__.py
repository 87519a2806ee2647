"""A static HTML viewer for stored trajectories: `python -m osvl_jax.view PATH --out=DIR`.

  sources  what is read (`load`: evaluation workdirs, GRPO rollout dumps, datasets / files of trajectory records)
           and what is known of each trajectory (`Entry`: verdict, reward parts, the loss mask's fatal_mode)
  page     the page (`write`: `<out>/index.html` and its images)
"""

from osvl_jax.view.page import write
from osvl_jax.view.sources import FORMATS, Entry, ViewError, load


def view(path, out, limit: int = 500):
  """`load(path, limit)` then `write(...)` into `out`; returns (the page's path, the counts found)."""
  entries, found = load(path, limit)
  return write(entries, out, str(path), found), found
