"""build_dataset writes the items and sft datasets, stats per stage, and resumes."""

import json

import datasets

from data_pipeline import build


def test_build_writes_items_and_sft_and_resumes(tmp_path):
  config = build.default_config()
  config.num_items = 3
  stats = build.build_dataset(config, tmp_path)
  items = datasets.load_from_disk(str(tmp_path / 'items'))
  assert len(items) == stats['items']['items'] >= 2
  for col in ('prompt_id', 'question', 'canonical_question', 'answers', 'image_path', 'path', 'hops', 'rejected'):
    assert col in items.column_names
  sft = datasets.load_from_disk(str(tmp_path / 'sft'))
  assert len(sft) == stats['sft']['kept'] >= 1
  assert json.loads((tmp_path / 'stats.json').read_text())['summary'] == stats['summary']
  again = build.build_dataset(config, tmp_path)
  assert all(again[s]['resumed'] for s in ('paths', 'qa', 'rewrite', 'ground', 'items', 'sft'))
  assert again['summary'] == stats['summary']
