"""A weight update sent while episodes are generating against a real `osvl_jax.serve` worker: no request is lost,
each token records the version that produced it, and a trajectory that straddles the update has the older one as
its `policy_version` (DESIGN.md §4, §6b)."""

import httpx
import numpy as np
from flax import nnx

from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.rollout import agent_loop
from osvl_jax.rollout import weight_publish
from osvl_jax.rollout.remote import sglang_client as sc
from tests.serve.conftest import healthy, serve_process, wait_until
from tools import env as tools_env


def test_update_mid_rollout_versions_every_token(tmp_path, tokenizer, processor):
  trained = model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(7))
  with serve_process(tmp_path / 'w.log', '--bucket=256', '--max_len=1024') as (url, proc):
    wait_until(lambda: healthy(url), 120, 'worker', proc, tmp_path / 'w.log')
    engine = sc.SGLangEngine(url, tokenizer, max_new_tokens=6, temperature=1.0, timeout=60)
    calls = []

    def update_after_first_turn(record):  # on the event loop, after each answered request
      calls.append(record)
      if len(calls) == 1:  # the other episodes' first requests are in flight at the server now
        path = weight_publish.export_version(trained, tmp_path / 'weights', 1, 32 * 32, 64 * 64, dtype='float32')
        reply = httpx.post(url + '/update_weights_from_disk', json={'model_path': str(path), 'weight_version': '1'},
                           timeout=120).json()
        assert reply['success'], reply

    env = tools_env.ToolEnv({'enabled': ('crop',)})
    make_builder = lambda: tj.TrajectoryBuilder(tokenizer, processor, [], system_prompt='Answer.')
    items = [{'prompt_id': f'q{k}', 'question': f'Question {k}?', 'image': None, 'answers': ['x']}
             for k in range(4)]
    trajs = agent_loop.run_episodes(engine, env, make_builder, items, num_generations=2, max_turns=3, fatal_k=9,
                                    max_new_tokens=6, max_concurrency=8, log_fn=update_after_first_turn)
    assert engine.model_info()['weight_version'] == '1'

  assert [(t.prompt_id, t.sample_index) for t in trajs] == [(f'q{k}', g) for k in range(4) for g in range(2)]
  seen = set()
  for t in trajs:
    assert t.stop_reason == 'max_turns' and t.error is None and len(t.steps) == 3
    assert tj.check_trajectory(t) == []
    versions = t.token_versions
    assert versions is not None and set(versions[~t.gen_mask].tolist()) == {-1}
    for step in range(3):  # the server swaps weights between batches: one version per turn
      assert len(set(versions[t.gen_mask & (t.step_of_token == step)].tolist())) == 1
    assert t.policy_version == int(versions[t.gen_mask].min())
    seen |= set(versions[t.gen_mask].tolist())
    assert int(versions[t.gen_mask & (t.step_of_token == 2)][0]) == 1  # every turn after the update is new
  assert seen == {0, 1}
  straddling = [t for t in trajs if set(t.token_versions[t.gen_mask].tolist()) == {0, 1}]
  assert straddling and all(t.policy_version == 0 for t in straddling)

  record = tj.Trajectory.from_record(straddling[0].to_record())
  np.testing.assert_array_equal(record.token_versions, straddling[0].token_versions)
