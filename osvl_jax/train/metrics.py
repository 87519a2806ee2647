"""Metrics to the workdir: JSON lines (any tool reads them) and TensorBoard event files; exact reduction of the
metrics of a batch's parts (micro-batches) to those of the whole batch.

In a multi-host run only process 0 writes (`MetricWriter` is a no-op elsewhere). The workdir may be a cloud URL
(`gs://bucket/run`, see `checkpoints.storage`).
"""

import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from osvl_jax import compile_cache
from osvl_jax.checkpoints import storage


def _import_tensorboardx():
  """tensorboardX, imported without torch: tensorboardX imports torch when it is installed, only to accept
  torch tensors as values (`writer.numpy_compatible`), which costs a trainer 5-12 s of start-up in an environment
  that has torch for the HF reference (this one). Scalars from numpy / Python are written the same either way."""
  if 'torch' in sys.modules:
    import tensorboardX  # pylint: disable=g-import-not-at-top
    return tensorboardX
  sys.modules['torch'] = None  # `import torch` raises ImportError while tensorboardX is imported
  try:
    import tensorboardX  # pylint: disable=g-import-not-at-top
  finally:
    del sys.modules['torch']
  return tensorboardX


tensorboardX = _import_tensorboardx()


class MetricWriter:
  """Appends one JSON object per call to `<workdir>/metrics.jsonl` and mirrors scalars to TensorBoard.

  Only process 0 of a multi-host run writes; on the others every method does nothing (`active` is False).
  A cloud workdir (objects cannot be appended to) gets the whole `metrics.jsonl` rewritten at most every
  `flush_seconds` and on `close`; its TensorBoard files go to a local folder (`tb_dir`, printed), since
  tensorboardX cannot write to `gs://` without extra packages.

  Args:
    workdir: the job's folder (local path or URL); `metrics.jsonl` and `tb/<stage>/` go there.
    stage: name stored in every record (`sft`, `grpo`, `eval`); `write(..., stage=...)` writes a record of another
      stage through the same writer (GRPO's validation records, stage 'val', beside its 'grpo' ones: one writer per
      file, as a cloud workdir's rewrites of the whole file allow no second one).
    flush_seconds: how often a cloud workdir's `metrics.jsonl` is rewritten.
  """

  def __init__(self, workdir: str | os.PathLike, stage: str, flush_seconds: float = 60.0):
    self.stage = stage
    self.active = jax.process_index() == 0
    if not self.active:
      return
    self.workdir = storage.path(workdir)
    self.remote = storage.is_remote(self.workdir)
    self.workdir.mkdir(parents=True, exist_ok=True)
    self._path = self.workdir / 'metrics.jsonl'
    self.flush_seconds, self._flushed = flush_seconds, time.time()
    if self.remote:
      self._lines = self._path.read_text(encoding='utf-8').splitlines(keepends=True) if self._path.exists() else []
      self._jsonl = None
      self.tb_dir = pathlib.Path(tempfile.gettempdir()) / 'osvl_tb' / str(self.workdir).replace('://', '/') / 'tb'
      print(f'metrics: TensorBoard files of {self.workdir} are written locally to {self.tb_dir}', flush=True)
    else:
      self._jsonl = open(self._path, 'a', encoding='utf-8')
      self.tb_dir = pathlib.Path(self.workdir / 'tb')
    self._tbs = {stage: tensorboardX.SummaryWriter(str(self.tb_dir / stage))}   # stage -> its event files

  def write(self, step: int, metrics: dict, stage: str | None = None) -> None:
    """Writes `metrics` (scalars, or dicts of scalars) at `step`, with the process's compile counts so far
    (`compiles_total`, `compile_cache_hits`, `compile_seconds`: `osvl_jax.compile_cache.counts`), as a record of
    `stage` (None: the writer's; TensorBoard under `tb/<stage>/`, scalars tagged `<stage>/<key>`)."""
    if not self.active:
      return
    stage = stage or self.stage
    if stage not in self._tbs:
      self._tbs[stage] = tensorboardX.SummaryWriter(str(self.tb_dir / stage))
    record = {'stage': stage, 'step': int(step), 'time': time.time()}
    metrics = {**compile_cache.counts(), **metrics}
    for key, value in metrics.items():
      record[key] = _to_json(value)
      if isinstance(record[key], (int, float)) and not isinstance(record[key], bool):
        self._tbs[stage].add_scalar(f'{stage}/{key}', record[key], step)
    line = json.dumps(record) + '\n'
    if self._jsonl is not None:
      self._jsonl.write(line)
      self._jsonl.flush()
    else:
      self._lines.append(line)
      if time.time() - self._flushed >= self.flush_seconds:
        self._rewrite()

  def _rewrite(self) -> None:
    self._path.write_text(''.join(self._lines), encoding='utf-8')
    self._flushed = time.time()

  def close(self) -> None:
    if not self.active:
      return
    if self._jsonl is not None:
      self._jsonl.close()
    else:
      self._rewrite()
    for tb in self._tbs.values():
      tb.close()


