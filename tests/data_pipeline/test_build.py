"""build_dataset writes the items and sft datasets, stats per stage, and resumes."""

import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import datasets
import ml_collections
import pytest

from data_pipeline import build, dataset_folder, graph, llm, splits, wiki
from osvl_jax.data import pipeline as pipeline_data


def test_build_writes_items_and_sft_and_resumes(tmp_path):
  config = build.wikispeedia_walks(build.default_config())
  config.num_items = 3
  config.rl_fraction = 0.1  # by prompt id: wiki-s0-00001 is held out as an RL prompt, 00000 and 00002 are not
  stats = build.build_dataset(config, tmp_path)
  items = datasets.load_from_disk(str(tmp_path / 'items'))
  assert len(items) == stats['items']['items'] >= 2
  for col in ('prompt_id', 'question', 'canonical_question', 'answers', 'image_path', 'path', 'hops', 'rejected'):
    assert col in items.column_names
  sft = datasets.load_from_disk(str(tmp_path / 'sft'))
  assert len(sft) == stats['sft']['kept'] >= 1
  assert json.loads((tmp_path / 'stats.json').read_text())['summary'] == stats['summary']
  trajectories = pipeline_data.load_sft(tmp_path)  # the readers the trainers use
  assert len(trajectories) == len(sft) and trajectories[0].prompt_id == sft[0]['prompt_id']
  prompts = pipeline_data.load_prompts(tmp_path)   # the RL prompts: the accepted items without a trajectory
  rl_ids, sft_ids = {p['prompt_id'] for p in prompts}, {t.prompt_id for t in trajectories}
  assert rl_ids and sft_ids and not rl_ids & sft_ids and prompts[0]['image'].ndim == 3
  # A walk whose seed leads nowhere starts again from another seed: none of the 3 is given up (one is refused
  # later, at `qa`: a capital that is no place name).
  assert len(rl_ids | sft_ids) == stats['items']['accepted'] >= 2 and stats['paths']['given_up'] == 0
  assert stats['rl']['prompts'] == len(rl_ids) == stats['summary']['rl_prompts']
  assert stats['rl']['held_out'] + stats['rl']['no_trajectory'] == len(rl_ids)
  # Every stage's counts, with the reasons items were dropped.
  assert stats['paths']['attempted'] == 3 and stats['paths']['seed_candidates'] == 12
  assert stats['paths']['walked'] + stats['paths']['given_up'] == 3
  # Stage `wiki`: Wikispeedia's 4,598 articles, 119,879 links (110 self-links), all targets present.
  assert stats['wiki']['graph'] == {'nodes': 4598, 'edges_in': 119879, 'self_loops': 110, 'duplicates': 0,
                                    'edges': 119769}
  assert stats['wiki']['links']['missing'] == 0
  assert graph.load_csr(tmp_path / 'wiki' / 'graph').num_edges == 119769
  assert len(wiki.load(tmp_path / 'wiki').articles) == 4598
  # New stages: filter offline (no endpoint: all skipped, none rejected), degrade round(0.1 * accepted).
  assert stats['filter']['skipped'] == {'no endpoint': stats['ground']['grounded']}
  assert stats['filter']['rejected'] == {}
  assert stats['degrade']['degraded'] == round(0.1 * stats['degrade']['accepted'])
  assert stats['qa']['accepted'] + sum(stats['qa']['rejected_answer_type'].values()) == stats['qa']['answered']
  # No descriptor endpoint (the offline default): the code's descriptors, nothing asked, counted as skipped.
  assert stats['rewrite']['llm_descriptors']['skipped'] == {'no endpoint': stats['qa']['accepted']}
  assert 'descriptor_sources' not in datasets.load_from_disk(str(tmp_path / 'rewrite')).column_names
  # The sft split also as the official ShareGPT SFT file, read back by the official reader.
  from osvl_jax import trajectory as traj_lib
  from osvl_jax.data import official
  assert stats['sft_sharegpt'] == {'written': len(sft), 'skipped': 0, 'resumed': False,
                                   'images': stats['sft_sharegpt']['images']}
  shared = official.load_sft(tmp_path / build.SHAREGPT_FILE, traj_lib.load_tokenizer(),
                             traj_lib.ImageProcessor(min_pixels=config.min_pixels, max_pixels=config.max_pixels),
                             profile='osvl')
  assert [t.token_ids.tolist() for t in shared] == [t.token_ids.tolist() for t in trajectories]
  # The compact vocabulary (model.vocab='dataset'): every id of the trajectories and of the RL questions.
  vocab = json.loads((tmp_path / pipeline_data.VOCAB_FILE).read_text())
  assert vocab == sorted(set(vocab)) and stats['vocab_ids'] == len(vocab)
  assert {traj_lib.ENDOFTEXT_ID, traj_lib.IMAGE_PAD_ID} <= set(vocab)
  assert all(set(t.token_ids.tolist()) <= set(vocab) for t in trajectories)
  assert set(traj_lib.load_tokenizer().encode(prompts[0]['question'])) <= set(vocab)
  again = build.build_dataset(config, tmp_path)
  assert all(again[s]['resumed'] for s in build.STAGES)
  assert again['sft_sharegpt'] == {'written': len(sft), 'resumed': True}
  assert again['wiki']['graph'] == stats['wiki']['graph']
  assert again['summary'] == stats['summary']
  assert json.loads((tmp_path / build.BUILD_CONFIG_FILE).read_text()) == build.build_settings(config)
  config.num_items = 4   # another build: refused, not answered with the 3 old items
  with pytest.raises(ValueError, match="num_items: built with 3, asked 4"):
    build.build_dataset(config, tmp_path)


