"""Stage `merge`: external VQA corpora through the benchmark adapters, a held-out part excluded."""

import hashlib
import json
import pathlib

import pytest

from data_pipeline import build, merge, splits
from osvl_jax import paths as osvl_paths
from osvl_jax.data import benchmarks
from osvl_jax.data import pipeline as pipeline_data


def test_holdout_key_is_the_sha256_fraction():
  digest = hashlib.sha256(b'fvqa/abc').hexdigest()
  assert benchmarks.holdout_key('fvqa', 'abc') == int(digest[:16], 16) / 2 ** 64


def test_only_usable_not_held_out_items_are_merged_with_their_source():
  data_dir = osvl_paths.data_dir()
  fvqa = benchmarks.load_benchmark('fvqa', data_dir=data_dir)
  held = {it.id for it in fvqa if int(hashlib.sha256(f'fvqa/{it.id}'.encode()).hexdigest()[:16], 16) / 2 ** 64
          < 0.2}
  pool = [{'prompt_id': 'wiki-1', 'question': 'Which city?', 'answers': ['Agra'], 'rejected': None}]
  out, counts = merge.merge(pool, data_dir, ('fvqa', 'livevqa_official', 'webqa_img'), holdout=0.2)
  assert out[0] == dict(pool[0], source='wiki')
  c = counts['sources']['fvqa']
  assert c['read'] == len(fvqa) == 42 and c['held_out'] == len(held) and 0 < len(held) < 42
  assert c['added'] + c['held_out'] + c['no_image'] + c['no_answer'] + c['duplicate'] == 42
  # The shipped LiveVQA / WebQA samples have no local images: none merged, all counted.
  for name in ('livevqa_official', 'webqa_img'):
    c = counts['sources'][name]
    assert c['added'] == 0 and c['read'] > 0 and c['held_out'] + c['no_image'] == c['read']
  added = out[1:]
  assert len(added) == counts['added'] == counts['sources']['fvqa']['added'] > 20
  by_id = {it.id: it for it in fvqa}
  for rec in added:
    item = by_id[rec['prompt_id'].removeprefix('fvqa-')]
    assert item.id not in held and rec['source'] == 'fvqa' and rec['rejected'] is None
    assert rec['answers'] == item.answers and rec['question'] == rec['canonical_question'] == item.question.strip()
    assert not pathlib.Path(rec['image_path']).is_absolute()   # relative to the data folder: relocatable
    assert (pathlib.Path(data_dir) / rec['image_path']).is_file()
    assert rec['path'] == [] and rec['hops'] == 0 and rec['answer_attribute'] == merge.EXTERNAL_ATTRIBUTE
  again, _ = merge.merge(pool, data_dir, ('fvqa',), holdout=0.2)
  assert [r['prompt_id'] for r in again] == [r['prompt_id'] for r in out]   # deterministic
  off, counts = merge.merge(pool, data_dir, enabled=False)
  assert off == [dict(pool[0], source='wiki')] and counts['added'] == 0 and not counts['enabled']


@pytest.mark.parametrize('field, value, match', [
    ('merge_sources', ('fvqa', 'nope'), r"data.merge_sources: \['nope'\]"),
    ('merge_holdout', 1.0, 'data.merge_holdout=1.0'),
])
def test_bad_merge_settings_are_refused_naming_the_field(field, value, match):
  config = build.default_config()
  config[field] = value
  with pytest.raises(ValueError, match=match):
    build.check_config(config)


def test_build_with_merge_adds_the_external_items_to_the_pool(tmp_path):
  config = build.default_config()
  config.num_items, config.merge_external, config.merge_sources = 3, True, ('fvqa',)
  stats = build.build_dataset(config, tmp_path)
  added = stats['merge']['added']
  assert added == stats['merge']['sources']['fvqa']['added'] > 20
  assert stats['items']['items'] == stats['merge']['in'] + added
  assert stats['items']['attributes'][merge.EXTERNAL_ATTRIBUTE] == added
  # The oracle has no walk to follow on an external item: each it is given is counted, none is an error; the ones
  # held out for RL (data.rl_fraction) are not given to it, and are RL prompts like the rest.
  items, _ = pipeline_data.read_split(tmp_path / pipeline_data.ITEMS)
  external = [r['prompt_id'] for r in items if r['answer_attribute'] == merge.EXTERNAL_ATTRIBUTE]
  held = sum(splits.rl_held_out(i, config.rl_fraction, config.seed) for i in external)
  assert 0 < held < added and stats['sft']['reasons']['no path (external item)'] == added - held
  rl = {p['prompt_id'] for p in pipeline_data.load_prompts(tmp_path)}
  assert set(external) <= rl
  assert json.loads((tmp_path / build.BUILD_CONFIG_FILE).read_text())['merge_external'] is True
