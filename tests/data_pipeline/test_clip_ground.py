"""CLIP grounding: a tiny random transformers CLIP written with `save_pretrained` and read back through
`load_clip`, so the real loading and scoring code runs (no download).

The tokenizer is a real `CLIPTokenizer` over a minimal vocabulary: the 256 byte-level symbols, each also with
CLIP's end-of-word suffix `</w>`, and no merges (every word is spelled out symbol by symbol). The Qwen BPE of the
shared data cannot back it: CLIP's BPE appends `</w>` to the last symbol of every word, and Qwen's byte-level
vocabulary has no `</w>` tokens, so every word end would map to the unknown token (and its 151k rows would make
the tiny model's embedding table the largest part of it).
"""

import numpy as np
import pytest
import torch
import transformers
from tokenizers import pre_tokenizers

from data_pipeline import clip_ground
from osvl_jax import paths as osvl_paths
from tools import image_io

PHOTOS = ('taj-mahal', 'big-ben', 'stonehenge', 'great-wall')


@pytest.fixture(scope='module')
def clip_dir(tmp_path_factory):
  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
  vocab = {'<|startoftext|>': 0, '<|endoftext|>': 1}
  vocab.update({s: 2 + k for k, s in enumerate(alphabet)})
  vocab.update({s + '</w>': 2 + len(alphabet) + k for k, s in enumerate(alphabet)})
  tokenizer = transformers.CLIPTokenizer(vocab=vocab, merges=[])
  image_processor = transformers.CLIPImageProcessorPil(size={'shortest_edge': 32},
                                                       crop_size={'height': 32, 'width': 32})
  config = transformers.CLIPConfig(
      text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=1,
                       pad_token_id=1),
      vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         image_size=32, patch_size=8),
      projection_dim=16)
  torch.manual_seed(0)
  folder = tmp_path_factory.mktemp('tiny_clip')
  transformers.CLIPModel(config).save_pretrained(folder)
  transformers.CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
  return folder


@pytest.fixture(scope='module')
def clip(clip_dir):
  return clip_ground.load_clip(clip_dir)


def _photo(stem):
  return image_io.load_image(osvl_paths.data_dir() / 'images' / 'landmarks' / f'{stem}.jpg')


def _cosines_by_hand(clip, images, texts):
  """Cosines of the model's own `get_image_features` / `get_text_features`, normalised in numpy."""
  inputs = clip.processor(text=texts, images=images, return_tensors='pt', padding=True)
  with torch.no_grad():
    img = clip.model.get_image_features(pixel_values=inputs['pixel_values']).pooler_output.numpy()
    txt = clip.model.get_text_features(input_ids=inputs['input_ids'],
                                       attention_mask=inputs['attention_mask']).pooler_output.numpy()
  img = img / np.linalg.norm(img, axis=-1, keepdims=True)
  txt = txt / np.linalg.norm(txt, axis=-1, keepdims=True)
  return img @ txt.T


def test_score_is_the_cosine_of_clips_own_features(clip):
  images = [_photo(s) for s in PHOTOS[:3]]
  texts = ['a photo of Taj Mahal', 'a clock tower', 'a photo of Stonehenge in the rain']
  got = clip_ground.score(clip, images, texts)
  assert got.shape == (3, 3) and got.dtype == np.float32
  np.testing.assert_allclose(got, _cosines_by_hand(clip, images, texts), atol=1e-5)
  assert np.abs(got).max() <= 1.0 and np.ptp(got) > 1e-3   # cosines, and the inputs make a difference
  with pytest.raises(ValueError, match='at least one image'):
    clip_ground.score(clip, [], texts)


def test_the_threshold_decides(clip):
  data = osvl_paths.data_dir()
  paths = [data / 'images' / 'landmarks' / f'{s}.jpg' for s in PHOTOS]
  sims = clip_ground.score(clip, [_photo(s) for s in PHOTOS], ['a photo of Taj Mahal'])[:, 0]
  best = int(np.argmax(sims))
  chosen, s, why = clip_ground.choose_anchor(clip, paths, 'a photo of Taj Mahal', threshold=float(sims[best]) - 1e-4)
  assert chosen == str(paths[best]) and s == pytest.approx(sims[best], abs=1e-6) and why.startswith('clip ')
  chosen, s, why = clip_ground.choose_anchor(clip, paths, 'a photo of Taj Mahal', threshold=float(sims[best]) + 1e-4)
  assert chosen is None and why == f'best clip similarity {sims[best]:.3f} < {float(sims[best]) + 1e-4}'
  missing = data / 'images' / 'landmarks' / 'no-such-photo.jpg'
  chosen, s, why = clip_ground.choose_anchor(clip, [missing, paths[best]], 'a photo of Taj Mahal', threshold=-1.0)
  assert chosen == str(paths[best]) and why.endswith(f'; unreadable: {missing}')
  assert clip_ground.choose_anchor(clip, [missing], 'x') == (None, None, f'no readable candidate image (1 '
                                                                         f'unreadable); unreadable: {missing}')