def _to_json(value):
  if isinstance(value, dict):
    return {str(k): _to_json(v) for k, v in value.items()}
  if isinstance(value, (np.generic, np.ndarray)) or hasattr(value, 'dtype'):
    value = np.asarray(value)
    return value.item() if value.ndim == 0 else value.tolist()
  return value


def read_metrics(workdir: str | os.PathLike, stage: str | None = None) -> list[dict]:
  """All records of `<workdir>/metrics.jsonl` (a local path or URL), optionally only those of `stage`."""
  path = storage.path(workdir) / 'metrics.jsonl'
  if not path.exists():
    return []
  records = [json.loads(line) for line in path.read_text(encoding='utf-8').splitlines() if line.strip()]
  return [r for r in records if stage is None or r.get('stage') == stage]


SUM, MAX, MEAN = 'sum', 'max', 'mean'


def reduce_metrics(parts: Sequence[Mapping[str, Any]],
                   reductions: Mapping[str, str] | None = None) -> dict[str, float]:
  """Whole-batch values of scalar metrics from those of the batch's parts (micro-batches; Tunix-style weighted).

  Every key of the parts is reduced, by `reductions.get(key, SUM)`:
    SUM ('sum')   Σ_i m_i: counts, sums, and losses already normalised by the whole batch;
    MAX ('max')   max_i m_i;
    MEAN ('mean') (1/n) Σ_i m_i: per-part values of equal weight (e.g. the loss of each optimizer step);
    <count key>   a mean over what that count metric counts: Σ_i m_i c_i / max(Σ_i c_i, 1), i.e. each part's
                  (sum, count) = (m_i c_i, c_i), added up.

  Args:
    parts: one dict per part, same keys, scalar values (python, numpy or jax, any float/int dtype).
    reductions: key -> SUM | MAX | MEAN | name of a count key in the parts (e.g.
      `losses.GRPO_METRIC_REDUCTIONS`).

  Returns:
    {key: float} over all keys of the parts.

  Raises:
    ValueError: no parts, parts with different keys, or a weighting count key that the parts lack.
  """
  if not parts:
    raise ValueError('reduce_metrics: no parts')
  keys = list(parts[0])
  if any(set(m) != set(keys) for m in parts):
    raise ValueError(f'reduce_metrics: parts have different keys: {[sorted(m) for m in parts]}')
  reductions = reductions or {}
  values = {k: [float(m[k]) for m in parts] for k in keys}
  out = {}
  for key in keys:
    how = reductions.get(key, SUM)
    if how == SUM:
      out[key] = float(sum(values[key]))
    elif how == MAX:
      out[key] = max(values[key])
    elif how == MEAN:
      out[key] = float(sum(values[key])) / len(values[key])
    elif how in values:
      counts = values[how]
      out[key] = sum(v * c for v, c in zip(values[key], counts)) / max(sum(counts), 1.0)
    else:
      raise ValueError(f'reduce_metrics: {key!r} is weighted by {how!r}, which is not a metric of the parts')
  return out