@pytest.mark.parametrize('field, value, match', [
    ('num_items', 7, 'num_items: built with 5, asked 7'), ('seed', 1, 'seed: built with 0, asked 1'),
    ('hop_probs', (0.2, 0.4, 0.4), 'hop_probs: built with'), ('max_pixels', 64 * 64, 'max_pixels: built with'),
])
def test_a_folder_built_with_other_settings_is_refused_naming_the_difference(tmp_path, field, value, match):
  config = build.default_config()
  config.num_items = 5
  (tmp_path / build.BUILD_CONFIG_FILE).write_text(json.dumps(build.build_settings(config)))
  _finished_stage(tmp_path, 'paths')
  config.dir, config.data_dir, config.synthesize.enabled = '/elsewhere', '/data', False   # where, not what: no difference
  build._check_resume(tmp_path, build.build_settings(config))
  config[field] = value
  with pytest.raises(ValueError, match=match):
    build.build_dataset(config, tmp_path)


def _finished_stage(out: pathlib.Path, name: str) -> None:
  """Plants what makes `out/name` a finished stage (its counts.json)."""
  (out / name).mkdir()
  (out / name / pipeline_data.COUNTS_FILE).write_text('{}')


def test_a_folder_with_stages_but_no_recorded_settings_is_refused(tmp_path):
  _finished_stage(tmp_path, 'items')
  with pytest.raises(ValueError, match='without build_config.json'):
    build.build_dataset(build.default_config(), tmp_path)
  assert not (tmp_path / build.BUILD_CONFIG_FILE).exists()


def test_a_bad_data_config_is_refused_before_anything_is_written(tmp_path):
  config = build.default_config()
  config.num_items = 0
  with pytest.raises(ValueError, match='data.num_items=0'):
    build.build_dataset(config, tmp_path / 'out')
  assert not (tmp_path / 'out').exists()


def test_readers_name_the_missing_split_and_the_build_command(tmp_path):
  with pytest.raises(FileNotFoundError, match='python -m data_pipeline.build --config='):
    pipeline_data.load_sft(tmp_path)
  with pytest.raises(FileNotFoundError, match='items'):
    pipeline_data.load_prompts(tmp_path)


