"""Resuming an interrupted build (DESIGN.md §7: stages are separate and resumable): `python -m data_pipeline.build`
killed with SIGKILL in the middle of its stages, then rerun to completion, gives the same final dataset as an
uninterrupted build in another folder: the same prompt ids (no duplicates), an identical item table, identical SFT
records (but for the tool calls' wall-clock durations), degraded images and ShareGPT file.

The kill points come from the build's own stage log on stderr (`[data_pipeline] <stage>: {counts}`, printed once
the stage's output is saved): the first run is killed as soon as `qa` is saved (while `rewrite` .. `items` run),
the second as soon as `items` is saved (while the `sft` stage's expert rollouts run). A kill inside `_save` leaves
a `<stage>.tmp` folder behind; the test plants such a half-written folder before the last run.
"""

import json
import pathlib
import signal
import subprocess
import sys
import time

import datasets

REPO = pathlib.Path(__file__).resolve().parents[2]
NUM_ITEMS = 6
STAGE_LOG = '[data_pipeline] {}:'


def _command(workdir: pathlib.Path) -> list[str]:
  return [sys.executable, '-m', 'data_pipeline.build', '--config=configs/data_wikispeedia.py', f'--workdir={workdir}',
          f'--config.data.num_items={NUM_ITEMS}']


def _build(workdir: pathlib.Path, log: pathlib.Path) -> None:
  with open(log, 'w') as f:
    done = subprocess.run(_command(workdir), cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=300)
  assert done.returncode == 0, log.read_text()[-3000:]


def _build_killed_after(workdir: pathlib.Path, log: pathlib.Path, stage: str) -> None:
  """Starts a build and SIGKILLs it as soon as its log says `stage` is saved; fails if it ends before that."""
  with open(log, 'w') as f:
    proc = subprocess.Popen(_command(workdir), cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
  try:
    deadline = time.time() + 300
    while STAGE_LOG.format(stage) not in log.read_text():
      assert proc.poll() is None, f'the build ended before {stage} was saved:\n{log.read_text()[-3000:]}'
      assert time.time() < deadline, f'no {stage} stage log after 300 s'
      time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
  finally:
    proc.kill()
    proc.wait()
  assert proc.returncode == -signal.SIGKILL, f'the build exited {proc.returncode} before the kill'


def _without_timings(value):
  """`value` without the wall-clock measurements (`seconds`, `*_seconds`: a tool call's duration), which differ
  between any two runs."""
  if isinstance(value, dict):
    return {k: _without_timings(v) for k, v in value.items() if k != 'seconds' and not k.endswith('_seconds')}
  if isinstance(value, list):
    return [_without_timings(v) for v in value]
  return value


def _dataset(out: pathlib.Path) -> dict:
  """The final dataset's content, with the dataset folder's own path replaced by `<DATASET>`, timings dropped."""
  def table(name):
    rows = datasets.load_from_disk(str(out / name)).to_list()
    return _without_timings(json.loads(json.dumps(rows, sort_keys=True, default=str).replace(str(out), '<DATASET>')))
  return {'items': table('items'), 'sft': table('sft'),
          'sharegpt': (out / 'sft_sharegpt.jsonl').read_text().replace(str(out), '<DATASET>'),
          'degraded': {p.name: p.read_bytes() for p in sorted((out / 'degraded').glob('*.png'))},
          'sharegpt_images': sorted(p.name for p in (out / 'sft_sharegpt_images').iterdir())}


def test_killed_mid_stage_and_rerun_gives_the_same_dataset(tmp_path):
  _build(tmp_path / 'ref', tmp_path / 'ref.log')
  work, out = tmp_path / 'resumed', tmp_path / 'resumed' / 'data'

  _build_killed_after(work, tmp_path / 'kill1.log', 'qa')
  assert (out / 'qa').is_dir() and not (out / 'sft').exists()       # killed before the end (stages after qa run)
  _build_killed_after(work, tmp_path / 'kill2.log', 'items')
  assert (out / 'items').is_dir() and not (out / 'sft').exists()    # killed in the middle of the sft stage
  assert 'resumed": true' in (tmp_path / 'kill2.log').read_text()   # the second run continued the first
  # What a kill inside `_save` leaves: a half-written temp folder of the stage being saved.
  (out / 'sft.tmp').mkdir()
  (out / 'sft.tmp' / 'data-00000-of-00001.arrow').write_bytes(b'half written')
  _build(work, tmp_path / 'final.log')

  stats = json.loads((out / 'stats.json').read_text())
  assert [s for s in ('paths', 'qa', 'items') if stats[s]['resumed']] == ['paths', 'qa', 'items']
  assert stats['sft']['resumed'] is False and not (out / 'sft.tmp').exists()
  got, want = _dataset(out), _dataset(tmp_path / 'ref' / 'data')
  ids = [r['prompt_id'] for r in got['items']]
  # A walk whose seed leads nowhere starts again from another seed: none of the 6 is given up.
  assert len(ids) == len(set(ids)) == NUM_ITEMS - stats['paths']['given_up'] == 6, ids
  assert ids == [r['prompt_id'] for r in want['items']]
  sft_ids = [(r['prompt_id'], r['sample_index']) for r in got['sft']]
  assert len(sft_ids) == len(set(sft_ids)) and sft_ids == [(r['prompt_id'], r['sample_index']) for r in want['sft']]
  for key in want:
    assert got[key] == want[key], f'{key} differs from the uninterrupted build'
  assert got['sft'] and got['sharegpt'].count('\n') == len(got['sft'])
