"""The persistent compilation cache and the compile counter (osvl_jax/compile_cache.py): a process that compiles
two shapes of one function counts them; a second process on the same cache folder compiles nothing and reads them
back; with the cache off the second process compiles again."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, sys
import jax, jax.numpy as jnp
from osvl_jax import compile_cache
compile_cache.enable(sys.argv[1] or None)
x3, x5 = jax.device_put(jnp.arange(3.0)), jax.device_put(jnp.arange(5.0))
before = compile_cache.counts()
f = jax.jit(lambda x: jnp.sin(x) * 2 + 1)
for x in (x3, x3, x5, x5):
  f(x).block_until_ready()
after = compile_cache.counts()
print(json.dumps({k: after[k] - before[k] for k in ('compiles_total', 'compile_cache_hits')}))
"""


def _run(cache_dir: str) -> dict:
  env = {k: v for k, v in os.environ.items() if not k.startswith('JAX_')}  # not `make test`'s shared cache
  out = subprocess.run([sys.executable, '-c', SCRIPT, cache_dir], capture_output=True, text=True, timeout=300, env=env,
                       check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize('cached', [True, False], ids=['cache_on', 'cache_off'])
def test_second_process_compiles_nothing_with_the_cache(tmp_path, cached):
  cache = str(tmp_path / 'jax_cache') if cached else ''
  first = _run(cache)
  assert first == {'compiles_total': 2, 'compile_cache_hits': 0}  # one program per shape, none for the repeats
  second = _run(cache)
  assert second == ({'compiles_total': 0, 'compile_cache_hits': 2} if cached else first)


def test_metric_records_carry_the_compile_count(tmp_path):
  """Each metrics.jsonl record carries the process's compile count: one new program between two records shows as
  exactly one more compile (the trainers' `compiles_total` is how a user sees a recompile)."""
  import jax
  import jax.numpy as jnp

  from osvl_jax.train import metrics

  x = jax.device_put(jnp.arange(7.0))
  writer = metrics.MetricWriter(tmp_path, 'sft')
  writer.write(1, {'loss': 1.0})
  jax.jit(lambda v: jnp.cos(v) * 3.0 - 0.5)(x).block_until_ready()  # a program no other test compiles
  writer.write(2, {'loss': 0.5})
  writer.close()
  first, second = metrics.read_metrics(tmp_path, 'sft')
  assert second['compiles_total'] - first['compiles_total'] == 1
  assert {'compile_cache_hits', 'compile_seconds'} <= set(second) and second['loss'] == 0.5
