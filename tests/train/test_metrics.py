"""Exact reduction of micro-batch metrics to whole-batch ones (osvl_jax/train/metrics.py)."""

import numpy as np
import pytest

from osvl_jax.rl import losses
from osvl_jax.train import metrics


def test_reduce_grpo_metrics_by_hand():
  # two micro-batches of the same batch: 3 and 1 loss tokens (a third with none changes nothing)
  parts = [
      {'loss': 0.25, 'pg_objective': -0.25, 'num_tokens': 3.0, 'num_sequences_with_tokens': 2.0,
       'clipped_tokens': 1.0, 'clip_frac': 1 / 3, 'kl_sum': 0.3, 'kl': 0.1, 'ratio_mean': 1.2, 'ratio_max': 1.5},
      {'loss': np.float32(0.5), 'pg_objective': -0.5, 'num_tokens': 1.0, 'num_sequences_with_tokens': 1.0,
       'clipped_tokens': 1.0, 'clip_frac': 1.0, 'kl_sum': 0.1, 'kl': 0.1, 'ratio_mean': 0.8, 'ratio_max': 0.8},
      {'loss': 0.0, 'pg_objective': 0.0, 'num_tokens': 0.0, 'num_sequences_with_tokens': 0.0,
       'clipped_tokens': 0.0, 'clip_frac': 0.0, 'kl_sum': 0.0, 'kl': 0.0, 'ratio_mean': 0.0, 'ratio_max': 0.0},
  ]
  out = metrics.reduce_metrics(parts, losses.GRPO_METRIC_REDUCTIONS)
  want = {'loss': 0.75, 'pg_objective': -0.75, 'num_tokens': 4.0, 'num_sequences_with_tokens': 3.0,
          'clipped_tokens': 2.0, 'clip_frac': 2 / 4, 'kl_sum': 0.4, 'kl': 0.4 / 4,
          'ratio_mean': (1.2 * 3 + 0.8) / 4, 'ratio_max': 1.5}
  assert out.keys() == want.keys()
  for key, value in want.items():
    assert out[key] == pytest.approx(value, rel=1e-12), key
  assert all(isinstance(v, float) for v in out.values())


def test_reduce_any_key_and_errors():
  assert metrics.reduce_metrics([{'x': 1, 'n': 0}, {'x': 2, 'n': 0}], {'x': 'n'}) == {'x': 0.0, 'n': 0.0}
  assert metrics.reduce_metrics([{'anything': 1}, {'anything': 2}]) == {'anything': 3.0}
  with pytest.raises(ValueError, match='no parts'):
    metrics.reduce_metrics([])
  with pytest.raises(ValueError, match='different keys'):
    metrics.reduce_metrics([{'a': 1}, {'b': 1}])
  with pytest.raises(ValueError, match='weighted by'):
    metrics.reduce_metrics([{'a': 1}], {'a': 'count'})
