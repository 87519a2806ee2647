"""Benchmark adapters: every shared benchmark file and the hand-written fixtures of the published formats."""

import pathlib

import numpy as np
import pytest

from osvl_jax.data import benchmarks

FIXTURES = pathlib.Path(__file__).parent / 'fixtures'

# name -> (items here, items with a usable image source, items with a problem at load time)
SHARED = {
    'browsecomp_vl': (316, 0, 316),     # image_path honoured; the level tars are not shipped: all reported missing
    'mmsearch': (135, 135, 0),          # image URLs (reported when loading pixels, offline)
    'simplevqa': (240, 240, 0),
    'livevqa': (205, 205, 0),
    'hle': (259, 0, 259),               # paths into a tar that is not shipped
    'livevqa_official': (1886, 0, 1886),  # 943 entries x 2 levels; images not shipped
    'fvqa': (42, 42, 0),                # images shipped
    'webqa_img': (1995, 0, 1995),
    'webqa_txt': (1974, 0, 0),          # text-only questions need no image
}


@pytest.mark.parametrize('name', sorted(SHARED))
def test_every_shared_benchmark_file_loads(name):
  n, with_images, with_problems = SHARED[name]
  items = benchmarks.load_benchmark(name)
  assert len(items) == n
  assert sum(bool(it.images) for it in items) == with_images
  assert sum(bool(it.problems) for it in items) == with_problems
  assert all(it.question and it.answers and it.benchmark == name for it in items)
  assert len({it.id for it in items}) == n  # ids are unique within a benchmark


def test_fvqa_images_decode_and_ground_truth_comes_first():
  items = benchmarks.load_benchmark('fvqa')
  for it in items:
    images, problems = benchmarks.load_images(it)
    assert not problems and len(images) == 1 and images[0].dtype == np.uint8 and images[0].shape[2] == 3
  bridge = next(it for it in items if it.id == 'fvqa_train_2759')
  assert bridge.answers[0] == 'Tagus River' and 'Tejo' in bridge.answers


def test_browsecomp_image_path_is_honoured_with_an_image_root(tmp_path):
  (tmp_path / 'level1').mkdir()
  src = FIXTURES / 'images' / 'oven_00000001.jpg'
  (tmp_path / 'level1' / 'level1_1.jpg').write_bytes(src.read_bytes())
  items = benchmarks.load_benchmark('browsecomp_vl', image_root=tmp_path, limit=3)
  assert len(items) == 3
  assert items[0].images and not items[0].problems  # browsecomp-vl/images/level1/level1_1.jpg found by suffix
  assert items[1].problems and 'level1_2.jpg' in items[1].problems[0]


def test_webwatcher_fields_and_hle_answer_lists():
  mm = benchmarks.load_benchmark('mmsearch', limit=1)[0]
  assert mm.id == '1' and mm.question.startswith('Which days') and mm.answers == ['2024-09-29 to 2024-10-04']
  images, problems = benchmarks.load_images(mm)
  assert images == [] and problems[0].startswith('remote image not fetched')
  hle = benchmarks.load_benchmark('hle', limit=1)[0]
  assert hle.answers == ['Qa8, then whatever black moves, Kc6# mated'] and 'rationale' in hle.metadata


def test_livevqa_official_levels_and_gold_option():
  items = benchmarks.load_benchmark('livevqa_official', limit=2)
  assert [it.id for it in items] == ['0_20250507132827113360-l1', '0_20250507132827113360-l2']
  assert 'Choices:' in items[0].question and items[0].metadata['gold_letter'] == 'B'
  assert items[0].answers[0] == 'CBS News vice presidential debate'


def test_webqa_question_key_Q_and_keyword_answer():
  it = benchmarks.load_benchmark('webqa_img', limit=1)[0]
  assert it.question.startswith('Does a Minnetonka') and it.answers[-1] == 'No' and it.problems


def test_infoseek_fixture_images_and_numeric_ranges():
  items = benchmarks.load_benchmark('infoseek', files=FIXTURES / 'infoseek_val.jsonl',
                                    image_root=FIXTURES / 'images')
  assert len(items) == 3
  assert [bool(it.images) for it in items] == [True, True, False]
  assert 'oven_00000003' in items[2].problems[0]  # missing image: reported, item kept
  assert items[1].metadata['numeric_ranges'] == [[163.8, 200.2]] and items[1].metadata['numeric_tolerance'] == 0.1
  assert benchmarks.load_images(items[0])[0][0].shape == (32, 40, 3)


def test_vdr_bench_fixture():
  items = benchmarks.load_benchmark('vdr_bench', files=FIXTURES / 'vdr_bench.jsonl')
  assert len(items) == 2 and items[0].images and not items[0].problems
  assert items[1].answers == ['Ajax', 'AFC Ajax'] and 'vdr_missing.png' in items[1].problems[0]


def test_official_simplevqa_fixture_base64_image():
  items = benchmarks.load_benchmark('simplevqa_official', files=FIXTURES / 'simplevqa_official.jsonl')
  assert len(items) == 2 and items[0].id == '0' and items[0].answers == ['Mount Fuji']
  images, problems = benchmarks.load_images(items[0])
  assert not problems and images[0].shape == (32, 40, 3)
  assert items[0].metadata['atomic_fact'] == 'Mount Fuji'
  assert benchmarks.load_images(items[1])[1][0].startswith('remote image not fetched')


def test_official_mmsearch_fixture():
  items = benchmarks.load_benchmark('mmsearch_official', files=FIXTURES / 'mmsearch_end2end.jsonl')
  assert len(items) == 2 and items[0].id == 'news_0'
  assert items[0].answers == ['29 September 2024', '2024-09-29', 'Sept 29, 2024'] and items[0].images
  assert items[1].images == [] and items[0].metadata['area'] == 'news'


def test_unreadable_image_is_a_problem_not_a_crash(tmp_path):
  (tmp_path / 'bad.jpg').write_bytes(b'not an image')
  (tmp_path / 'b.jsonl').write_text('{"question": "q?", "answer": "a", "image": "bad.jpg"}\n')
  item = benchmarks.load_benchmark('x', files=tmp_path / 'b.jsonl', adapter='generic')[0]
  images, problems = benchmarks.load_images(item)
  assert images == [] and problems[0].startswith('image unreadable')


def test_unknown_names_and_missing_files_raise():
  with pytest.raises(ValueError, match='not one of'):
    benchmarks.load_benchmark('nope')
  with pytest.raises(ValueError, match='benchmark adapter'):
    benchmarks.ADAPTERS.get('nope')
  with pytest.raises(FileNotFoundError, match='infoseek'):
    benchmarks.load_benchmark('infoseek')
  assert set(benchmarks.PAPER_BENCHMARKS) <= set(benchmarks.BENCHMARKS)
