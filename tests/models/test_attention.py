"""Blockwise causal attention (`attention.causal_attention`) against the dense reference: forward and gradients,
left/right padding, fully masked rows, T not a multiple of the block; and the text model's two paths."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from osvl_jax.models.qwen3_vl import attention
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig

TOL = 1e-5  # absolute; gradients also get rtol=TOL (entries reach ~20, where one float32 ulp is 2e-6)


def _inputs(b=3, t=77, kv=2, g=2, d=16, seed=0):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((b, t, kv, g, d)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((b, t, kv, d)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((b, t, kv, d)), jnp.float32)
  return q, k, v


def _key_mask(kind, b, t):
  """bool [B, T]: 'none' (all real), 'right' or 'left' padding (row 0 unpadded), or 'both' (left and right)."""
  lengths = np.array([t, t - 13, t // 3, 1][:b])
  pos = np.arange(t)[None]
  if kind == 'none':
    return jnp.ones((b, t), bool)
  if kind == 'right':
    return jnp.asarray(pos < lengths[:, None])
  if kind == 'left':
    return jnp.asarray(pos >= (t - lengths)[:, None])
  return jnp.asarray((pos >= 5) & (pos < 5 + lengths[:, None] - 5))


def _dense(q, k, v, key_mask):
  t = q.shape[1]
  return attention.dense_attention(q, k, v, jnp.tril(jnp.ones((t, t), bool))[None] & key_mask[:, None, :])


@pytest.mark.parametrize('kind', ['none', 'right', 'left', 'both'])
@pytest.mark.parametrize('block', [16, 32, 128])
def test_blockwise_matches_dense(kind, block):
  q, k, v = _inputs(b=4, t=77)
  key_mask = _key_mask(kind, 4, 77)
  blockwise = lambda q, k, v: attention.causal_attention(q, k, v, key_mask, block)  # noqa: E731
  dense = lambda q, k, v: _dense(q, k, v, key_mask)  # noqa: E731
  out_b, out_d = jax.jit(blockwise)(q, k, v), jax.jit(dense)(q, k, v)
  assert not np.isnan(np.asarray(out_b)).any()
  np.testing.assert_allclose(out_b, out_d, atol=TOL, rtol=0)

  cotangent = jnp.asarray(np.random.default_rng(1).standard_normal(out_d.shape), jnp.float32)
  def grads(f):
    return jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * cotangent), argnums=(0, 1, 2)))(q, k, v)
  for gb, gd in zip(grads(blockwise), grads(dense)):
    assert not np.isnan(np.asarray(gb)).any()
    np.testing.assert_allclose(gb, gd, atol=TOL, rtol=TOL)


def test_fully_masked_rows_are_uniform_average():
  q, k, v = _inputs(b=2, t=40)
  key_mask = _key_mask('left', 2, 40)                    # row 1: the first 13 tokens are padding
  out = attention.causal_attention(q, k, v, key_mask, block=16)
  np.testing.assert_allclose(out[1, :13], jnp.broadcast_to(v[1].mean(0)[None, :, None], (13, 2, 2, 16)),
                             atol=TOL, rtol=0)


@pytest.mark.parametrize('kind', ['right', 'left'])
def test_text_model_blockwise_matches_dense(kind):
  config = Qwen3VLConfig.tiny()
  b, t = 3, 150
  model = model_lib.Qwen3VLModel(config, rngs=nnx.Rngs(0))
  key_mask = _key_mask(kind, b, t)
  ids = jnp.asarray(np.random.default_rng(0).integers(0, 151000, (b, t)), jnp.int32)
  pos = jnp.asarray(rope.text_position_ids(np.zeros(b, np.int64), t))
  cotangent = jnp.asarray(np.random.default_rng(1).standard_normal((b, t, config.text.hidden_size)), jnp.float32)

  def run(impl):
    model.language_model.attention_impl, model.language_model.attention_block = impl, 64

    def loss(m):
      hidden, _ = m(ids, pos, key_mask)
      return jnp.sum(jnp.where(key_mask[..., None], hidden * cotangent, 0.0)), hidden
    (value, hidden), grads = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(model)
    return hidden, grads

  hidden_b, grads_b = run('blockwise')
  hidden_d, grads_d = run('dense')
  np.testing.assert_allclose(hidden_b, hidden_d, atol=TOL, rtol=0)
  for gb, gd in zip(jax.tree.leaves(nnx.state(grads_b)), jax.tree.leaves(nnx.state(grads_d))):
    scale = max(1.0, float(jnp.max(jnp.abs(gd))))     # float32 rounding of sums over all B*T tokens
    np.testing.assert_allclose(gb, gd, atol=TOL * scale, rtol=0)


def test_per_layer_remat_keeps_loss_and_gradients():
  config = Qwen3VLConfig.tiny()
  model = model_lib.Qwen3VLModel(config, nnx.Rngs(0))
  ids = np.random.default_rng(0).integers(0, 151000, size=(2, 12))
  pos, _ = rope.get_rope_index(ids)

  def loss(m):
    return m.logits(m(ids, pos)[0]).std()

  ref_loss, ref_grads = nnx.jit(nnx.value_and_grad(loss))(model)
  model.language_model.remat = True
  got_loss, got_grads = nnx.jit(nnx.value_and_grad(loss))(model)
  assert abs(float(got_loss) - float(ref_loss)) <= 1e-6
  for g, r in zip(jax.tree.leaves(got_grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize('block', [16, 128])
def test_packed_segments_attend_only_within_themselves(block):
  """Packed rows (int segment ids, 0 = padding): each packed sequence's outputs and its q/k/v gradients are those of
  the sequence attended alone, and the blockwise path equals the dense one with `attention.segment_mask`."""
  q, k, v = _inputs(b=2, t=77)
  spans = [[(0, 30), (30, 50), (50, 77)], [(0, 40), (40, 65)]]          # row 1: 12 padding tokens at the end
  seg = np.zeros((2, 77), np.int32)
  for r, row in enumerate(spans):
    for j, (s, e) in enumerate(row):
      seg[r, s:e] = j + 1
  seg = jnp.asarray(seg)
  cotangent = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape), jnp.float32)
  cotangent = cotangent * (seg > 0)[:, :, None, None, None]                # the loss reads real tokens only
  packed_fn = lambda q, k, v: jnp.sum(attention.causal_attention(q, k, v, seg, block) * cotangent)  # noqa: E731
  out = jax.jit(lambda q, k, v: attention.causal_attention(q, k, v, seg, block))(q, k, v)
  grads = jax.jit(jax.grad(packed_fn, argnums=(0, 1, 2)))(q, k, v)
  dense = jax.jit(lambda q, k, v: attention.dense_attention(q, k, v, attention.segment_mask(seg)))(q, k, v)
  np.testing.assert_allclose(out, dense, atol=TOL, rtol=0)
  alone = jax.jit(lambda q, k, v: attention.causal_attention(q, k, v, None, block))
  alone_grad = jax.jit(jax.grad(lambda q, k, v, c: jnp.sum(attention.causal_attention(q, k, v, None, block) * c),
                                argnums=(0, 1, 2)))
  for r, row in enumerate(spans):
    for s, e in row:
      part = lambda x: x[r:r + 1, s:e]  # noqa: E731
      np.testing.assert_allclose(out[r:r + 1, s:e], alone(part(q), part(k), part(v)), atol=TOL, rtol=0)
      alone_grads = alone_grad(part(q), part(k), part(v), part(cotangent))
      for g, g_alone in zip(grads, alone_grads):
        np.testing.assert_allclose(g[r:r + 1, s:e], g_alone, atol=TOL, rtol=TOL)
  # A bool mask is the one-segment case: the same mask as segment ids 0 / 1.
  key_mask = _key_mask('both', 2, 77)
  np.testing.assert_array_equal(attention.segment_mask(key_mask), attention.segment_mask(key_mask.astype(jnp.int32)))
  np.testing.assert_array_equal(attention.segment_mask(key_mask),
                                jnp.tril(jnp.ones((77, 77), bool))[None] & key_mask[:, None, :])


@pytest.mark.parametrize('kind', ['none', 'right', 'both', 'packed'])
def test_fused_path_matches_blockwise(kind):
  """`attention.fused_causal_attention` (the cuDNN path's masks, run here through jax.nn.dot_product_attention's
  'xla' implementation) equals the blockwise kernel, forward and q/k/v gradients, on every row that sees a key;
  a row that sees none ('both': the leading padding) is finite."""
  q, k, v = _inputs(b=3, t=77)
  if kind == 'packed':
    seg = np.zeros((3, 77), np.int32)
    seg[0, :30], seg[0, 30:77] = 1, 2
    seg[1, :40], seg[1, 40:65] = 1, 2                                    # 12 padding tokens at the end
    seg[2, :20] = 1
    key_mask = jnp.asarray(seg)
  else:
    key_mask = _key_mask(kind, 3, 77)
  fused_mask = None if kind == 'none' else key_mask
  sees = np.asarray(attention.segment_mask(key_mask).any(-1))            # [B, T]: rows with a visible key
  cotangent = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape), jnp.float32)
  cotangent = cotangent * jnp.asarray(sees)[:, :, None, None, None]
  fused = lambda q, k, v: attention.fused_causal_attention(q, k, v, fused_mask, implementation='xla')  # noqa: E731
  blockwise = lambda q, k, v: attention.causal_attention(q, k, v, key_mask, 16)  # noqa: E731
  out_f, out_b = jax.jit(fused)(q, k, v), jax.jit(blockwise)(q, k, v)
  assert np.isfinite(np.asarray(out_f)).all()
  np.testing.assert_allclose(np.asarray(out_f)[sees], np.asarray(out_b)[sees], atol=TOL, rtol=0)

  def grads(f):
    return jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * cotangent), argnums=(0, 1, 2)))(q, k, v)
  for gf, gb in zip(grads(fused), grads(blockwise)):
    assert np.isfinite(np.asarray(gf)).all()
    np.testing.assert_allclose(gf, gb, atol=TOL, rtol=TOL)


def test_text_model_cudnn_impl_runs_the_fused_kernel(monkeypatch):
  """attention_impl = 'cudnn' routes the no-cache forward through `fused_causal_attention` with the model's mask
  (here with the 'xla' implementation, since cuDNN needs a GPU): same hidden states as the blockwise path."""
  from osvl_jax.models.qwen3_vl import text
  monkeypatch.setattr(text, 'FUSED_IMPLEMENTATION', 'xla')
  calls = []
  real = attention.fused_causal_attention
  monkeypatch.setattr(attention, 'fused_causal_attention', lambda *a, **kw: calls.append(kw) or real(*a, **kw))
  config = Qwen3VLConfig.tiny()
  b, t = 2, 40
  model = model_lib.Qwen3VLModel(config, rngs=nnx.Rngs(0))
  key_mask = _key_mask('right', b, t)
  ids = jnp.asarray(np.random.default_rng(0).integers(0, 151000, (b, t)), jnp.int32)
  pos = jnp.asarray(rope.text_position_ids(np.zeros(b, np.int64), t))
  hidden_b = model(ids, pos, key_mask)[0]
  model.language_model.attention_impl = 'cudnn'
  hidden_f = model(ids, pos, key_mask)[0]
  assert calls and all(kw == {'implementation': 'xla'} for kw in calls)
  real_rows = np.asarray(key_mask)
  np.testing.assert_allclose(np.asarray(hidden_f)[real_rows], np.asarray(hidden_b)[real_rows], atol=1e-4, rtol=0)


def test_config_names_the_attention_kernel():
  import ml_collections
  from osvl_jax import checkpoints
  config = ml_collections.ConfigDict({'model': {'name': 'tiny', 'attention': 'cudnn', 'remat': True}})
  model = checkpoints.build_model(config)
  assert (model.language_model.attention_impl, model.language_model.remat) == ('cudnn', True)
  config.model.attention = 'flash'
  with pytest.raises(ValueError, match=r"config.model.attention='flash'"):
    checkpoints.build_model(config)
