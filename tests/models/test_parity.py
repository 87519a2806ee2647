"""Qwen3-VL in Flax NNX against transformers (PyTorch, float32) on random tiny configs: same weights, same inputs
-> logits within 2e-5 max-abs (DESIGN.md section 3). The parity matrix itself lives in
`osvl_jax/models/qwen3_vl/parity.py` (shared with `bench/parity.py`)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

from osvl_jax.models.qwen3_vl import model as model_lib  # noqa: E402
from osvl_jax.models.qwen3_vl import parity  # noqa: E402
from osvl_jax.models.qwen3_vl import rope  # noqa: E402
from osvl_jax.models.qwen3_vl import vision  # noqa: E402
from osvl_jax.models.qwen3_vl import weights  # noqa: E402
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig  # noqa: E402
from osvl_jax.paths import data_dir  # noqa: E402
from osvl_jax.models.qwen3_vl.parity import IM_END, IM_START, IMAGE, TOL  # noqa: E402

_hf_model = parity.hf_model
_image_tokens = parity.image_tokens
_hf_logits = parity.hf_logits
_flax_logits = parity.flax_logits


@pytest.fixture(scope='module')
def tied(tmp_path_factory):
  """(hf model, flax model, folder) for the tiny tied config, loaded through save_pretrained/safetensors."""
  folder = tmp_path_factory.mktemp('tiny_tied')
  hf, model = parity.hf_and_flax(Qwen3VLConfig.tiny(), folder=folder)
  return hf, model, folder


@pytest.fixture(scope='module')
def images():
  return parity.load_images()


@pytest.mark.parametrize('case', parity.CASES)
def test_parity_matrix_case_matches_transformers(case):
  """Each case of the parity matrix (text, untied head, one image, several images over turns, left+right padded
  batch, MoE, bf16) within tolerance on real positions; see `osvl_jax/models/qwen3_vl/parity.py`."""
  result = parity.run_case(case)
  assert result.got.shape == result.ref.shape and result.got.dtype == np.float32
  assert np.abs(result.ref).max() > 0.1
  tol = parity.BF16_TOL if case == 'bf16' else TOL
  assert result.max_abs_diff() <= tol, (case, result.max_abs_diff())


def test_config_round_trips_through_transformers_and_reads_the_8b_config():
  tiny = Qwen3VLConfig.tiny()
  assert Qwen3VLConfig.from_hf_dict(transformers.Qwen3VLConfig(**tiny.to_hf_dict()).to_dict()) == tiny
  path = data_dir() / 'qwen' / 'configs' / 'Qwen3-VL-8B-Instruct.config.json'
  big = Qwen3VLConfig.from_hf_dict(json.loads(path.read_text()))
  assert (big.text.hidden_size, big.text.num_hidden_layers, big.text.num_key_value_heads) == (4096, 36, 8)
  assert big.text.mrope_section == (24, 20, 20) and big.text.mrope_interleaved and big.text.rope_theta == 5e6
  assert big.vision.deepstack_visual_indexes == (8, 16, 24) and big.vision.out_hidden_size == 4096
  assert not big.tie_word_embeddings


def test_one_image_logits_match_transformers(tied, images):
  hf, model, _ = tied
  pixel_values, grid = images[0]
  assert grid.tolist() == [[1, 6, 10]]
  ids = np.array([[IM_START, 872, 198] + _image_tokens(grid[0]) + [3838, 374, 419, 30, IM_END, 198]])
  ref = _hf_logits(hf, ids, pixel_values=pixel_values, grid=grid)
  got = _flax_logits(model, ids, pixel_values=pixel_values, grid=grid)
  assert np.abs(got - ref).max() <= TOL
  # The image changes the logits (vision tower + DeepStack are really used).
  pos, _ = rope.get_rope_index(ids, grid)
  no_pixels = np.asarray(model.logits(model(ids, pos)[0]))
  assert np.abs(got - no_pixels).max() > 1e-3


def test_get_rope_index_matches_transformers(tied):
  hf, _, _ = tied
  grid = np.array([[1, 4, 6], [1, 6, 2], [1, 2, 2]])
  row0 = [1, 2] + _image_tokens(grid[0]) + [3] + _image_tokens(grid[1]) + [4, 5]
  row1 = [7] + _image_tokens(grid[2]) + [8, 9, 10]
  length = len(row0) + 2
  ids = np.zeros((2, length), np.int64)
  mask = np.zeros((2, length), bool)
  ids[0, :len(row0)], mask[0, :len(row0)] = row0, True                      # right padding
  ids[1, -len(row1):], mask[1, -len(row1):] = row1, True                    # left padding
  pos, deltas = rope.get_rope_index(ids, grid, mask)
  ref_pos, ref_deltas = hf.model.get_rope_index(torch.tensor(ids), torch.tensor((ids == IMAGE).astype(np.int32)),
                                                torch.tensor(grid), attention_mask=torch.tensor(mask.astype(int)))
  np.testing.assert_array_equal(pos, ref_pos.numpy())
  np.testing.assert_array_equal(deltas, ref_deltas.numpy())
  assert pos.dtype == np.int32 and deltas.shape == (2, 1)
  # Spot values: image 0 (merged grid 2x3) starts at position 3 after "1 2 <vision_start>".
  assert pos[:, 0, 3].tolist() == [3, 3, 3] and pos[:, 0, 8].tolist() == [3, 4, 5]
  assert pos[:, 0, 9].tolist() == [6, 6, 6]                                   # vision_end: 3 + max(2, 3)


def test_kv_cache_decode_matches_full_forward(tied, images):
  """Rows prefilled separately (different lengths, one with an image) into one batched cache, then decoded
  together under jit: every step's logits equal a full forward over prompt + generated tokens."""
  _, model, _ = tied
  pv, grid = images[0]
  prompts = [[IM_START, 872] + _image_tokens(grid[0]) + [30, IM_END], [IM_START, 872, 5, 6, 7]]
  new_tokens = np.array([[11, 12, 13], [21, 22, 23]])
  cache = model.init_cache(batch=2, max_len=48)

  @nnx.jit
  def step(m, ids, pos, c, idx):
    hidden, c = m(ids, pos, cache=c, cache_index=idx)
    return m.logits(hidden), c

  next_pos, prefill_logits = [], []
  for row, prompt in enumerate(prompts):
    ids = np.array([prompt])
    pix, g = (pv, grid) if row == 0 else (None, None)
    pos, delta = rope.get_rope_index(ids, g)
    sub = model_lib.cache_rows(cache, [row])
    hidden, sub = model(ids, pos, None, pix, g, sub, jnp.array([0], jnp.int32))
    cache = model_lib.set_cache_rows(cache, [row], sub)
    prefill_logits.append(np.asarray(model.logits(hidden))[0, -1])
    next_pos.append(len(prompt) + int(delta[0, 0]))
  lengths = np.array([len(p) for p in prompts])
  decode_logits = []
  for k in range(new_tokens.shape[1]):
    pos = rope.text_position_ids(np.array(next_pos) + k)
    logits, cache = step(model, jnp.asarray(new_tokens[:, k:k + 1]), jnp.asarray(pos), cache,
                         jnp.asarray(lengths + k, jnp.int32))
    decode_logits.append(np.asarray(logits)[:, 0])
  for row, prompt in enumerate(prompts):
    ids = np.array([prompt + new_tokens[row].tolist()])
    pix, g = (pv, grid) if row == 0 else (None, None)
    full = _flax_logits(model, ids, None, pix, g)[0]
    n = len(prompt)
    assert np.abs(prefill_logits[row] - full[n - 1]).max() <= TOL
    for k in range(new_tokens.shape[1]):
      assert np.abs(decode_logits[k][row] - full[n + k]).max() <= TOL, (row, k)


