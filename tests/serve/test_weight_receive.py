"""`/update_weights_from_disk` refuses another architecture (deeper, wider, MoE, other parameter or compute dtype),
non-finite weights and finite weights that overflow when run: `success: false` naming what differs, and the old
weights keep answering bit-identically. The default loader reads a private copy of an HF folder, so one rewritten
in place while (or after) it loads cannot crash the server."""

import dataclasses
import subprocess
import sys
import textwrap

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from osvl_jax import checkpoints
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.rollout import weight_publish
from osvl_jax.rollout.embedded import jax_sampler
from osvl_jax.serve import service as service_lib
from osvl_jax.serve import weight_receive
from tests.serve.conftest import BUCKET, MAX_LEN, NEW, REPO, serve_in_thread

TINY = Qwen3VLConfig.tiny()


def _text(**kw):
  return dataclasses.replace(TINY, text=dataclasses.replace(TINY.text, **kw))


def _poisoned(value):
  """The served tiny model (seed 0) with one weight of one layer set to `value` (NaN / Inf)."""
  model = model_lib.Qwen3VLModel(TINY, nnx.Rngs(0))
  kernel = model.language_model.layers[1].mlp.down_proj.kernel
  kernel[...] = kernel[...].at[3, 5].set(value)
  return model


def _overflowing():
  """The served tiny model with the final norm's weight scaled by 1e38: every weight finite, the logits not."""
  model = model_lib.Qwen3VLModel(TINY, nnx.Rngs(0))
  weight = model.language_model.norm.weight
  weight[...] = weight[...] * 1e38
  return model


CANDIDATES = {   # model_path -> (model builder, words the refusal must name)
    'deeper': (lambda: model_lib.Qwen3VLModel(_text(num_hidden_layers=3), nnx.Rngs(0)), 'num_hidden_layers: 2 -> 3'),
    'wider': (lambda: model_lib.Qwen3VLModel(_text(hidden_size=96, intermediate_size=192), nnx.Rngs(0)),
              'hidden_size: 64 -> 96'),
    'moe': (lambda: model_lib.Qwen3VLModel(Qwen3VLConfig.tiny_moe(), nnx.Rngs(0)), 'num_experts: 0 -> 4'),
    'bf16': (lambda: model_lib.Qwen3VLModel(TINY, nnx.Rngs(0), param_dtype=jnp.bfloat16),
             'language_model/embed_tokens/embedding: (151936, 64) float32 -> (151936, 64) bfloat16'),
    'nan': (lambda: _poisoned(jnp.nan), 'non-finite values (NaN or Inf) in 1 parameter(s): '
            'language_model/layers/1/mlp/down_proj/kernel'),
    'inf': (lambda: _poisoned(jnp.inf), 'language_model/layers/1/mlp/down_proj/kernel'),
    'bf16_compute': (lambda: model_lib.Qwen3VLModel(TINY, nnx.Rngs(0), dtype=jnp.bfloat16),   # float32 params
                     "dtype: 'float32' -> 'bfloat16'"),
    'overflow': (_overflowing, 'the update overflows when run: a forward pass of 8 tokens gives non-finite'),
    'seed1': (lambda: model_lib.Qwen3VLModel(TINY, nnx.Rngs(1)), None),   # same architecture: accepted
}


@pytest.fixture(scope='module')
def url(tiny_model, tokenizer, processor):
  sampler = jax_sampler.JaxSampler(tiny_model, tokenizer, image_processor=processor, max_new_tokens=NEW,
                                   temperature=0.0, max_len=MAX_LEN, bucket=BUCKET, prefix_cache_slots=4)
  svc = service_lib.SamplerService(sampler, tokenizer, processor, model_path='tiny', weight_version='0',
                                   default_max_new_tokens=NEW, loader=lambda path: CANDIDATES[path][0]())
  with serve_in_thread(svc) as u:
    yield u
  svc.close()


def _greedy(url, contexts):
  body = {'input_ids': [int(i) for i in contexts[0][0]], 'return_logprob': True,
          'sampling_params': {'max_new_tokens': NEW, 'temperature': 0}}
  out = httpx.post(url + '/generate', json=body, timeout=60).json()
  return out['output_ids'], [e[0] for e in out['meta_info']['output_token_logprobs']], out['meta_info']


def test_other_architectures_and_nonfinite_weights_are_refused_and_the_old_ones_keep_serving(url, contexts):
  ids, lps, _ = _greedy(url, contexts)
  info = httpx.get(url + '/model_info', timeout=10).json()
  for path in ('deeper', 'wider', 'moe', 'bf16', 'bf16_compute', 'nan', 'inf', 'overflow'):
    r = httpx.post(url + '/update_weights_from_disk', json={'model_path': path, 'weight_version': 'bad'},
                   timeout=120)
    out = r.json()
    assert r.status_code == 400 and out['success'] is False, (path, out)
    assert CANDIDATES[path][1] in out['message'] and 'still serving weight_version 0' in out['message'], out
    got_ids, got_lps, meta = _greedy(url, contexts)
    assert (got_ids, got_lps) == (ids, lps), path          # bit-identical: the same weights answer
    assert meta['weight_version'] == '0'
    assert httpx.get(url + '/model_info', timeout=10).json() == info
  # The same architecture with other weights is accepted and answers differently.
  out = httpx.post(url + '/update_weights_from_disk', json={'model_path': 'seed1', 'weight_version': '1'},
                   timeout=120).json()
  assert out['success'] is True, out
  got_ids, got_lps, meta = _greedy(url, contexts)
  assert meta['weight_version'] == '1' and (got_ids, got_lps) != (ids, lps)


