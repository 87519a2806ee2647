"""The per-shard image layout (`vision_inputs`, `vision_layout.shard_vision_inputs`) gives the flat (HF-parity) forward.

Training on a mesh lays each batch shard's patches out on its own ([S, P, 1536]) with their host geometry as arrays
(interpolation taps / weights, rotary positions, segment ids [S, P, ...]); the vision tower then attends within
frames by segment id instead of looping over static segments, and each shard's merged tokens fill its own rows'
image tokens (`model.scatter_shards`). Here, on one device, those give the hidden states of the flat path (images
of different grids, rows without images, a row with two images; padded to the fullest shard or to a fixed budget),
a wrong shard assignment does not, and a jitted forward compiles once for different grids of the same budget.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from osvl_jax import compile_cache
from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl import vision
from osvl_jax.models.qwen3_vl import vision_layout

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


def _layout(ids, pixels, grid, shards, budget=0):
  out = vision_layout.shard_vision_inputs(pixels, grid, vision_layout.row_patches(ids), shards, CONFIG.vision, budget)
  return out['pixel_values'], {k: out[f'vision_{k}'] for k in vision.GEOMETRY_FIELDS}


@pytest.mark.parametrize('shards, query_block, budget', [(1, 512, 0), (2, 512, 0), (4, 512, 0), (1, 5, 0),
                                                         (2, 7, 0), (2, 512, 48), (4, 7, 40)])
def test_per_shard_layout_gives_the_flat_hidden_states(inputs, shards, query_block, budget, monkeypatch):
  """Also with query blocks smaller than a shard's patches (padded last block, blocks across images), and with the
  shards padded to a fixed patch budget (padding patches change nothing)."""
  monkeypatch.setattr(vision, 'QUERY_BLOCK', query_block)
  model, ids, pos, pixels, grid, flat = inputs
  laid_out, geometry = _layout(ids, pixels, grid, shards, budget)
  if budget:
    assert laid_out.shape[:2] == (shards, budget) and (geometry['segment_ids'] == -1).any()
  got, _ = model(ids, pos, None, laid_out, vision_inputs=geometry)
  assert np.abs(np.asarray(got) - flat).max() <= 2e-5 * np.abs(flat).max()


def test_the_layout_matches_the_flat_geometry(inputs):
  """Each shard's real patches carry the flat path's geometry rows, in order; padding is zero with segment -1."""
  _, ids, _, pixels, grid, _ = inputs
  meta = vision.vision_metadata(grid, CONFIG.vision)
  laid_out, geometry = _layout(ids, pixels, grid, 2, 48)
  real = geometry['segment_ids'] >= 0
  np.testing.assert_array_equal(laid_out[real], pixels)
  assert not laid_out[~real].any()
  np.testing.assert_array_equal(geometry['interp_indices'][real], meta.interp_indices)
  np.testing.assert_array_equal(geometry['interp_weights'][real], meta.interp_weights)
  np.testing.assert_array_equal(geometry['hw_positions'][real], meta.hw_positions)
  np.testing.assert_array_equal(geometry['segment_ids'][real], meta.segment_ids)
  assert geometry['interp_indices'].dtype == np.int32 and geometry['interp_weights'].dtype == np.float32
  assert not geometry['interp_weights'][~real].any()


def test_a_batch_over_the_patch_budget_names_the_need_and_the_budget(inputs):
  _, ids, _, pixels, grid, _ = inputs
  with pytest.raises(ValueError, match='a batch shard needs 36 image patches, over the budget patches_per_shard=32'):
    _layout(ids, pixels, grid, 2, 32)
  with pytest.raises(ValueError, match='patches_per_shard=42 is not a multiple of spatial_merge_size'):
    _layout(ids, pixels, grid, 2, 42)
  empty = vision_layout.shard_vision_inputs(None, None, np.zeros(4, np.int64), 2, CONFIG.vision, 8)
  assert empty['pixel_values'].shape == (2, 8, 1536) and (empty['vision_segment_ids'] == -1).all()


def test_a_jitted_per_shard_forward_compiles_once_for_different_grids(inputs):
  """Two batches with different image grids (and the same budget) run one program, each matching its flat pass."""
  model, ids, pos, pixels, grid, flat = inputs
  rng = np.random.default_rng(1)
  ids2 = rng.integers(0, 1000, (4, 24)).astype(np.int32)
  ids2[0, 3:3 + 6] = CONFIG.image_token_id                 # (1, 4, 6) in row 0; (1, 6, 2) + (1, 2, 2) in row 3
  ids2[3, 1:1 + 3] = CONFIG.image_token_id
  ids2[3, 6:6 + 1] = CONFIG.image_token_id
  grid2 = np.array([(1, 4, 6), (1, 6, 2), (1, 2, 2)])
  pos2, _ = rope.get_rope_index(ids2, grid2)
  pixels2 = rng.standard_normal((int(np.prod(grid2, axis=1).sum()), 1536)).astype(np.float32)
  flat2 = np.asarray(model(ids2, pos2, None, pixels2, grid2)[0])
  fwd = nnx.jit(lambda m, i, p, x, g: m(i, p, None, x, vision_inputs=g)[0])
  compiles = []
  for i, p, x, g, want in ((ids, pos, pixels, grid, flat), (ids2, pos2, pixels2, grid2, flat2)):
    laid_out, geometry = _layout(i, x, g, 2, 48)
    args = jax.tree.map(jnp.asarray, (i, p, laid_out, geometry))
    before = compile_cache.counts()['compiles_total']
    got = np.asarray(fwd(model, *args))
    compiles.append(compile_cache.counts()['compiles_total'] - before)
    assert np.abs(got - want).max() <= 2e-5 * np.abs(want).max()
  assert compiles[0] >= 1 and compiles[1] == 0, compiles


def test_a_wrong_shard_assignment_changes_the_hidden_states(inputs):
  """The check above can fail: shards 0 and 1 swapped (rows 0-1 get rows 2-3's images) move the output."""
  model, ids, pos, pixels, grid, flat = inputs
  laid_out, geometry = _layout(ids, pixels, grid, 2)
  got, _ = model(ids, pos, None, laid_out[::-1], vision_inputs={k: v[::-1] for k, v in geometry.items()})
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


def test_the_geometry_must_match_the_laid_out_pixels(inputs):
  model, ids, pos, pixels, grid, _ = inputs
  laid_out, geometry = _layout(ids, pixels, grid, 2)
  bad = dict(geometry, segment_ids=geometry['segment_ids'][:, :-1])
  with pytest.raises(ValueError, match=r"segment_ids'\] \(2, 63\) does not match pixel_values \(2, 64, 1536\)"):
    model(ids, pos, None, laid_out, vision_inputs=bad)
  with pytest.raises(ValueError, match='vision_inputs lacks'):
    model(ids, pos, None, laid_out, vision_inputs={'segment_ids': geometry['segment_ids']})
