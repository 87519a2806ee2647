"""Two `python -m osvl_jax.serve` workers behind the real `sglang-router`: greedy ids and log-probs equal the
in-process engine's, directly and through the router; `/update_weights_from_disk` swaps in a checkpoint."""


import numpy as np
import pytest
from flax import nnx

from osvl_jax import checkpoints as ckpt_lib
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.rollout.remote import sglang_client as sc
from osvl_jax.rollout.remote import sglang_protocol as protocol
from tests.serve.conftest import MAX_LEN, NEW, reference_sampler, router_cluster


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
  """(router URL, [worker URLs]): two tiny workers and `sglang_router.launch_router` (round robin)."""
  with router_cluster(tmp_path_factory.mktemp('logs')) as urls:
    yield urls


def _assert_same(got, want, atol):
  for g, w in zip(got, want, strict=True):
    assert g.ids.tolist() == w.ids.tolist()
    np.testing.assert_allclose(g.logprobs, w.logprobs, atol=atol)
    assert g.finish_reason == w.finish_reason


def test_greedy_one_server_equals_in_process(cluster, reference, tokenizer, contexts):
  _, (w0, _) = cluster
  want = reference.generate(contexts)
  got = sc.SGLangEngine(w0, tokenizer, max_new_tokens=NEW, temperature=0.0).generate(contexts)
  _assert_same(got, want, 1e-5)


def test_greedy_through_router_equals_in_process(cluster, reference, tokenizer, contexts):
  router, _ = cluster
  want = reference.generate(contexts)
  engine = sc.SGLangEngine(router, tokenizer, max_new_tokens=NEW, temperature=0.0)
  for _ in range(2):   # round robin: each context reaches both workers over the two passes
    _assert_same(engine.generate(contexts), want, 1e-5)


def test_update_weights_from_disk(cluster, tokenizer, contexts, tmp_path):
  router, workers = cluster
  new_model = model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(1))
  mngr = ckpt_lib.manager(tmp_path, 'ckpt')
  ckpt_lib.save(mngr, 5, new_model, None, {'image_processor': {'min_pixels': 32 * 32, 'max_pixels': 64 * 64}})
  engine = sc.SGLangEngine(router, tokenizer, max_new_tokens=NEW, temperature=0.0, admin_urls=workers)
  answers = engine.update_weights_from_disk(str(tmp_path / 'ckpt' / '5'), weight_version='step-5')
  assert all(a['success'] for a in answers)
  assert {engine.model_info(w)['weight_version'] for w in workers} == {'step-5'}
  want = reference_sampler(new_model, tokenizer).generate(contexts)
  got = engine.generate(contexts)
  _assert_same(got, want, 1e-4)
  assert {g.weight_version for g in got} == {'step-5'}
  # Without a version, an integer version is bumped; a bad path fails typed and keeps the weights.
  one = sc.SGLangEngine(workers[1], tokenizer, retries=0)
  one.update_weights_from_disk(str(tmp_path / 'ckpt'), weight_version='41')
  one.update_weights_from_disk(str(tmp_path / 'ckpt'))
  assert one.model_info()['weight_version'] == '42'
  with pytest.raises(protocol.EngineError):
    one.update_weights_from_disk(str(tmp_path / 'missing'))
  assert one.model_info()['weight_version'] == '42'


def test_grpo_through_the_router_publishes_to_every_worker(cluster, tokenizer, tmp_path, monkeypatch):
  """GRPO rolls out through the router (`rollout.urls`) and publishes each version to both workers
  (`rollout.admin_urls`): after 2 steps both serve version 2, with the trainer's log-probs."""
  from tests.serve.test_weight_publish import trainer_logprobs
  from tests.train import test_grpo_serve as grpo_test
  from osvl_jax.train import grpo, metrics
  router, workers = cluster
  workdir = grpo_test.make_workdir(tmp_path, monkeypatch)
  c = grpo_test._config(router)
  c.rollout.update(admin_urls=tuple(workers), max_new_tokens=NEW, max_total_tokens=MAX_LEN - NEW - 8)
  c.tools.enabled = ()   # no tool schemas: the prompt (~90 tokens, 261 with the demo's four) fits the workers' MAX_LEN
  c.grpo.steps = c.grpo.ckpt_every = 2
  model = grpo.train(c, workdir)
  rows = metrics.read_metrics(workdir, 'grpo')
  assert all(r['mean_turns'] >= 1 and r['unmasked_tokens'] > 0 for r in rows), rows   # real turns were trained on
  assert [r['weight_version'] for r in rows] == [1, 2] and [r['policy_versions'] for r in rows] == [[0], [1]]
  prompt = np.random.default_rng(4).integers(100, 150000, size=9).astype(np.int32)
  for w in workers:
    engine = sc.SGLangEngine(w, tokenizer, max_new_tokens=NEW, temperature=0.0)
    assert engine.model_info()['weight_version'] == '2'
    gen = engine.generate([(prompt, [])])[0]
    np.testing.assert_allclose(gen.logprobs, trainer_logprobs(model, prompt, np.asarray(gen.ids)), atol=1e-4)