def test_ground_by_clip_picks_among_candidates_or_keeps_the_infobox_image(clip, clip_dir):
  data = osvl_paths.data_dir()
  rels = [f'images/landmarks/{s}.jpg' for s in PHOTOS]
  recs = [{'prompt_id': 'a', 'path': ['Taj_Mahal', 'Agra'], 'image_path': rels[0], 'image_candidates': rels,
           'rejected': None},
          {'prompt_id': 'b', 'path': ['Big_Ben', 'London'], 'image_path': rels[1], 'image_candidates': rels[1:],
           'anchor_description': 'the clock tower of the Palace of Westminster', 'rejected': None},
          {'prompt_id': 'c', 'path': ['Stonehenge', 'Wiltshire'], 'image_path': rels[2], 'rejected': None},
          {'prompt_id': 'd', 'path': ['Great_Wall_of_China', 'China'], 'image_path': rels[3], 'rejected': 'qa: x'}]
  images = [_photo(s) for s in PHOTOS]
  sims_a = clip_ground.score(clip, images, ['a photo of Taj Mahal'])[:, 0]
  sims_b = clip_ground.score(clip, images[1:], ['the clock tower of the Palace of Westminster'])[:, 0]
  sim_c = clip_ground.score(clip, images[2:3], ['a photo of Stonehenge'])[0, 0]
  # A threshold between the best similarities, so that exactly the records above it get a CLIP-chosen image.
  ranked = sorted([(sims_a.max(), 'a'), (sims_b.max(), 'b'), (sim_c, 'c')])
  threshold = float(ranked[0][0] + ranked[1][0]) / 2
  config = clip_ground.default_config()
  config.update(clip_path=str(clip_dir), threshold=threshold)
  out, counts = clip_ground.ground_by_clip(recs, config, data)
  by_id = {r['prompt_id']: r for r in out}
  expected_image = {'a': rels[int(np.argmax(sims_a))], 'b': rels[1 + int(np.argmax(sims_b))], 'c': rels[2]}
  low = ranked[0][1]
  for pid in 'abc':
    if pid == low:
      assert by_id[pid]['image_path'] == recs['abc'.index(pid)]['image_path']
      assert by_id[pid]['anchor_source'].startswith('infobox: best clip similarity')
    else:
      assert by_id[pid]['image_path'] == expected_image[pid] and by_id[pid]['anchor_source'] == 'clip'
  # Scored against the anchor_description when there is one, else 'a photo of <v0>'.
  assert [by_id[p]['anchor_clip_score'] for p in 'abc'] == pytest.approx(
      [float(sims_a.max()), float(sims_b.max()), float(sim_c)], abs=1e-5)
  assert by_id['d'] == dict(recs[3], anchor_source='', anchor_clip_score=None)
  assert counts['clip_chosen'] == 2 and counts['infobox_kept'] == {'below threshold': 1}
  assert counts['changed_image'] == sum(expected_image[p] != recs['abc'.index(p)]['image_path']
                                        for p in 'abc' if p != low)
  # Offline (no CLIP model): the infobox image, counted.
  out, counts = clip_ground.ground_by_clip(recs, clip_ground.default_config(), data)
  assert [r['image_path'] for r in out] == rels and counts['skipped'] == {'no clip model': 3}
  assert [r['anchor_source'] for r in out] == ['infobox: no clip model'] * 3 + ['']


def test_candidates_from_ground_are_scored_against_the_anchor_node(clip, clip_dir):
  """Two candidate images: the one more similar to 'a photo of <anchor node>' is chosen when it reaches the
  threshold; with `data.anchor='answer'` (`anchor_title` = vh) the text is vh's title, not v0's."""
  data = osvl_paths.data_dir()
  rels = [f'images/landmarks/{s}.jpg' for s in PHOTOS[:2]]
  images = [_photo(s) for s in PHOTOS[:2]]
  sims_v0, sims_vh = clip_ground.score(clip, images, ['a photo of Taj Mahal', 'a photo of Agra']).T
  assert np.abs(sims_v0 - sims_vh).max() > 1e-4                   # the two texts score differently
  rec = {'prompt_id': 'a', 'path': ['Taj_Mahal', 'Agra'], 'image_path': rels[0], 'image_candidates': rels,
         'rejected': None}
  config = clip_ground.default_config()
  for anchor_title, sims in (('Taj_Mahal', sims_v0), ('Agra', sims_vh)):
    r = dict(rec, anchor_title=anchor_title)
    assert clip_ground.anchor_text(r, config.text_template) == 'a photo of ' + anchor_title.replace('_', ' ')
    best = int(np.argmax(sims))
    config.update(clip_path=str(clip_dir), threshold=float(sims[best]) - 1e-4)
    (out,), counts = clip_ground.ground_by_clip([r], config, data)
    assert out['image_path'] == rels[best] and out['anchor_source'] == 'clip'
    assert out['anchor_clip_score'] == pytest.approx(float(sims[best]), abs=1e-5)
    assert counts['changed_image'] == int(best == 1)
    config.threshold = float(sims[best]) + 1e-4
    (out,), counts = clip_ground.ground_by_clip([r], config, data)
    assert out['image_path'] == rels[0] and counts['infobox_kept'] == {'below threshold': 1}


def test_missing_or_corrupt_checkpoint_is_refused_naming_the_path(tmp_path, clip_dir):
  with pytest.raises(FileNotFoundError, match=str(tmp_path / 'nowhere')):
    clip_ground.load_clip(tmp_path / 'nowhere')
  empty = tmp_path / 'empty'
  empty.mkdir()
  with pytest.raises(ValueError, match=f'from {empty}'):
    clip_ground.load_clip(empty)
  broken = tmp_path / 'broken'
  broken.mkdir()
  for f in clip_dir.iterdir():
    (broken / f.name).write_bytes(f.read_bytes())
  (broken / 'model.safetensors').write_bytes((clip_dir / 'model.safetensors').read_bytes()[:1000])
  with pytest.raises(ValueError, match=f'from {broken}'):
    clip_ground.load_clip(broken)
  config = clip_ground.default_config()
  config.clip_path = str(tmp_path / 'nowhere')
  with pytest.raises(FileNotFoundError, match='data.clip_ground.clip_path'):
    clip_ground.check_config(config)
  config.update(clip_path='', threshold=1.5)
  with pytest.raises(ValueError, match='data.clip_ground.threshold=1.5'):
    clip_ground.check_config(config)
