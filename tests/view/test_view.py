"""`python -m osvl_jax.view`: the static trajectory page of an evaluation run, a GRPO rollout dump and a dataset,
read back from headless Chromium (Debian's `chromium`) as a person sees it: the rendered DOM after the page's script
ran, and a screenshot whose pixels must show the trajectory's images."""

import json
import os
import pathlib
import pickle
import re
import shutil
import subprocess
import sys

import datasets
import numpy as np
import pytest
from PIL import Image

from osvl_jax import trajectory as tj
from osvl_jax import view
from osvl_jax.eval import results, runner
from osvl_jax.judges import base as judges_base
from osvl_jax.rl import fatal as fatal_lib
from osvl_jax.rollout import engine as engine_lib
from osvl_jax.train import grpo, rollouts
from tests.eval.conftest import CountingJudge, small_config
from tools import env as tools_env
from tools.base import ToolResult

RED, BLUE = (255, 0, 0), (0, 0, 255)
CROP = ('<think>zoom in on {k}</think>\n<tool_call>{{"name": "crop", "arguments": {{"image": "img_1", "x": 0, "y": 0, '
        '"width": 32, "height": 32}}}}</tool_call>')


def _chromium() -> str:
  path = shutil.which('chromium') or shutil.which('chromium-browser')
  if path is None:
    message = "Debian's chromium is not installed (apt-get install -y chromium; .ci/run installs it)"
    if os.environ.get('CI'):
      pytest.fail(message)
    pytest.skip(message)
  return path


def _browser(page: pathlib.Path, *args: str, fragment: str = '') -> subprocess.CompletedProcess:
  return subprocess.run([_chromium(), '--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars',
                         '--allow-file-access-from-files', *args, page.as_uri() + fragment],
                        capture_output=True, text=True, timeout=120, check=True)


def _dom(page: pathlib.Path, fragment: str = '') -> str:
  return _browser(page, '--dump-dom', fragment=fragment).stdout


def _screenshot(page: pathlib.Path, out: pathlib.Path) -> np.ndarray:
  _browser(page, f'--screenshot={out}', '--window-size=1100,2400')
  return np.asarray(Image.open(out).convert('RGB'))


def _covers(shot: np.ndarray, colour, min_pixels: int) -> bool:
  """The screenshot has at least `min_pixels` pixels of `colour` (within 8 per channel)."""
  return int((np.abs(shot.astype(int) - colour).max(-1) <= 8).sum()) >= min_pixels


def _cards(dom: str) -> list[str]:
  return re.findall(r'<article class="traj".*?</article>', dom, flags=re.S)


def _fatal_trajectory(tokenizer, processor, sample_index: int) -> tj.Trajectory:
  """A red 64x64 prompt image; step 0 crops it (the tool returns a blue 96x160 image); steps 1-3 time out (a fatal
  cascade of k = 3 execution errors: f_i = 1); step 4 answers."""
  b = tj.TrajectoryBuilder(tokenizer, processor, [])
  b.start('Which landmark is this?', np.full((64, 64, 3), RED, np.uint8))
  for k in range(4):
    b.append_assistant(tokenizer.encode(CROP.format(k=k), add_special_tokens=False) + [tj.IM_END_ID])
    b.append_observation(ToolResult(ok=True, text='cropped', images=[np.full((96, 160, 3), BLUE, np.uint8)])
                         if k == 0 else ToolResult(ok=False, error_kind='timeout', text='crop timed out'))
  answer = tj.render_assistant_text('It is the Taj Mahal.', response='Agra')
  b.append_assistant(tokenizer.encode(answer, add_special_tokens=False) + [tj.IM_END_ID])
  steps = b.finish().execution_errors
  return b.finish(prompt_id='q1', sample_index=sample_index, answers=['Agra'],
                  fatal_step=fatal_lib.fatal_step(steps, k=3), stop_reason='response')


@pytest.fixture(scope='module')
def tokenizer():
  return tj.load_tokenizer()


@pytest.fixture(scope='module')
def processor():
  return tj.ImageProcessor(min_pixels=32 * 32, max_pixels=256 * 256)


