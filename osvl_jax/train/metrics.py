"""Metrics to the workdir: JSON lines (any tool reads them) and TensorBoard event files."""

import json
import pathlib
import time

import numpy as np
import tensorboardX


class MetricWriter:
  """Appends one JSON object per call to `<workdir>/metrics.jsonl` and mirrors scalars to TensorBoard.

  Args:
    workdir: the job's folder; `metrics.jsonl` and `tb/<stage>/` go there.
    stage: name stored in every record (`sft`, `grpo`, `eval`).
  """

  def __init__(self, workdir: str | pathlib.Path, stage: str):
    self.workdir = pathlib.Path(workdir)
    self.workdir.mkdir(parents=True, exist_ok=True)
    self.stage = stage
    self._jsonl = open(self.workdir / 'metrics.jsonl', 'a', encoding='utf-8')
    self._tb = tensorboardX.SummaryWriter(str(self.workdir / 'tb' / stage))

  def write(self, step: int, metrics: dict) -> None:
    """Writes `metrics` (scalars, or dicts of scalars) at `step`."""
    record = {'stage': self.stage, 'step': int(step), 'time': time.time()}
    for key, value in metrics.items():
      record[key] = _to_json(value)
      if isinstance(record[key], (int, float)) and not isinstance(record[key], bool):
        self._tb.add_scalar(f'{self.stage}/{key}', record[key], step)
    self._jsonl.write(json.dumps(record) + '\n')
    self._jsonl.flush()

  def close(self) -> None:
    self._jsonl.close()
    self._tb.close()


def _to_json(value):
  if isinstance(value, dict):
    return {str(k): _to_json(v) for k, v in value.items()}
  if isinstance(value, (np.generic, np.ndarray)) or hasattr(value, 'dtype'):
    value = np.asarray(value)
    return value.item() if value.ndim == 0 else value.tolist()
  return value


def read_metrics(workdir: str | pathlib.Path, stage: str | None = None) -> list[dict]:
  """All records of `<workdir>/metrics.jsonl`, optionally only those of `stage`."""
  path = pathlib.Path(workdir) / 'metrics.jsonl'
  if not path.exists():
    return []
  records = [json.loads(line) for line in path.read_text(encoding='utf-8').splitlines() if line.strip()]
  return [r for r in records if stage is None or r.get('stage') == stage]
