"""A compact vocabulary (`TextConfig.vocab_ids`): the embedding and output projection hold only the listed Qwen ids'
rows, ids are remapped at the model boundary, and the model computes what the full model computes on those rows."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from osvl_jax import checkpoints
from osvl_jax import export_hf
from osvl_jax import trajectory as tj
from osvl_jax.models.qwen3_vl import config as config_lib
from osvl_jax.models.qwen3_vl import model as model_lib
from osvl_jax.models.qwen3_vl import rope
from osvl_jax.models.qwen3_vl import weights
from osvl_jax.models.qwen3_vl.config import Qwen3VLConfig
from osvl_jax.train import policy

# Ids an agent's context needs (chat markup, vision span, both end-of-sequence ids) and ~150 ordinary ones.
SPECIAL = (tj.IM_START_ID, tj.IM_END_ID, tj.ENDOFTEXT_ID, tj.VISION_START_ID, tj.VISION_END_ID, tj.IMAGE_PAD_ID,
           tj.NEWLINE_ID)
VOCAB = tuple(sorted(set(SPECIAL) | set(np.random.default_rng(7).choice(151000, 150, replace=False).tolist())))


def compact_copy(full: model_lib.Qwen3VLModel, vocab=VOCAB) -> model_lib.Qwen3VLModel:
  """A compact model over `vocab` holding `full`'s weights: its embedding / lm_head rows of those ids."""
  cfg = full.config
  compact = model_lib.Qwen3VLModel(
      dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, vocab_ids=tuple(vocab))), nnx.Rngs(1))
  rows = np.asarray(vocab)
  state = nnx.state(nnx.clone(full), nnx.Param)
  embedding = state['language_model']['embed_tokens']['embedding']
  embedding.set_value(embedding[...][rows])
  if not cfg.tie_word_embeddings:
    state['lm_head']['kernel'].set_value(state['lm_head']['kernel'][...][:, rows])
  nnx.update(compact, state)
  return compact


@pytest.fixture(scope='module')
def full():
  return model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(), nnx.Rngs(0))


@pytest.fixture(scope='module')
def compact(full):
  return compact_copy(full)


@pytest.fixture(scope='module')
def image_ref():
  """A 64x64 random image -> grid (1, 4, 4), 4 image-pad tokens."""
  proc = tj.ImageProcessor(min_pixels=32 * 32, max_pixels=64 * 64)
  return proc.process(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8))


def _prompt(ref, seed: int = 0) -> np.ndarray:
  """In-vocabulary text, the image span, more text."""
  text = lambda n, s: list(np.random.default_rng(s).choice(np.asarray(VOCAB[:-8]), n))
  ids = text(5, seed) + [tj.VISION_START_ID] + [tj.IMAGE_PAD_ID] * ref.num_tokens + [tj.VISION_END_ID] + text(6, seed + 1)
  return np.asarray(ids, np.int32)


def _forward(model, ids, ref):
  """float32 logits [1, T, rows] of one row with its image."""
  grid = np.asarray(ref.grid_thw)[None]
  pos, _ = rope.get_rope_index(ids[None], grid)
  hidden, _ = model(ids[None], pos, None, ref.pixel_values, tuple(map(tuple, grid.tolist())))
  return np.asarray(model.logits(hidden))


def test_ids_round_trip_through_rows(full, compact):
  ids = jnp.asarray(np.random.default_rng(0).permutation(VOCAB), jnp.int32)
  rows = compact.ids_to_rows(ids)
  np.testing.assert_array_equal(np.asarray(VOCAB)[np.asarray(rows)], ids)   # row r is the r-th listed id
  np.testing.assert_array_equal(compact.rows_to_ids(rows), ids)
  assert compact.config.text.table_rows == len(VOCAB) and compact.config.text.vocab_size == 151936
  assert compact.language_model.embed_tokens.embedding[...].shape == (len(VOCAB), 64)
  assert full.ids_to_rows(ids) is ids and full.rows_to_ids(ids) is ids   # the full model: the identity


def test_check_ids_refuses_an_id_outside_the_vocabulary_naming_it():
  cfg = Qwen3VLConfig.tiny()
  compact = dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, vocab_ids=VOCAB))
  config_lib.check_ids(compact, np.asarray([VOCAB[3], VOCAB[0]]), 'trajectory q1')   # accepted
  outside = next(i for i in range(9707, 20000) if i not in VOCAB)
  with pytest.raises(ValueError, match=rf"trajectory q1: token id {outside} \('.*'\) at position 1 is outside the "
                                       rf'compact vocabulary of {len(VOCAB)} ids'):
    config_lib.check_ids(compact, [[VOCAB[1], outside], [outside, outside]], 'trajectory q1')
  config_lib.check_ids(cfg, [outside], 'prompt')   # the full vocabulary holds it
  with pytest.raises(ValueError, match=r'prompt of request 3: token id 151936 at position 0 is outside the '
                                       r'vocabulary \[0, 151936\)'):
    config_lib.check_ids(cfg, [151936], 'prompt of request 3')