@pytest.mark.parametrize('fatal_mode', ['mask_clamp', 'none'])
def test_a_rollout_dump_shows_images_steps_the_fatal_step_and_the_masked_tokens(tmp_path, tokenizer, processor,
                                                                                fatal_mode):
  trajs = [_fatal_trajectory(tokenizer, processor, i) for i in range(2)]
  assert trajs[0].fatal_step == 1
  scores = [rollouts.score(t) for t in trajs]
  (tmp_path / 'rollouts').mkdir()
  (tmp_path / 'rollouts' / '00000003.pkl').write_bytes(pickle.dumps(
      {'trajectories': trajs, 'scores': scores, 'fatal_mode': fatal_mode}))
  page, found = view.view(tmp_path, tmp_path / 'page')
  assert found == {'rollout': 2}
  dom = _dom(page)
  assert 'showing 2 of 2 trajectories' in dom  # the page's script ran
  cards = _cards(dom)
  assert len(cards) == 2
  steps = re.findall(r'<li class="([^"]*)" data-step="(\d)">(.*?)</li>', cards[0], flags=re.S)
  assert [int(s[1]) for s in steps] == [0, 1, 2, 3, 4]
  emitted = [int(n) for n in re.findall(r'(\d+) tokens emitted', cards[0])]
  kept = [int(n) for n in re.findall(r'(\d+) in the loss', cards[0])]
  assert emitted == [int(trajs[0].gen_mask[trajs[0].step_of_token == l].sum()) for l in range(5)]
  if fatal_mode == 'mask_clamp':  # Eq. 10: the tokens of steps l >= f_i = 1 leave the loss
    assert kept == emitted[:1] + [0] * 4
    assert [('masked' in s[0], 'fatal' in s[0]) for s in steps] == [(False, False), (True, True)] + [(True, False)] * 3
  else:
    assert kept == emitted and not any('masked' in s[0] for s in steps) and 'fatal' in steps[1][0]
  assert 'error: timeout' in steps[1][2] and '<code>crop</code>' in steps[0][2]
  assert f"r_fmt</b> {scores[0]['r_fmt']:.3f}" in cards[0] and 'fatal step</b> 1' in cards[0]
  shot = _screenshot(page, tmp_path / 'shot.png')
  assert _covers(shot, RED, 60 * 60) and _covers(shot, BLUE, 90 * 150)  # both images are drawn, at full size


class FirstCorrect(CountingJudge):
  """The counting judge that finds only the first answer it judges correct."""

  def accuracy(self, question, response, answers, *, hints=None):
    super().accuracy(question, response, answers, hints=hints)
    return judges_base.Verdict(float(len(self.judged) == 1))


def test_an_evaluation_run_links_its_page_and_filters_by_verdict(tmp_path, tokenizer):
  """The evaluation writes its page (report.md links it); each record's card shows its benchmark, verdict, every
  step and every image; `#verdict=correct` in the page's address filters the cards."""
  env = tools_env.ToolEnv({'enabled': ('crop',)})
  script = [CROP.format(k=0), tj.render_assistant_text('The river.', response='Tagus River')]
  rep = runner.evaluate(small_config(), tmp_path, engine=engine_lib.ScriptedEngine(script, tokenizer),
                        judge=FirstCorrect(), env=env, tokenizer=tokenizer)
  records = [json.loads(line) for line in (tmp_path / 'results.jsonl').read_text().splitlines()]
  trajs = dict(results.read_trajectories(tmp_path))
  page = pathlib.Path(rep['meta']['view'])
  assert page == tmp_path / 'view' / 'index.html' and 'view/index.html' in (tmp_path / 'report.md').read_text()
  dom = _dom(page)
  cards = _cards(dom)
  assert len(cards) == len(records) == 6 and {r['benchmark'] for r in records} == {'fvqa', 'mmsearch'}
  for card, record in zip(cards, records):
    traj = trajs[results.ResultStore.key(record)]
    assert f'data-benchmark="{record["benchmark"]}"' in card
    assert f'data-verdict="{"correct" if record["correct"] else "wrong"}"' in card
    assert card.count('data-step=') == record['turns'] == 2 and '<code>crop</code>' in card
    assert card.count('<img ') == len(traj.images) and ' in the loss' not in card  # no loss in an evaluation
  assert sum(len(t.images) for t in trajs.values()) >= 6  # fvqa's images and their crops
  assert 'showing 6 of 6 trajectories' in dom and '<select data-filter="verdict">' in dom
  filtered = _dom(page, '#verdict=correct')
  assert 'showing 1 of 6 trajectories' in filtered
  assert [c.split('>')[0].count(' hidden') for c in _cards(filtered)] == [not r['correct'] for r in records]


