"""What the `Engine` interface declares: per-call sampling (never set on an engine), weight updates as methods, and
budgets stated once (`agent_loop.Limits.from_config`); callers neither probe engines nor mutate them."""

import ast
import pathlib

import ml_collections
import numpy as np
import pytest

from osvl_jax.rollout import agent_loop, engine as engine_lib
from osvl_jax.rollout.embedded import jax_sampler
from osvl_jax.rollout.remote import sglang_client

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_per_call_sampling_holds_for_that_call_only(model, tokenizer):
  context = (np.asarray(tokenizer.encode('Name a river:'), np.int32), [])
  sampler = jax_sampler.JaxSampler(model, tokenizer, max_new_tokens=6, temperature=1.0, max_len=64, bucket=16)
  greedy = jax_sampler.JaxSampler(model, tokenizer, max_new_tokens=6, temperature=0.0, max_len=64, bucket=16)
  (want,) = greedy.generate([context])
  (got,) = sampler.generate([context], sampling=engine_lib.Sampling(0.0, 1.0))
  assert got.ids.tolist() == want.ids.tolist()
  np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-6)
  assert (sampler.temperature, sampler.top_p) == (1.0, 1.0)   # the engine's defaults are untouched
  with pytest.raises(ValueError, match='top_p must be in'):
    sampler.generate([context], sampling=engine_lib.Sampling(1.0, 0.0))


def test_a_servers_request_carries_the_calls_sampling(tokenizer):
  engine = sglang_client.SGLangEngine('http://127.0.0.1:1', tokenizer, temperature=1.0, top_p=1.0)
  context = (np.asarray(tokenizer.encode('q'), np.int32), [])
  sampled = engine.request_body(context, sampling=engine_lib.Sampling(0.7, 0.95))['sampling_params']
  default = engine.request_body(context)['sampling_params']
  assert (sampled['temperature'], sampled['top_p']) == (0.7, 0.95)
  assert (default['temperature'], default['top_p']) == (1.0, 1.0)


def test_weight_updates_are_declared_methods():
  scripted = engine_lib.ScriptedEngine(['x'], tokenizer=None)
  assert scripted.weight_updates is None
  with pytest.raises(NotImplementedError, match='takes no in-process weight updates'):
    scripted.set_model(None, weight_version='1')
  with pytest.raises(NotImplementedError, match='takes no weight updates from disk'):
    scripted.update_weights_from_disk('/w/1', weight_version='1')


def test_limits_from_a_config_section():
  section = ml_collections.ConfigDict({'max_turns': 5, 'fatal_k': 2, 'fatal_index': 'kth', 'max_new_tokens': 64,
                                       'max_total_tokens': 0, 'max_seconds': 0.0, 'max_concurrency': 16,
                                       'tool_workers': 3, 'stop_at_fatal': False, 'engine': 'sglang'})
  limits = agent_loop.Limits.from_config(section, max_turns=2)
  assert limits == agent_loop.Limits(max_turns=2, fatal_k=2, fatal_index='kth', max_new_tokens=64,
                                     max_total_tokens=None, max_seconds=None, max_concurrency=16, tool_workers=3,
                                     stop_at_fatal=False)
  assert agent_loop.Limits.from_config(ml_collections.ConfigDict()) == agent_loop.Limits()
  with pytest.raises(ValueError, match='fatal'):
    agent_loop.Limits.from_config(ml_collections.ConfigDict({'fatal_index': 'last'}))
  with pytest.raises(ValueError, match='tool_workers=0'):
    agent_loop.Limits(tool_workers=0)


def _engine_like(node) -> bool:
  text = ast.unparse(node)
  return 'engine' in text or 'sampler' in text


def test_no_caller_probes_or_mutates_an_engine():
  """No `hasattr` / `getattr` probe of an engine in the rollout and training rooms, and no assignment to an
  engine's attribute from outside the engine's own class (sampling travels with each call). The server
  (`osvl_jax/serve/`) is left out: its service owns its `JaxSampler` (it is the engine's implementation, not a
  caller)."""
  probes, mutations = [], []
  paths = sorted((REPO / 'osvl_jax/rollout').rglob('*.py'))   # the core and both wings
  for path in [*paths, *(REPO / 'osvl_jax/train').glob('*.py'), REPO / 'osvl_jax/eval/runner.py',
               REPO / 'data_pipeline/experts.py']:
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Call) and getattr(node.func, 'id', '') in ('hasattr', 'getattr') and node.args \
          and _engine_like(node.args[0]):
        probes.append(f'{path.name}: {ast.unparse(node)}')
      targets = node.targets if isinstance(node, ast.Assign) else []
      for target in targets:
        for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
          if isinstance(t, ast.Attribute) and _engine_like(t.value) and ast.unparse(t.value) != 'self':
            mutations.append(f'{path.name}: {ast.unparse(t)}')
  assert probes == [] and mutations == []
