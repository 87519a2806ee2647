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


# ----------------------------------------------------------------------------------------------------------------
# Bad entries: recorded as that entry's problem, the rest of the file loaded
# ----------------------------------------------------------------------------------------------------------------

def _jsonl(path, lines, bom=False):
  path.write_text(('\ufeff' if bom else '') + '\n'.join(lines) + '\n', encoding='utf-8')
  return path


GOOD = {  # adapter -> (file name, one good record as a JSON line, its question)
    'generic': ('g.jsonl', '{"id": "g1", "question": "Where?", "answer": "Lisbon"}', 'Where?'),
    'browsecomp_vl': ('bc_vl_level1.jsonl', '{"question": "Where?", "image_path": "x.jpg", "answers": ["Lisbon"]}',
                      'Where?'),
    'webwatcher': ('ww.jsonl', '{"prompt": "Where?", "answers": ["Lisbon"], "question_id": 7}', 'Where?'),
    'fvqa': ('f.jsonl', '{"data_id": "f1", "question": "Where?", "ground_truth": "Lisbon"}', 'Where?'),
    'webqa': ('webqa_val_txt_queries.jsonl', '{"Guid": "w1", "Q": "Where?", "A": ["Lisbon"]}', 'Where?'),
    'infoseek': ('i.jsonl', '{"data_id": "i1", "question": "Where?", "answer": ["Lisbon"]}', 'Where?'),
}


@pytest.mark.parametrize('adapter', sorted(GOOD))
def test_every_jsonl_adapter_records_bad_lines_and_loads_the_rest(tmp_path, adapter):
  name, good, question = GOOD[adapter]
  lines = [good,
           '{"question": "torn',                 # not JSON
           '"just a string"', '[1, 2]', '42',     # valid JSON, not an object
           '{"question": "No gold?", "answer": "", "answers": [], "ground_truth": null, "A": []}',
           '{"answer": "Lisbon", "answers": ["Lisbon"], "ground_truth": "Lisbon", "A": ["Lisbon"]}',  # no question
           '']
  path = _jsonl(tmp_path / name, lines, bom=True)  # a UTF-8 byte-order mark in front of the first line
  rejected = []
  items = benchmarks.load_benchmark('b', files=path, adapter=adapter, rejected=rejected)
  assert [it.question for it in items] == [question] and items[0].answers[0] == 'Lisbon'
  assert [r.kind for r in rejected] == ['bad_json', 'not_an_object', 'not_an_object', 'not_an_object',
                                        'no_answer', 'no_question']
  assert [r.where for r in rejected][:2] == [f'{path}:2', f'{path}:3'] and all(r.benchmark == 'b' for r in rejected)


def test_duplicate_ids_and_duplicate_content_are_recorded_after_the_first(tmp_path):
  path = _jsonl(tmp_path / 'g.jsonl', [
      '{"id": "1", "question": "Q?", "answer": "a1"}',
      '{"id": "1", "question": "Other Q?", "answer": "a2"}',   # same id, other content
      '{"id": "2", "question": "Q?", "answer": "a1"}',         # other id, same content
      '{"id": "3", "question": "Third?", "answer": "a3"}'])
  rejected = []
  items = benchmarks.load_benchmark('g', files=path, adapter='generic', rejected=rejected)
  assert [it.id for it in items] == ['1', '3']
  assert [(r.kind, r.id) for r in rejected] == [('duplicate_id', '1'), ('duplicate_item', '2')]
  assert "'1'" in rejected[1].detail


def test_malformed_fields_are_that_entrys_problem(tmp_path):
  path = _jsonl(tmp_path / 'i.jsonl', [
      '{"data_id": "i1", "question": "Height?", "answer": ["182"], "answer_eval": [{"range": ["x", "y"]}]}',
      '{"data_id": "i2", "question": "Where?", "answer": ["Lisbon"]}'])
  rejected = []
  items = benchmarks.load_benchmark('infoseek', files=path, rejected=rejected)
  assert [it.id for it in items] == ['i2']
  assert rejected[0].kind == 'malformed_entry' and rejected[0].id == 'i1' and 'ValueError' in rejected[0].detail


def test_livevqa_entries_without_their_question_levels_are_recorded(tmp_path):
  qa = {'question': 'Which event?', 'options': ['A. One', 'B. Two'], 'Ground_Truth': 'B',
        'Ground_Truth_List': ['Two']}
  entries = [{'id': 'e1', 'level1_qa': qa, 'level2_qa': qa | {'question': 'Which year?'}},
             {'id': 'e2'},                                   # neither level
             {'id': 'e3', 'level1_qa': qa | {'question': 'Third?'}},  # level 2 missing
             'a string entry']
  path = tmp_path / 'News_benchmark.json'
  path.write_text('\ufeff' + __import__('json').dumps(entries), encoding='utf-8')
  rejected = []
  items = benchmarks.load_benchmark('livevqa_official', files=path, rejected=rejected)
  assert [it.id for it in items] == ['e1-l1', 'e1-l2', 'e3-l1']
  assert items[0].metadata['gold_letter'] == 'B' and items[0].answers == ['Two']
  assert [(r.kind, r.id) for r in rejected] == [('no_question', 'e2-l1'), ('no_question', 'e2-l2'),
                                                ('no_question', 'e3-l2'), ('not_an_object', '')]
  assert rejected[0].where == f'{path}:1/l1'
  # A .json file that is not JSON at all: one bad_json entry, no crash.
  path.write_text('[{"id": "x", ', encoding='utf-8')
  rejected = []
  assert benchmarks.load_benchmark('livevqa_official', files=path, rejected=rejected) == []
  assert [r.kind for r in rejected] == ['bad_json']


def test_strict_reader_still_raises_for_the_training_readers(tmp_path):
  path = _jsonl(tmp_path / 'x.jsonl', ['{"a": 1}', '{"a": '], bom=True)
  with pytest.raises(ValueError, match='x.jsonl:2'):
    benchmarks.read_records(path)
  assert benchmarks.read_records(_jsonl(tmp_path / 'y.jsonl', ['{"a": 1}'], bom=True)) == [(1, {'a': 1})]