@pytest.mark.parametrize('bad', [(5, 3), (3, 3), (-1, 4), (4, 151936), ()])
def test_vocab_ids_must_be_sorted_unique_ids_of_the_id_space(bad):
  with pytest.raises(ValueError, match='vocab_ids must be sorted unique'):
    dataclasses.replace(Qwen3VLConfig.tiny().text, vocab_ids=bad)


@pytest.mark.parametrize('tie', [True, False])
def test_compact_logits_are_the_full_models_rows_of_the_vocabulary(image_ref, tie):
  full = model_lib.Qwen3VLModel(Qwen3VLConfig.tiny(tie_word_embeddings=tie), nnx.Rngs(0))
  compact = compact_copy(full)
  ids = _prompt(image_ref)
  want = _forward(full, ids, image_ref)[..., np.asarray(VOCAB)]
  got = _forward(compact, ids, image_ref)
  assert got.shape == (1, len(ids), len(VOCAB))
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_loss_logprobs_are_the_full_models_renormalised_over_the_vocabulary(full, compact, image_ref):
  ids = _prompt(image_ref)
  grid = np.asarray(image_ref.grid_thw)[None]
  pos, _ = rope.get_rope_index(ids[None], grid)
  positions = np.arange(len(ids) - 6, len(ids) - 1, dtype=np.int32)[None]   # predict the last 5 ids
  batch = {'input_ids': ids[None], 'position_ids': pos, 'attention_mask': np.ones((1, len(ids)), bool),
           'pixel_values': image_ref.pixel_values, 'image_grid_thw': tuple(map(tuple, grid.tolist())),
           'loss_positions': positions, 'loss_targets': ids[None, positions[0] + 1]}
  restricted = _forward(full, ids, image_ref)[0, positions[0]][:, np.asarray(VOCAB)] / 0.7
  rows = np.searchsorted(VOCAB, batch['loss_targets'][0])
  want = np.asarray(jax.nn.log_softmax(restricted, axis=-1))[np.arange(5), rows]
  got = np.asarray(policy.loss_logprobs(compact, batch, 0.7))[0]
  np.testing.assert_allclose(got, want, atol=1e-5)
  full_lp = np.asarray(policy.loss_logprobs(full, batch, 0.7))[0]
  assert np.all(got > full_lp + 1e-3)   # renormalised over 157 rows: more mass than over 151,936


def test_the_hf_dict_and_a_checkpoint_keep_the_vocabulary(compact, tmp_path):
  assert 'osvl_vocab_ids' not in Qwen3VLConfig.tiny().to_hf_dict()['text_config']   # a full model's: unchanged
  assert Qwen3VLConfig.from_hf_dict(compact.config.to_hf_dict()) == compact.config
  checkpoints.save(checkpoints.manager(tmp_path, 'sft_ckpt'), 3, compact, None, {'stage': 'sft'})
  loaded, meta = checkpoints.load_policy('sft', workdir=tmp_path)
  assert meta['step'] == 3 and loaded.config.text.vocab_ids == VOCAB
  np.testing.assert_array_equal(loaded.language_model.embed_tokens.embedding[...],
                                compact.language_model.embed_tokens.embedding[...])


def test_hf_export_of_a_compact_model_is_refused_writing_nothing(compact, tmp_path):
  checkpoints.save(checkpoints.manager(tmp_path, 'sft_ckpt'), 1, compact, None,
                   {'stage': 'sft', 'image_processor': {'min_pixels': 1024, 'max_pixels': 4096}})
  refusal = rf'compact vocabulary of {len(VOCAB)} Qwen ids \(model.vocab\): an HF checkpoint needs all 151936 rows'
  with pytest.raises(ValueError, match=refusal):
    export_hf.export(tmp_path, tmp_path / 'hf')
  with pytest.raises(ValueError, match=refusal):
    weights.save_hf_folder(compact, tmp_path / 'direct')   # the GRPO weight publisher's path
  assert not (tmp_path / 'hf').exists() and not (tmp_path / 'direct').exists()