def test_check_update_on_exported_folders(tiny_model, tmp_path):
  """The real loader: an exported folder of the same architecture passes (in either dtype), a deeper one not."""
  for dtype in ('bfloat16', 'float32'):
    folder = weight_publish.export_version(tiny_model, tmp_path / dtype, 1, 32 * 32, 64 * 64, dtype=dtype)
    weight_receive.check_update(tiny_model, checkpoints.load_policy(str(folder))[0])
  deeper = CANDIDATES['deeper'][0]()
  folder = weight_publish.export_version(deeper, tmp_path / 'deeper', 1, 32 * 32, 64 * 64, dtype='float32')
  with pytest.raises(weight_receive.UpdateRefused, match='text.num_hidden_layers: 2 -> 3'):
    weight_receive.check_update(tiny_model, checkpoints.load_policy(str(folder))[0])
  assert weight_receive.nonfinite_params(tiny_model) == []
  assert np.isfinite(np.asarray(tiny_model.language_model.layers[1].mlp.down_proj.kernel[...])).all()


def test_smoke_forward_names_the_compute_dtype(tiny_model):
  class Relabelled:   # a model whose dtype attribute says float32 but that computes in bfloat16
    dtype = jnp.float32
  assert weight_receive.smoke_forward(tiny_model, tiny_model) is None
  bf16 = CANDIDATES['bf16_compute'][0]()
  assert weight_receive.smoke_forward(Relabelled, bf16) == ('the update computes in bfloat16, the served model in '
                                                            'float32')


RACE = textwrap.dedent("""
    import sys
    import numpy as np
    from osvl_jax.models.qwen3_vl import weights
    from osvl_jax.serve import weight_receive
    folder = sys.argv[1]
    mapped = weights.read_safetensors

    def racing(path):   # a writer rewrites the published file in place right after the loader mapped one
      out = mapped(path)
      with open(f'{folder}/model.safetensors', 'r+b') as f:
        f.truncate(4096)
      return out
    weights.read_safetensors = racing
    model = weight_receive.load_model(folder)
    print(float(np.abs(np.asarray(model.language_model.layers[1].mlp.down_proj.kernel[...])).sum()))
""")


def test_a_folder_rewritten_in_place_while_it_loads_cannot_crash_the_loader(tiny_model, tmp_path):
  folder = weight_publish.export_version(tiny_model, tmp_path, 1, 32 * 32, 64 * 64, dtype='float32')
  run = subprocess.run([sys.executable, '-c', RACE, str(folder)], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
  assert run.returncode == 0, (run.returncode, run.stderr[-2000:])   # before: -7 (SIGBUS)
  want = float(np.abs(np.asarray(tiny_model.language_model.layers[1].mlp.down_proj.kernel[...])).sum())
  assert float(run.stdout.split()[-1]) == pytest.approx(want)         # the weights as published


def test_a_file_that_changes_while_it_is_copied_is_refused(tiny_model, tmp_path, monkeypatch):
  folder = weight_publish.export_version(tiny_model, tmp_path, 1, 32 * 32, 64 * 64, dtype='float32')
  copy = weight_receive.shutil.copyfileobj

  def appending(src, dst, length):   # a writer appends to the file while it is copied
    copy(src, dst, length)
    with open(src.name, 'ab') as f:
      f.write(b'x')
  monkeypatch.setattr(weight_receive.shutil, 'copyfileobj', appending)
  with pytest.raises(ValueError, match='changed while it was read'):
    weight_receive.load_model(str(folder))


@pytest.mark.skipif(jax.device_count() < 8, reason='needs 8 (simulated) devices')
def test_an_update_on_a_rollout_mesh_is_read_straight_into_its_shardings(tiny_model, tokenizer, processor,
                                                                          tmp_path):
  """A server on tensor 2 x 4 replicas: its default loader reads the update into the layout's shardings (each
  weight's NamedSharding under DECODE_RULES, no single-device copy), with the published values."""
  from osvl_jax.models.qwen3_vl import sharding  # pylint: disable=g-import-not-at-top
  from osvl_jax.rollout.embedded import layout as layout_lib  # pylint: disable=g-import-not-at-top
  mesh = layout_lib.rollout_mesh({'tensor': 2, 'data': -1}, tiny_model, None, MAX_LEN)
  sampler = jax_sampler.JaxSampler(tiny_model, tokenizer, image_processor=processor, max_new_tokens=NEW,
                                   max_len=MAX_LEN, bucket=BUCKET, mesh=mesh)
  service = service_lib.SamplerService(sampler, tokenizer, processor, model_path='tiny', default_max_new_tokens=NEW)
  folder = weight_publish.export_version(tiny_model, tmp_path, 1, 32 * 32, 64 * 64, dtype='float32')
  try:
    model = service.loader(str(folder))
  finally:
    service.close()
  state = nnx.state(model, nnx.Param)
  want = sharding.state_shardings(state, mesh, layout_lib.DECODE_RULES)
  leaves, targets = jax.tree.leaves(state), jax.tree.leaves(want)
  assert len(leaves) == len(targets) > 0
  assert any(len(t.device_set) == 8 and not t.is_fully_replicated for t in targets)   # the rules shard some
  for got, target in zip(leaves, targets):
    assert got.sharding.is_equivalent_to(target, got.ndim), (got.sharding, target)
  np.testing.assert_array_equal(np.asarray(model.language_model.layers[1].mlp.down_proj.kernel[...]),
                                np.asarray(tiny_model.language_model.layers[1].mlp.down_proj.kernel[...]))
