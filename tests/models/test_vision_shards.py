"""The per-shard image layout (`patch_index`, `batching.shard_images`) gives the flat (HF-parity) forward pass.

Training on a mesh lays each batch shard's patches out on its own ([S, P, 1536]); the vision tower then attends
within frames by segment id instead of looping over static segments, and each shard's merged tokens fill its own
rows' image tokens (`model.scatter_shards`). Here, on one device, those give the hidden states of the flat path
(images of different grids, rows without images, a row with two images), and a wrong shard assignment does not.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import rope
from osvl_jax.train import batching

CONFIG = config_lib.Qwen3VLConfig.tiny()
ROW_GRIDS = [[(1, 4, 4)], [], [(1, 4, 6), (1, 2, 2)], [(1, 2, 4)]]


@pytest.fixture(scope='module')
def inputs():
  rng = np.random.default_rng(0)
  ids = rng.integers(0, 1000, (4, 24)).astype(np.int32)
  for row, grids in enumerate(ROW_GRIDS):
    start = 2
    for _, h, w in grids:
      ids[row, start:start + h * w // 4] = CONFIG.image_token_id
      start += h * w // 4 + 1
  grid = np.array([g for row in ROW_GRIDS for g in row])
  pos, _ = rope.get_rope_index(ids, grid)
  pixels = rng.standard_normal((int(np.prod(grid, axis=1).sum()), 1536)).astype(np.float32)
  model = model_lib.Qwen3VLModel(CONFIG, rngs=nnx.Rngs(0))
  flat, _ = model(ids, pos, None, pixels, grid)
  return model, ids, pos, pixels, grid, np.asarray(flat)


@pytest.mark.parametrize('shards, query_block', [(1, 512), (2, 512), (4, 512), (1, 5), (2, 7)])
def test_per_shard_layout_gives_the_flat_hidden_states(inputs, shards, query_block, monkeypatch):
  """Also with query blocks smaller than a shard's patches (padded last block, blocks across images)."""
  from osvl_jax.models.qwen3_vl import vision
  monkeypatch.setattr(vision, 'QUERY_BLOCK', query_block)
  model, ids, pos, pixels, grid, flat = inputs
  laid_out, index = batching.shard_images(ids, pixels, shards)
  got, _ = model(ids, pos, None, laid_out, grid, patch_index=index)
  assert np.abs(np.asarray(got) - flat).max() <= 2e-5 * np.abs(flat).max()


def test_a_wrong_shard_assignment_changes_the_hidden_states(inputs):
  """The check above can fail: shards 0 and 1 swapped (rows 0-1 get rows 2-3's images) move the output."""
  model, ids, pos, pixels, grid, flat = inputs
  laid_out, index = batching.shard_images(ids, pixels, 2)
  got, _ = model(ids, pos, None, laid_out[::-1], grid, patch_index=index[::-1])
  assert np.abs(np.asarray(got) - flat).max() > 1e-2


def test_scatter_shards_fills_each_shards_rows_from_its_own_tokens():
  """4 rows of 3 tokens in 2 shards; shard 0 has tokens (10, 11) for rows 0-1, shard 1 one token (20) + padding."""
  mask = np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0], [0, 1, 0]], bool)
  x = np.zeros((4, 3, 1), np.float32)
  features = np.array([[[10.], [11.]], [[20.], [-1.]]], np.float32)     # [S=2, M=2, H=1]
  deep = features + 100
  out, (ds,) = model_lib.scatter_shards(jnp.asarray(x), jnp.asarray(mask), jnp.asarray(features), [deep])
  np.testing.assert_array_equal(np.asarray(out)[..., 0], [[0, 10, 0], [11, 0, 0], [0, 0, 0], [0, 20, 0]])
  # DeepStack in the batch's row-major image-token order (what the text model adds): 110, 111, 120, then filler.
  np.testing.assert_array_equal(np.asarray(ds)[:3, 0], [110, 111, 120])
  with pytest.raises(ValueError, match='3 image shards do not split the 4 rows'):
    model_lib.scatter_shards(jnp.asarray(x), jnp.asarray(mask), jnp.zeros((3, 2, 1)))


def test_patch_index_must_match_the_laid_out_pixels(inputs):
  model, ids, pos, pixels, grid, _ = inputs
  laid_out, index = batching.shard_images(ids, pixels, 2)
  with pytest.raises(ValueError, match=r'patch_index \(2, 35\) does not match pixel_values \(2, 36, 1536\)'):
    model(ids, pos, None, laid_out, grid, patch_index=index[:, :-1])
