"""`scan_layers=True` (stacked decoder layers under `jax.lax.scan`) against the unrolled layer loop: same initial
parameters, same logits and gradients (with and without remat, with DeepStack image features), same KV-cache
decoding, same HF state dict, and the stacked layout's sharding specs. HF parity of the scanned model itself is in
the parity matrix (`scan_*` cases, tests/models/test_parity.py)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax import traverse_util
from jax.sharding import PartitionSpec as P

from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl import sharding
from osvl_jax.models.qwen3_vl import weights
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.models.qwen3_vl.model import Qwen3VLModel

IMAGE = 1000


def _config(moe=False, layers=3):
  """Tiny config, 1,024-token vocabulary (image token 1000), 3 layers so DeepStack (2 levels) skips one layer."""
  base = Qwen3VLConfig.tiny_moe() if moe else Qwen3VLConfig.tiny()
  text = dataclasses.replace(base.text, vocab_size=1024, num_hidden_layers=layers)
  return dataclasses.replace(base, text=text, image_token_id=IMAGE)


def _inputs():
  """ids [2, 20] with one 4x4-patch image (4 merged tokens) in row 0, row 1 left-padded."""
  rng = np.random.default_rng(1)
  ids = rng.integers(0, 1000, size=(2, 20))
  ids[0, 3:7] = IMAGE
  mask = np.ones((2, 20), bool)
  mask[1, :4] = False
  grid = np.array([[1, 4, 4]])
  pixels = rng.standard_normal((16, 1536)).astype(np.float32)
  pos, _ = rope.get_rope_index(ids, grid, mask, image_token_id=IMAGE)
  return jnp.asarray(ids, jnp.int32), jnp.asarray(pos), jnp.asarray(mask), jnp.asarray(pixels), grid


def _loss(model, ids, pos, mask, pixels, grid):
  logits = model.logits(model(ids, pos, mask, pixels, grid)[0])
  logp = jax.nn.log_softmax(logits[:, :-1])
  nll = -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
  return (nll * mask[:, 1:]).sum() / mask[:, 1:].sum(), logits


def _loss_logits_grads(model, remat=False):
  model.language_model.remat = remat
  ids, pos, mask, pixels, grid = _inputs()
  step = nnx.jit(nnx.value_and_grad(_loss, has_aux=True), static_argnums=5)
  (loss, logits), grads = step(model, ids, pos, mask, pixels, tuple(map(tuple, grid.tolist())))
  return float(loss), np.asarray(logits), grads


def _per_layer(grads_state, scanned: bool, num_layers: int):
  """{(layer, *path): array} of the decoder-layer gradients, stacked ones split per layer."""
  pure = nnx.to_pure_dict(grads_state)['language_model']['layers']
  out = {}
  for path, value in traverse_util.flatten_dict(pure).items():
    value = np.asarray(value)
    if scanned:
      out.update({(n,) + path: value[n] for n in range(num_layers)})
    else:
      out[path] = value
  return out


def test_scanned_model_has_the_unrolled_initial_parameters_stacked():
  config = _config()
  unrolled = Qwen3VLModel(config, nnx.Rngs(0))
  scanned = Qwen3VLModel(config, nnx.Rngs(0), scan_layers=True)
  q = scanned.language_model.layers.self_attn.q_proj.kernel[...]
  assert q.shape == (3, 64, 64)
  for n in range(3):
    np.testing.assert_array_equal(q[n], unrolled.language_model.layers[n].self_attn.q_proj.kernel[...])
  assert weights.to_hf_state_dict(scanned).keys() == weights.to_hf_state_dict(unrolled).keys()
  for name, value in weights.to_hf_state_dict(unrolled).items():
    np.testing.assert_array_equal(weights.to_hf_state_dict(scanned)[name], value, err_msg=name)


@pytest.mark.parametrize('moe,remat', [(False, False), (False, True), (True, False)])
def test_scan_equals_unrolled_loss_logits_and_gradients(moe, remat):
  config = _config(moe=moe)
  ref_loss, ref_logits, ref_grads = _loss_logits_grads(Qwen3VLModel(config, nnx.Rngs(0)))
  loss, logits, grads = _loss_logits_grads(Qwen3VLModel(config, nnx.Rngs(0), scan_layers=True), remat)
  assert abs(loss - ref_loss) <= 1e-6
  np.testing.assert_allclose(logits, ref_logits, atol=2e-5, rtol=0)
  # Non-layer parameters (embedding, vision tower incl. DeepStack mergers, head) and every layer's gradient.
  for key in ('visual', 'lm_head'):
    if key in ref_grads:
      for g, r in zip(jax.tree.leaves(grads[key]), jax.tree.leaves(ref_grads[key])):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
  got = _per_layer(grads, True, 3)
  ref = _per_layer(ref_grads, False, 3)
  assert got.keys() == ref.keys()
  for path, r in ref.items():
    np.testing.assert_allclose(got[path], r, rtol=1e-4, atol=1e-6, err_msg=str(path))
  # The gradient reaches every layer (a scan that dropped a layer's contribution would leave zeros).
  assert all(np.abs(got[(n, 'mlp', 'down_proj' if not moe else 'experts', 'kernel' if not moe else 'down_proj')]
                    ).max() > 0 for n in range(3))


def test_scan_kv_cache_decode_matches_full_forward():
  config = _config()
  ids, pos, mask, pixels, grid = _inputs()
  for scan in (False, True):
    model = Qwen3VLModel(config, nnx.Rngs(0), scan_layers=scan)
    full = np.asarray(model.logits(model(ids[:1], pos[:, :1], None, pixels, grid)[0]))
    cache = model.init_cache(1, 32)
    hidden, cache = model(ids[:1, :12], pos[:, :1, :12], None, pixels, grid, cache=cache,
                          cache_index=jnp.zeros((1,), jnp.int32))
    steps = [np.asarray(model.logits(hidden))[:, -1]]
    for t in range(12, 19):
      hidden, cache = model(ids[:1, t:t + 1], pos[:, :1, t:t + 1], None, cache=cache,
                            cache_index=jnp.full((1,), t, jnp.int32))
      steps.append(np.asarray(model.logits(hidden))[:, -1])
    np.testing.assert_allclose(np.stack(steps, 1)[0], full[0, 11:19], atol=2e-5, rtol=0, err_msg=f'scan={scan}')


def test_scan_rejects_a_moe_stack_mixing_dense_and_sparse_layers():
  base = _config(moe=True)
  mixed = dataclasses.replace(base, text=dataclasses.replace(base.text, mlp_only_layers=(0,)))
  with pytest.raises(ValueError, match='scan_layers needs identical decoder layers'):
    Qwen3VLModel(mixed, nnx.Rngs(0), scan_layers=True)


def test_stacked_parameters_get_a_leading_unsharded_layers_axis():
  config = Qwen3VLConfig.tiny_moe(tie_word_embeddings=False)
  specs = sharding.param_specs(nnx.eval_shape(lambda: Qwen3VLModel(config, nnx.Rngs(0), scan_layers=True)))
  layers = specs['language_model']['layers']
  assert layers['self_attn']['q_proj']['kernel'] == P(None, 'fsdp', 'tensor')
  assert layers['mlp']['experts']['gate_up_proj'] == P(None, 'expert', 'fsdp', 'tensor')
  assert layers['input_layernorm']['weight'] == P(None, None)
  assert specs['lm_head']['kernel'] == P('fsdp', 'tensor')