def test_data_config_and_dataset_dir():
  path = pathlib.Path(__file__).parents[2] / 'configs' / 'data_wikispeedia.py'
  spec = importlib.util.spec_from_file_location('data_wikispeedia', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  assert config.data.num_items == build.default_config().num_items
  assert (config.data.hub_in_degree, config.data.min_seed_in_degree) == (600, 2)  # the small graph's window
  assert (build.default_config().hub_in_degree, build.default_config().min_seed_in_degree) == (10_000, 50)
  assert pipeline_data.dataset_dir(config, '/w') == pathlib.Path('/w/data')
  config.data.dir = '/elsewhere'
  assert str(pipeline_data.dataset_dir(config, '/w')) == '/elsewhere'


def test_an_older_recorded_config_without_a_new_field_resumes_at_its_default(tmp_path):
  config = build.default_config()
  old = build.build_settings(config)
  del old['source']  # a folder built before `data.source` existed
  (tmp_path / build.BUILD_CONFIG_FILE).write_text(json.dumps(old))
  _finished_stage(tmp_path, 'wiki')
  build._check_resume(tmp_path, build.build_settings(config))  # 'wikispeedia' = the default: no difference
  config.source = str(pathlib.Path(__file__))  # another source is a difference
  with pytest.raises(ValueError, match="source: built with 'wikispeedia'"):
    build._check_resume(tmp_path, build.build_settings(config))


def test_degrade_and_filter_switches_and_their_counts(tmp_path):
  config = build.wikispeedia_walks(build.default_config())
  config.num_items, config.synthesize.enabled, config.degrade_fraction = 12, False, 0.5
  stats = build.build_dataset(config, tmp_path / 'on')
  items = datasets.load_from_disk(str(tmp_path / 'on' / 'items')).to_list()
  degraded = [r for r in items if r['degradation']]
  assert len(degraded) == stats['items']['degraded'] == round(0.5 * stats['items']['accepted']) >= 2
  for r in degraded:
    assert r['image_path'] == f"{build.DEGRADED_DIR}/{r['prompt_id']}.png"   # relative to the dataset folder
    assert r['original_image_path'].startswith('images/landmarks/')
  prompts = pipeline_data.load_prompts(tmp_path / 'on')   # the degraded PNGs load through the readers
  assert len(prompts) == stats['items']['accepted']
  config.degrade, config.filter.enabled = False, False   # the Table 3a ablations
  stats = build.build_dataset(config, tmp_path / 'off')
  assert stats['degrade']['degraded'] == 0 and stats['filter']['skipped'] == {'disabled': stats['ground']['grounded']}
  with pytest.raises(ValueError, match='data.degrade_fraction=2'):
    config.degrade_fraction = 2
    build.build_dataset(config, tmp_path / 'bad')


def test_more_attributes_per_path_make_items_of_one_split_with_their_own_answers(tmp_path):
  config = build.wikispeedia_walks(build.default_config())
  config.num_items, config.attributes_per_path, config.rl_fraction = 4, 2, 0.3
  stats = build.build_dataset(config, tmp_path)
  items = {r['prompt_id']: r for r in datasets.load_from_disk(str(tmp_path / 'items')) if not r['rejected']}
  more = [p for p in items if p != splits.walk_id(p)]
  assert more and stats['qa']['more_attributes'] == len(more) and len(items) == stats['items']['accepted']
  for p in more:   # the walk's path, another attribute, another answer
    first, other = items[splits.walk_id(p)], items[p]
    assert other['path'] == first['path'] and p == f"{first['prompt_id']}-{other['answer_attribute']}"
    assert other['answer_attribute'] != first['answer_attribute'] and other['answers'][0] != first['answers'][0]
  trajectories = pipeline_data.load_sft(tmp_path)
  for t in trajectories:   # each expert answers its own item's attribute
    assert list(t.answers) == list(items[t.prompt_id]['answers']) and t.final_response in t.answers, t.prompt_id
  rl_walks = {splits.walk_id(p['prompt_id']) for p in pipeline_data.load_prompts(tmp_path)}
  assert rl_walks and trajectories and not rl_walks & {splits.walk_id(t.prompt_id) for t in trajectories}


def test_a_bad_source_is_refused_naming_the_field(tmp_path):
  config = build.default_config()
  config.source = str(tmp_path / 'missing.xml.bz2')
  with pytest.raises(ValueError, match='data.source=.*missing.xml.bz2'):
    build.build_dataset(config, tmp_path / 'out')
  assert not (tmp_path / 'out').exists()


def _page(title, text, redirect=None):
  from xml.sax.saxutils import escape
  red = f'<redirect title="{escape(redirect)}" />' if redirect else ''
  return (f'<page><title>{escape(title)}</title><ns>0</ns><id>{len(title)}</id>{red}<revision><id>1</id>'
          f'<text xml:space="preserve">{escape(text)}</text></revision></page>')


def test_an_xml_dump_builds_end_to_end(tmp_path):
  import bz2
  from PIL import Image
  pages = [
      _page('Eiffel Tower', "{{Infobox building\n| name = Eiffel Tower\n| image = Eiffel tower.jpg\n}}\nThe '''Eiffel "
            "Tower''' is a lattice tower. It stands in [[Paris]]. It was designed by [[Gustave Eiffel|Eiffel]]."),
      _page('Paris', '{{Infobox settlement\n| name = Paris\n}}\nParis is part of [[France]]. The [[Eiffel Tower]] '
            'stands here.'),
      _page('Gustave Eiffel', '{{Infobox person\n| name = Gustave Eiffel\n}}\nGustave Eiffel was an engineer born '
            'in [[Dijon]]. He worked in [[France]].'),
      _page('France', '{{Infobox country\n| capital = [[Paris]]\n}}\nFrance is a country.'),
      _page('Dijon', '{{Infobox settlement\n| name = Dijon\n}}\nDijon is a city in [[France]].'),
      _page('Paris (disambiguation)', "'''Paris''' may refer to [[Paris]].\n{{disambiguation}}"),
      _page('Eiffel', '#REDIRECT [[Gustave Eiffel]]', redirect='Gustave Eiffel')]
  dump = tmp_path / 'dump.xml.bz2'
  dump.write_bytes(bz2.compress(('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/"><siteinfo>'
                                 '<namespaces><namespace key="0" /></namespaces></siteinfo>' + ''.join(pages) +
                                 '</mediawiki>').encode()))
  (tmp_path / 'img').mkdir()
  Image.new('RGB', (512, 600), (120, 90, 60)).save(tmp_path / 'img' / 'Eiffel tower.jpg')   # D.1: >= 512 a side
  config = build.default_config()
  config.update(dict(source=str(dump), num_items=4, hop_choices=(2,), hop_probs=(1.0,), min_seed_in_degree=1,
                     image_dir=str(tmp_path / 'img')))
  stats = build.build_dataset(config, tmp_path / 'out')
  # One seed (Eiffel Tower: infobox image, in-degree 1). h = 2 walks: -> Paris -> France answers Paris, a path
  # node ('no answer'); -> Gustave Eiffel -> France (capital Paris) is the one item; the other 3 repeat it.
  assert stats['paths']['seed_candidates'] == 1 and stats['paths']['walked'] == 1
  assert set(stats['paths']['rejected']) <= {'no answer', 'duplicate'} and stats['paths']['rejected']['duplicate']
  (item,) = datasets.load_from_disk(str(tmp_path / 'out' / 'items')).to_list()
  assert item['path'] == ['Eiffel Tower', 'Gustave Eiffel', 'France'] and item['answers'][0] == 'Paris'
  assert item['question'] == ('What is the capital of the country mentioned in the article on the person who '
                              'designed the building in the image?')
  assert item['image_path'] == f"{tmp_path / 'img'}/Eiffel tower.jpg" and item['rejected'] is None
  paths_split = datasets.load_from_disk(str(tmp_path / 'out' / 'paths')).to_list()
  assert paths_split[0]['relations'] == ['designed by', 'mentioned in']
  assert stats['items']['accepted'] == 1 and stats['ground']['grounded'] == 1
  assert stats['sft']['kept'] == 0 and list(stats['sft']['reasons']) == [
      'skipped: xml source (text_search corpus is Wikispeedia)']
  texts = {a.title: a.text for a in wiki.load(tmp_path / 'out' / 'wiki').articles}
  assert texts['Eiffel Tower'] == 'The Eiffel Tower is a lattice tower. It stands in Paris. It was designed by Eiffel.'
  assert set(build.STAGES) <= set(json.loads((tmp_path / 'out' / 'stats.json').read_text()))
  # No image file under image_dir: the item is rejected at `ground` with the reason counted, nothing crashes.
  config.image_dir = str(tmp_path / 'none')
  stats = build.build_dataset(config, tmp_path / 'out2')
  assert stats['ground']['rejected'] == {'image file missing': 1} and stats['items']['accepted'] == 0
  assert stats['summary']['sft_trajectories'] == 0
  # An anchor image below the seed rule's size (D.1: 512 x 512; here 513): rejected, the reason counted.
  config.image_dir, config.min_image_side = str(tmp_path / 'img'), 513
  stats = build.build_dataset(config, tmp_path / 'out3')
  assert stats['ground']['rejected'] == {'anchor image below 513x513': 1} and stats['items']['accepted'] == 0
  (item,) = datasets.load_from_disk(str(tmp_path / 'out3' / 'items')).to_list()
  assert item['rejected'].startswith('ground: anchor image below 513x513 (512x600: ')


def test_an_xml_dump_with_no_seed_gives_zero_items_with_reasons(tmp_path):
  from osvl_jax import paths as osvl_paths
  config = build.default_config()   # tau 10,000, seeds need in-degree >= 50: none in the 2-article sample
  config.source = str(osvl_paths.data_dir() / 'wikipedia' / 'wikipedia2vec' / 'enwiki-pages-articles-sample.xml.bz2')
  config.num_items = 5
  stats = build.build_dataset(config, tmp_path)
  assert stats['paths']['rejected'] == {'no seed candidate': 5} and stats['items']['items'] == 0
  assert stats['summary'] == {'accepted_items': 0, 'landmarks': 0, 'distinct_paths': 0, 'distinct_answers': 0,
                              'sft_trajectories': 0, 'rl_prompts': 0}
  assert set(build.STAGES) <= set(json.loads((tmp_path / 'stats.json').read_text()))
  again = build.build_dataset(config, tmp_path)   # the empty splits resume, and read as empty
  assert all(again[s]['resumed'] for s in build.STAGES) and again['summary'] == stats['summary']
  assert pipeline_data.load_prompts(tmp_path) == [] and len(datasets.load_from_disk(str(tmp_path / 'items'))) == 0
  datasets.Dataset.from_dict({'prompt_id': []}).save_to_disk(str(tmp_path / 'old'))   # as builds before wrote one:
  (tmp_path / 'old' / pipeline_data.COUNTS_FILE).write_text('{"n": 0}')                # no data file at all
  assert pipeline_data.read_split(tmp_path / 'old') == ([], {'n': 0})


@pytest.mark.parametrize('field, value, match', [
    ('anchor', 'image', "data.anchor='image'"), ('rewrite', 'no', "data.rewrite='no'"),
    ('image_dir', '', "data.image_dir=''"), ('min_seed_in_degree', 0, 'data.min_seed_in_degree'),
    ('min_seed_in_degree', 20_000, 'seed in-degree window is empty'),
    ('attributes_per_path', 0, 'data.attributes_per_path=0'),
])
def test_walk_and_ablation_switches_are_checked_and_recorded(tmp_path, field, value, match):
  settings = build.build_settings(build.default_config())
  assert {k: settings[k] for k in ('anchor', 'rewrite', 'hub_in_degree', 'min_seed_in_degree', 'image_dir',
                                   'attributes_per_path')} == {
      'anchor': 'source', 'rewrite': True, 'hub_in_degree': 10_000, 'min_seed_in_degree': 50,
      'image_dir': 'images/landmarks', 'attributes_per_path': 1}   # content settings: a rerun with another value is refused
  config = ml_collections.ConfigDict({**build.default_config().to_dict(), field: value})  # any type, as a flag
  with pytest.raises(ValueError, match=match):
    build.build_dataset(config, tmp_path / 'out')
  assert not (tmp_path / 'out').exists()


def _xml_sample_config() -> ml_collections.ConfigDict:
  """The 2-article XML sample: a whole build in seconds (no seed, so no item)."""
  from osvl_jax import paths as osvl_paths
  config = build.default_config()
  config.source = str(osvl_paths.data_dir() / 'wikipedia' / 'wikipedia2vec' / 'enwiki-pages-articles-sample.xml.bz2')
  config.num_items = 2
  return config


_HOLD = """import pathlib, sys
from data_pipeline import dataset_folder
with dataset_folder.locked(pathlib.Path(sys.argv[1])):
  print('held', flush=True)
  sys.stdin.read()
"""


def test_a_second_build_of_a_held_folder_fails_at_once_naming_the_holder(tmp_path):
  out = tmp_path / 'data'
  out.mkdir()
  holder = subprocess.Popen([sys.executable, '-c', _HOLD, str(out)], cwd=pathlib.Path(__file__).parents[2],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline() == 'held\n'
    t0 = time.perf_counter()
    with pytest.raises(BlockingIOError, match=rf'{out} is being built by another process \(pid {holder.pid}, '):
      build.build_dataset(_xml_sample_config(), out)
    assert time.perf_counter() - t0 < 5 and sorted(p.name for p in out.iterdir()) == [dataset_folder.LOCK_FILE]
  finally:
    holder.send_signal(signal.SIGKILL)   # a killed holder leaves its lock file, not its lock
    holder.wait()
  stats = build.build_dataset(_xml_sample_config(), out)
  assert not any(stats[s]['resumed'] for s in build.STAGES)
  assert (out / dataset_folder.LOCK_FILE).read_text() == f'{os.getpid()}\n'


def test_a_stage_is_marked_finished_only_once_its_files_are_on_disk(tmp_path, monkeypatch):
  """`counts.json` (what makes a split finished) is fsynced after every data file, then the folder is renamed into
  place and the rename itself fsynced."""
  events, real_fsync, real_replace = [], os.fsync, os.replace
  monkeypatch.setattr(os, 'fsync', lambda fd: (events.append(('fsync', os.readlink(f'/proc/self/fd/{fd}'))),
                                                real_fsync(fd)))
  monkeypatch.setattr(os, 'replace', lambda a, b: (events.append(('replace', str(a), str(b))), real_replace(a, b)))
  dataset_folder.save_split([{'prompt_id': 'p0', 'x': 1}, {'prompt_id': 'p1', 'x': 2}], tmp_path / 'qa', {'n': 2})
  tmp, final = str(tmp_path / 'qa.tmp'), str(tmp_path / 'qa')
  assert datasets.load_from_disk(final)['x'] == [1, 2]
  renamed = events.index(('replace', tmp, final))
  synced = [e[1] for e in events[:renamed] if e[0] == 'fsync']
  files = sorted(p.name for p in (tmp_path / 'qa').iterdir())
  assert len(files) >= 4 and pipeline_data.COUNTS_FILE in files
  for name in files:
    assert f'{tmp}/{name}' in synced, (name, synced)
  counts_synced = synced.index(f'{tmp}/{pipeline_data.COUNTS_FILE}')
  assert all(synced.index(f'{tmp}/{name}') < counts_synced for name in files if name != pipeline_data.COUNTS_FILE)
  assert ('fsync', str(tmp_path)) in events[renamed:]   # the rename is durable too


def test_an_llm_endpoint_outage_fails_the_build_and_the_rerun_asks_again(tmp_path):
  """Every request of `qa`'s LLM answered 503: the build raises naming the stage, `qa` is not saved; the rerun
  (endpoint back) resumes `paths` and asks again."""
  from tests.rollout import openai_double
  down = [True]
  double = openai_double.ChatDouble(lambda body, n: openai_double.Reply(status=503) if down[0] else
                                    '{"verdict": "yes", "reason": "one referent"}')
  config = build.wikispeedia_walks(build.default_config())
  config.num_items, config.synthesize.enabled = 2, False
  with double.serve() as url:
    config.llm_questions.update(base_url=url, model='m', max_retries=0)
    with pytest.raises(llm.EndpointDown, match=rf'stage qa: .*{url}.*"http_503": 2'):
      build.build_dataset(config, tmp_path)
    assert pipeline_data.has_split(tmp_path / 'paths') and not (tmp_path / 'qa').exists()
    asked = len(double.bodies)
    down[0] = False
    stats = build.build_dataset(config, tmp_path)
  assert stats['paths']['resumed'] and not stats['qa']['resumed']
  assert len(double.bodies) == asked + 2 * 2 == 6   # the 2 canonical questions asked again, the 2 judged
  assert stats['qa']['llm_questions']['llm']['replies'] == 2 and stats['rewrite']['unique_referent']['unique'] == 2
  assert stats['items']['accepted'] == 2


def test_only_the_failures_of_an_unanswering_endpoint_are_an_outage():
  kinds = ('connection', 'timeout', 'http_500', 'http_503', 'http_429', 'http_401', 'http_404', 'http_400',
           'http_422', 'bad_reply', 'bad_response', 'budget')
  assert [k for k in kinds if llm.outage_kind(k)] == list(kinds[:7])   # an item's own 400 / reply is its reason
  counts = {'endpoint': 'A', 'llm': {'error_kinds': {'http_400': 1}},
            'unique_referent': {'endpoint': 'B', 'llm': {'error_kinds': {'timeout': 2, 'bad_reply': 1}}},
            'filter': {'endpoint': 'B', 'llm': {'error_kinds': {'timeout': 1, 'connection': 3}}}}
  assert llm.outages(counts) == {'B': {'timeout': 3, 'connection': 3}}
  assert llm.outages({'endpoint': 'A', 'llm': {'requests': 4}}) == {}   # a test double's stats: nothing failed


def test_a_failed_first_stage_does_not_block_a_retry_with_other_settings(tmp_path):
  bad = tmp_path / 'broken.xml.bz2'
  bad.write_bytes(b'BZh91AY&SY not a bzip2 stream')
  config = _xml_sample_config()
  good = config.source
  config.source = str(bad)
  with pytest.raises(ValueError, match='broken.xml.bz2: not a bz2-compressed pages-articles dump'):
    build.build_dataset(config, tmp_path / 'out')
  assert not pipeline_data.has_split(tmp_path / 'out' / 'wiki')
  config.source = good   # the retry with the right dump builds (nothing was built with the first settings)
  stats = build.build_dataset(config, tmp_path / 'out')
  assert stats['wiki']['resumed'] is False and stats['items']['items'] == 0
  assert json.loads((tmp_path / 'out' / build.BUILD_CONFIG_FILE).read_text())['source'] == good