def test_a_dataset_through_the_command_line_and_a_folder_without_trajectories(tmp_path, tokenizer, processor):
  trajs = [_fatal_trajectory(tokenizer, processor, i) for i in range(3)]
  datasets.Dataset.from_list([t.to_record() for t in trajs], features=tj.record_features()).save_to_disk(
      str(tmp_path / 'w' / 'data' / 'sft'))
  cmd = [sys.executable, '-m', 'osvl_jax.view', str(tmp_path / 'w'), f'--out={tmp_path / "page"}']
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
  assert out.strip() == f'view: {tmp_path / "page" / "index.html"} trajectories=3 (records: 3)'
  dom = _dom(tmp_path / 'page' / 'index.html')
  assert len(_cards(dom)) == 3 and dom.count('masked from the loss') == 0  # SFT: every emitted token supervised
  assert len(list((tmp_path / 'page' / 'images').iterdir())) == 2  # each distinct image written once
  (tmp_path / 'empty').mkdir()
  bad = subprocess.run(cmd[:3] + [str(tmp_path / 'empty'), '--out=x'], capture_output=True, text=True, timeout=300)
  assert bad.returncode == 2 and 'no trajectories found' in bad.stderr and bad.stdout == ''


def _nasty_record(tokenizer, processor) -> dict:
  """A trajectory record whose model text needs escaping: a script element, a closing tag, quotes and a lone
  surrogate (JSON '\\ud800') in the last step's response and the final answer."""
  record = _fatal_trajectory(tokenizer, processor, 7).to_record()
  nasty = 'A<script>document.title="pwned"</script></div></article>"\'&amp;\ud800Z'
  record['steps'][-1]['response'] = nasty
  record['final_response'] = nasty
  return record


def test_model_text_renders_as_text(tmp_path, tokenizer, processor):
  path = tmp_path / 'trajs.jsonl'
  path.write_text(json.dumps({**_nasty_record(tokenizer, processor),
                              'images': []}) + '\n', encoding='utf-8')   # (json.dumps escapes the surrogate)
  page, found = view.view(path, tmp_path / 'page')
  assert found == {'records': 1}
  html_text = page.read_text(encoding='utf-8')
  assert html_text.count('<script>') == 1   # the page's own
  assert '&lt;script&gt;document.title=&quot;pwned&quot;&lt;/script&gt;' in html_text
  assert 'A&lt;script&gt;' in html_text and '&amp;amp;\ufffdZ' in html_text   # the surrogate as U+FFFD
  dom = _dom(page)
  assert 'showing 1 of 1 trajectories' in dom and '<title>' in dom and 'pwned' not in dom.split('</title>')[0]
  card, = _cards(dom)
  assert card.count('&lt;/div&gt;&lt;/article&gt;"\'&amp;amp;\ufffdZ') == 2   # the response and the final answer


def record_json(record: dict) -> str:
  """`Trajectory.to_json`'s line of a record (PNG bytes as base64)."""
  import base64
  record['images'] = [{**im, 'png': base64.b64encode(im['png']).decode('ascii')} for im in record['images']]
  return json.dumps(record, ensure_ascii=False)


