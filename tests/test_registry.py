"""The name -> implementation registry (osvl_jax/registry.py) and the registries built on it."""

import pytest

from osvl_jax import registry
from osvl_jax.judges import registry as judges_registry
from osvl_jax.rl import advantages, fatal, losses


def test_register_get_names_contains():
  things = registry.Registry('thing')

  @things.register('b')
  def b():
    return 'B'

  assert b() == 'B'  # the decorator returns its argument unchanged
  assert things.register('a')(42) == 42  # a plain value, registered by a call
  assert things.get('b') is b and things.get('a') == 42
  assert things.names() == ['a', 'b'] and list(things) == ['a', 'b']
  assert 'a' in things and 'c' not in things


def test_unknown_and_duplicate_names_raise():
  things = registry.Registry('thing')
  things.register('a')(1)
  with pytest.raises(ValueError, match=r"thing 'c' is not one of \['a'\]"):
    things.get('c')
  with pytest.raises(ValueError, match="thing 'a' is already registered"):
    things.register('a')(2)
  assert things.get('a') == 1


def test_project_registries():
  assert fatal.FATAL_MODES.names() == ['hard', 'mask', 'mask_clamp', 'none']
  assert fatal.FATAL_INDEX.names() == ['first', 'kth']
  assert advantages.ESTIMATORS.names() == ['dr_grpo', 'grpo', 'rloo']
  assert losses.AGGREGATIONS.names() == ['seq_mean_token_mean', 'seq_mean_token_sum', 'token_mean']
  assert judges_registry.JUDGES.names() == ['llm', 'rule']
  for reg, kind in ((fatal.FATAL_MODES, 'fatal_mode'), (fatal.FATAL_INDEX, 'fatal_index'),
                    (advantages.ESTIMATORS, 'advantage estimator'), (losses.AGGREGATIONS, 'loss aggregation'),
                    (judges_registry.JUDGES, 'judge')):
    with pytest.raises(ValueError, match=f"{kind} 'nope' is not one of"):
      reg.get('nope')