def test_left_padded_batched_prefill_then_decode_matches_unpadded_forward(tied):
  _, model, _ = tied
  prompts = [[IM_START, 872, 5, 6, 7, 8, 9], [IM_START, 872, 40]]
  length = max(map(len, prompts))
  ids = np.zeros((2, length), np.int64)
  mask = np.zeros((2, length), bool)
  for row, p in enumerate(prompts):
    ids[row, length - len(p):], mask[row, length - len(p):] = p, True
  pos, delta = rope.get_rope_index(ids, None, mask)
  cache = model.init_cache(batch=2, max_len=16)
  _, cache = model(ids, pos, mask, cache=cache, cache_index=jnp.zeros(2, jnp.int32))
  nxt = np.array([[50], [60]])
  start = mask.sum(1) + delta[:, 0]
  hidden, cache = model(nxt, rope.text_position_ids(start), cache=cache,
                        cache_index=jnp.full((2,), length, jnp.int32))
  got = np.asarray(model.logits(hidden))[:, 0]
  for row, p in enumerate(prompts):
    full = _flax_logits(model, np.array([p + nxt[row].tolist()]))[0, -1]
    assert np.abs(got[row] - full).max() <= TOL


def test_jitted_forward_with_static_grid_equals_eager(tied, images):
  _, model, _ = tied
  pv, grid = images[1]
  ids = np.array([[IM_START] + _image_tokens(grid[0]) + [1, 2]])
  pos, _ = rope.get_rope_index(ids, grid)
  fwd = nnx.jit(lambda m, i, p, x, g: m.logits(m(i, p, None, x, g)[0]), static_argnums=4)
  got = np.asarray(fwd(model, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(pv), vision.as_grid_tuple(grid)))
  eager = _flax_logits(model, ids, None, pv, grid)
  assert np.abs(got - eager).max() <= 1e-5


