"""A built dataset folder is relocatable: every path the pipeline writes is relative (a degraded image to the
dataset folder, a shared-data image to the data folder), so after moving the folder `load_prompts`, `load_sft` and
the ShareGPT reader find every image; an older build's absolute degraded paths still read, moved or not."""

import shutil

import datasets
import numpy as np
import pytest

from data_pipeline import build
from osvl_jax import paths
from osvl_jax import trajectory as traj_lib
from osvl_jax.data import official
from osvl_jax.data import pipeline as pipeline_data


@pytest.fixture(scope='module')
def moved(tmp_path_factory):
  """(prompts read in place, sft read in place, the moved folder, config, every item's image read in place) of a
  6-item build with half its images degraded."""
  root = tmp_path_factory.mktemp('relocate')
  config = build.wikispeedia_walks(build.default_config())
  config.num_items, config.degrade_fraction, config.rl_fraction = 6, 0.5, 0.5
  build.build_dataset(config, root / 'built')
  prompts, sft = pipeline_data.load_prompts(root / 'built'), pipeline_data.load_sft(root / 'built')
  items, _ = pipeline_data.read_split(root / 'built' / pipeline_data.ITEMS)
  images = {r['prompt_id']: pipeline_data.item_image(r, paths.data_dir(), root / 'built') for r in items}
  shutil.move(root / 'built', root / 'elsewhere' / 'moved')
  return prompts, sft, root / 'elsewhere' / 'moved', config, images


def test_every_path_the_build_writes_is_relative(moved):
  _, _, folder, _, _ = moved
  items, _ = pipeline_data.read_split(folder / pipeline_data.ITEMS)
  assert sum(bool(r['degradation']) for r in items) >= 2
  for r in items:
    for field in ('image_path', 'original_image_path'):
      assert r[field] is None or not r[field].startswith('/'), (field, r[field])
  degraded = [r for r in items if r['degradation']]
  assert all(r['image_path'] == f"{pipeline_data.DEGRADED_DIR}/{r['prompt_id']}.png" for r in degraded)


def test_a_moved_dataset_loads_every_image(moved):
  prompts, sft, folder, config, images = moved
  again = pipeline_data.load_prompts(folder)
  assert [p['prompt_id'] for p in again] == [p['prompt_id'] for p in prompts] and len(again) >= 1
  for a, b in zip(again, prompts):
    np.testing.assert_array_equal(a['image'], b['image'])
  items, _ = pipeline_data.read_split(folder / pipeline_data.ITEMS)   # every item's, degraded or not
  assert len(items) == len(images) >= 4 and sum(bool(r['degradation']) for r in items) >= 2
  for r in items:
    np.testing.assert_array_equal(pipeline_data.item_image(r, paths.data_dir(), folder), images[r['prompt_id']])
  trajectories = pipeline_data.load_sft(folder)
  assert len(trajectories) == len(sft) >= 1
  for a, b in zip(trajectories, sft):
    assert len(a.images) == len(b.images) and a.token_ids.tolist() == b.token_ids.tolist()
  shared = official.load_sft(folder / build.SHAREGPT_FILE, traj_lib.load_tokenizer(),
                             traj_lib.ImageProcessor(min_pixels=config.min_pixels, max_pixels=config.max_pixels),
                             profile='osvl')
  assert [t.token_ids.tolist() for t in shared] == [t.token_ids.tolist() for t in sft]


def test_an_older_build_with_absolute_degraded_paths_still_reads_in_place_and_moved(moved, tmp_path):
  prompts, _, folder, _, images = moved
  old = tmp_path / 'old'
  shutil.copytree(folder, old)
  items = datasets.load_from_disk(str(folder / pipeline_data.ITEMS)).map(   # what the build wrote before
      lambda r: {'image_path': str(old / r['image_path']) if r['degradation'] else r['image_path']})
  shutil.rmtree(old / pipeline_data.ITEMS)
  items.save_to_disk(str(old / pipeline_data.ITEMS))
  shutil.copy(folder / pipeline_data.ITEMS / pipeline_data.COUNTS_FILE, old / pipeline_data.ITEMS)
  assert any(r['image_path'].startswith(str(old)) for r in pipeline_data.read_split(old / 'items')[0])
  for where in (old, tmp_path / 'old_moved'):
    if where != old:
      shutil.move(old, where)
    again = pipeline_data.load_prompts(where)
    assert len(again) == len(prompts)
    for a, b in zip(again, prompts):
      np.testing.assert_array_equal(a['image'], b['image'])
    for r in pipeline_data.read_split(where / 'items')[0]:   # the degraded ones among them
      np.testing.assert_array_equal(pipeline_data.item_image(r, paths.data_dir(), where), images[r['prompt_id']])


def test_a_relative_degraded_path_without_the_dataset_folder_names_the_item():
  record = {'prompt_id': 'p1', 'image_path': 'degraded/p1.png', 'degradation': {'kind': 'blur'}}
  with pytest.raises(ValueError, match="item 'p1'.*dataset_dir"):
    pipeline_data.image_file(record, '/data', None)
  assert str(pipeline_data.image_file(record, '/data', '/ds')) == '/ds/degraded/p1.png'
  assert str(pipeline_data.image_file(dict(record, degradation=None), '/data', '/ds')) == '/data/degraded/p1.png'