def test_unreadable_parts_are_named_and_the_rest_is_shown(tmp_path, tokenizer, processor):
  """A torn line, a record with a corrupt PNG, a half-written dump and a dump of an unknown fatal_mode: each named
  on the page, every readable trajectory shown."""
  good = _fatal_trajectory(tokenizer, processor, 0)
  corrupt = good.to_record()
  corrupt['images'][0]['png'] = b'\x89PNG\r\n\x1a\n broken'
  corrupt = record_json(corrupt)
  lines = [good.to_json(), good.to_json()[:200], corrupt, good.to_json()]
  (tmp_path / 'trajs.jsonl').write_text('\n'.join(lines) + '\n', encoding='utf-8')
  page, found = view.view(tmp_path / 'trajs.jsonl', tmp_path / 'page')
  assert found['records'] == 2 and [u.split(': ')[0] for u in found['unreadable']] == [
      f"{tmp_path / 'trajs.jsonl'}:2", f"{tmp_path / 'trajs.jsonl'}:3"]
  assert ': JSONDecodeError: ' in found['unreadable'][0]
  assert ': ImageDecodeError: cannot decode image bytes' in found['unreadable'][1]
  dumps = tmp_path / 'w' / 'rollouts'
  dumps.mkdir(parents=True)
  whole = pickle.dumps({'trajectories': [good], 'scores': [rollouts.score(good)], 'fatal_mode': 'mask_clamp'})
  (dumps / '00000001.pkl').write_bytes(whole)
  (dumps / '00000002.pkl').write_bytes(whole[:len(whole) // 2])
  (dumps / '00000003.pkl').write_bytes(pickle.dumps({'trajectories': [good], 'fatal_mode': 'bogus'}))
  page, found = view.view(tmp_path / 'w', tmp_path / 'page2')
  assert found['rollout'] == 2 and len(found['unreadable']) == 2
  assert found['unreadable'][0].startswith(f'{dumps / "00000002.pkl"}: ')
  assert found['unreadable'][1].startswith(f"{dumps / '00000003.pkl'}: fatal_mode 'bogus' is not one of")
  dom = _dom(page)
  cards = _cards(dom)
  assert 'showing 2 of 2 trajectories' in dom and len(cards) == 2
  assert ' in the loss' in cards[0] and ' in the loss' not in cards[1]   # no mask for the unknown mode
  assert dom.count('<li>' + str(dumps)) == 2 and 'unreadable: 2' in dom


def test_eval_trajectories_past_the_limit_and_after_a_torn_line(tmp_path, tokenizer, processor):
  """A killed run's torn last trajectory line does not swallow the next run's first; records whose trajectory lies
  past `limit` are counted as such, not as records without a trajectory."""
  records = [{'run': 'r', 'benchmark': 'fvqa', 'item_key': f'k{i}', 'id': str(i), 'correct': True, 'judge_score': 1.0}
             for i in range(4)]
  (tmp_path / results.RESULTS_FILE).write_text(''.join(json.dumps(r) + '\n' for r in records))
  traj = _fatal_trajectory(tokenizer, processor, 0)
  results.append_trajectory(tmp_path, ('r', 'fvqa', 'k0'), traj)
  with open(tmp_path / results.TRAJECTORIES_FILE, 'a', encoding='utf-8') as f:
    f.write('{"run": "r", "benchmark": "fvqa", "item_key": "k1", "trajectory": {"prompt_id": "q1", "samp')  # killed
  results.append_trajectory(tmp_path, ('r', 'fvqa', 'k2'), traj)   # the resumed run
  results.append_trajectory(tmp_path, ('r', 'fvqa', 'k3'), traj)
  assert [k for k, _ in results.read_trajectories(tmp_path)] == [('r', 'fvqa', 'k0'), ('r', 'fvqa', 'k2'),
                                                                  ('r', 'fvqa', 'k3')]
  entries, found = view.load(tmp_path, limit=1)
  assert found == {'eval_records_past_limit': 2, 'eval_records_without_trajectory': 1, 'eval': 1}
  assert [e.where for e in entries] == ['r / fvqa / 0']


_DUMP_ON_A_FULL_DISK = """import pathlib, resource, signal, sys
from osvl_jax.train import grpo
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))   # the disk fills after 4 KiB
grpo.dump_rollout_batch(pathlib.Path(sys.argv[1]), 2, {'trajectories': [], 'blob': b'x' * 100_000})
"""


def test_a_rollout_dump_cut_short_leaves_no_dump_behind(tmp_path, tokenizer, processor):
  traj = _fatal_trajectory(tokenizer, processor, 0)
  grpo.dump_rollout_batch(tmp_path, 1, {'trajectories': [traj], 'scores': [rollouts.score(traj)],
                                        'fatal_mode': 'mask_clamp'})
  done = subprocess.run([sys.executable, '-c', _DUMP_ON_A_FULL_DISK, str(tmp_path)], capture_output=True, text=True,
                        timeout=300, cwd=pathlib.Path(__file__).parents[2])
  assert done.returncode != 0 and 'File too large' in done.stderr, done.stderr[-2000:]
  assert sorted(p.name for p in (tmp_path / 'rollouts').glob('*.pkl')) == ['00000001.pkl']
  _, found = view.load(tmp_path)
  assert found == {'rollout': 1}
