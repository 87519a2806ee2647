"""`WeightPublisher`: the trainer's policy, exported as an HF folder and loaded by a real `osvl_jax.serve` worker
through `/update_weights_from_disk`, gives the trainer's log-probs; versions are reported; old folders are pruned."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.rollout import weight_publish
from osvl_jax.rollout.embedded import jax_sampler
from osvl_jax.rollout.remote import sglang_client as sc
from tests.serve.conftest import NEW, healthy, serve_process, wait_until


def trainer_logprobs(model, prompt: np.ndarray, generated: np.ndarray) -> np.ndarray:
  """log π(generated[k] | prompt, generated[:k]) from one forward pass of the trainer's model (text only)."""
  ids = np.concatenate([prompt, generated]).astype(np.int32)[None]
  mask = np.ones_like(ids, bool)
  positions, _ = rope.get_rope_index(ids, None, mask)
  hidden, _ = model(jnp.asarray(ids), jnp.asarray(positions), jnp.asarray(mask))
  logp = jax.nn.log_softmax(model.logits(hidden[:, len(prompt) - 1:-1])[0].astype(jnp.float32), axis=-1)
  return np.asarray(jnp.take_along_axis(logp, jnp.asarray(generated)[:, None], axis=1)[:, 0])


def test_published_weights_give_the_trainers_logprobs(tmp_path, tokenizer, contexts):
  trained = model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(7))   # not the server's initial weights
  text_contexts = [c for c in contexts if not c[1]]
  with serve_process(tmp_path / 'w.log') as (url, proc):
    wait_until(lambda: healthy(url), 120, 'worker', proc, tmp_path / 'w.log')
    engine = sc.SGLangEngine(url, tokenizer, max_new_tokens=NEW, temperature=0.0)
    before = engine.generate(text_contexts)
    sync = weight_publish.WeightPublisher(engine, root=tmp_path / 'weights', min_pixels=32 * 32, max_pixels=64 * 64,
                                          dtype='float32', keep=2)
    for version in (1, 2, 3):
      info = sync.publish(trained, version)
      assert info['version'] == version and all(a['success'] for a in info['servers'])
    assert engine.model_info()['weight_version'] == '3'
    after = engine.generate(text_contexts)
  assert sorted(p.name for p in (tmp_path / 'weights').iterdir()) == ['v00000002', 'v00000003']
  assert {g.weight_version for g in before} != {'3'} and {g.weight_version for g in after} == {'3'}
  for (prompt, _), gen in zip(text_contexts, after):
    np.testing.assert_allclose(gen.logprobs, trainer_logprobs(trained, prompt, np.asarray(gen.ids)), atol=1e-4)
  # The server's answer changed with the weights (the check above would not notice a no-op update otherwise).
  assert any(a.ids.tolist() != b.ids.tolist() or not np.allclose(a.logprobs, b.logprobs)
             for a, b in zip(after, before))


def test_embedded_engine_swaps_in_a_snapshot(tokenizer):
  sampler = jax_sampler.JaxSampler(model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(0)), tokenizer,
                                   max_new_tokens=2, max_len=64)
  trained = model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(7))
  params = lambda m: jax.tree.leaves(jax.device_get(nnx.state(m, nnx.Param)))
  published = params(trained)
  info = weight_publish.WeightPublisher(sampler).publish(trained, 4)
  served = sampler._model  # pylint: disable=protected-access
  assert info['path'] == '' and sampler.weight_version == '4'
  for a, b in zip(params(served), published):
    np.testing.assert_array_equal(a, b)
  # The trainer's next in-place update (a rollout may be running: max_staleness 1) does not reach the sampler.
  nnx.update(trained, jax.tree.map(lambda x: x + 1, nnx.state(trained, nnx.Param)))
  assert not np.array_equal(params(trained)[0], published[0])
  for a, b in zip(params(served), published):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('kwargs, match', [
    ({'version': -1}, 'version=-1'), ({'dtype': 'float16'}, "dtype='float16'"), ({'keep': 0}, 'keep=0')])
def test_export_refuses_bad_settings(tmp_path, kwargs, match):
  args = dict(model=None, root=tmp_path, version=1, min_pixels=1, max_pixels=4) | kwargs
  with pytest.raises(ValueError, match=match):
    weight_publish.export_version(**args)


def test_an_http_engine_needs_a_root_and_a_pixel_budget(tokenizer):
  engine = sc.SGLangEngine('http://127.0.0.1:9', tokenizer)
  with pytest.raises(ValueError, match='root'):
    weight_publish.WeightPublisher(engine)
  with pytest.raises(ValueError, match='min_pixels=0'):
    weight_publish.WeightPublisher(engine, root='/tmp/x')


def test_a_resumed_run_republishing_an_older_version_keeps_it(tmp_path):
  """Versions are published every step, checkpoints every few: a resume re-publishes an older version than the
  folders on disk. The new folder must survive the pruning; the newer ones (a future that was rolled back) go."""
  model = model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(0))
  export = lambda v: weight_publish.export_version(model, tmp_path, v, 1024, 4096, dtype='float32', keep=2)
  for version in (10, 11, 12):
    export(version)
  assert sorted(p.name for p in tmp_path.iterdir()) == ['v00000011', 'v00000012']
  assert export(10).is_dir()
  assert sorted(p.name for p in tmp_path.iterdir()) == ['v00000010']
  export(11)
  assert sorted(p.name for p in tmp_path.iterdir()) == ['v00000010', 'v00000011']


def test_an_engine_that_declares_no_weight_updates_is_refused(tokenizer):
  """Capabilities are declared (`Engine.weight_updates`), not probed: a scripted engine's policy is fixed."""
  from osvl_jax.rollout import engine as engine_lib
  with pytest.raises(TypeError, match=r"ScriptedEngine takes no weight updates \(Engine.weight_updates=None\)"):
    weight_publish.WeightPublisher(engine_lib.ScriptedEngine(['x'], tokenizer))
  assert sc.SGLangEngine('http://127.0.0.1:9', tokenizer).weight_updates == 'disk'