def test_to_hf_state_dict_round_trips_the_checkpoint(tied):
  _, model, folder = tied
  original = weights.read_safetensors(folder / 'model.safetensors')
  exported = weights.to_hf_state_dict(model)
  assert set(exported) == set(original)                        # tied: no lm_head.weight, as save_pretrained
  for name, value in original.items():
    assert exported[name].shape == value.shape, name
    np.testing.assert_array_equal(exported[name], value, err_msg=name)


def test_save_hf_folder_loads_in_transformers(tied, tmp_path):
  hf, model, _ = tied
  weights.save_hf_folder(model, tmp_path)
  again = transformers.Qwen3VLForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32).eval()
  reference = hf.state_dict()
  loaded = again.state_dict()
  assert set(loaded) == set(reference)
  for name, value in reference.items():
    np.testing.assert_array_equal(loaded[name].numpy(), value.numpy(), err_msg=name)


def test_bfloat16_compute_stays_close_to_float32(tied, images):
  hf, model, _ = tied
  pv, grid = images[0]
  state = {k: v.numpy() for k, v in hf.state_dict().items()}
  bf16 = weights.load_hf_state_dict(Qwen3VLConfig.tiny(), state, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
  ids = np.array([[IM_START, 872] + _image_tokens(grid[0]) + [30, IM_END]])
  got = _flax_logits(bf16, ids, None, pv, grid)
  ref = _flax_logits(model, ids, None, pv, grid)
  assert got.dtype == np.float32 and bf16.init_cache(1, 4)['k'].dtype == jnp.bfloat16
  assert np.abs(got - ref).max() < 0.05
  assert (got.argmax(-1) == ref.argmax(-1)).mean() > 0.9


def test_load_hf_state_dict_fills_an_existing_model_in_place():
  config = Qwen3VLConfig.tiny()
  source = model_lib.Qwen3VLModel(config, nnx.Rngs(0))
  target = model_lib.Qwen3VLModel(config, nnx.Rngs(1))
  state = weights.to_hf_state_dict(source)
  assert len(state) == 63 and 'lm_head.weight' not in state
  assert weights.load_hf_state_dict(target, state) is target
  again = weights.to_hf_state_dict(target)
  for name, value in state.items():
    np.testing.assert_array_equal(again[name], value, err_msg=name)
