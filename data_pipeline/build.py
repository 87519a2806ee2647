"""Runs the data pipeline end to end and writes HF `datasets` (DESIGN.md §7).

  python -m data_pipeline.build --out_dir=workdir/data --num_items=60 --seed=0

Stages, each saved with `datasets.Dataset.save_to_disk` under `out_dir/<stage>/` beside its `counts.json`,
skipped when that output already exists (rerunning continues an interrupted build; delete a stage folder to
redo it and everything after it is recomputed only if missing too):

  paths    constrained random walks from the landmark articles (`paths.py`)
  qa       answer from the answer node's infobox + canonical question (`qa.py`)
  rewrite  farthest-to-nearest fuzzy rewrite + non-leakage check (`rewrite.py`)
  ground   landmark photo as the source anchor, v0 -> referring expression, leak check again (`ground.py`)
  items    the item table: prompt_id, question, canonical_question, answers, image_path, path, hops, rejected
           (None when accepted, else the reason), plus the descriptors, trace and evidence
  sft      oracle-expert trajectories (`synthesize.py`), rows of `Trajectory.to_record()`

`out_dir/stats.json` has every stage's counts and seconds. Not run here (they need an LLM endpoint or a policy
model): the LLM judges of §7.4 (ii), Filters A/B (§7.6); `degrade` (§7.7) is left to a later stage.
"""

import json
import os
import pathlib
import sys
import time

import ml_collections
import tqdm

ITEM_COLUMNS = ('prompt_id', 'question', 'canonical_question', 'answers', 'image_path', 'path', 'hops',
                'rejected', 'landmark', 'descriptors', 'answer_attribute', 'answer_evidence', 'anchor_expression',
                'rewrite_trace')


def default_config() -> ml_collections.ConfigDict:
  """Pipeline settings.

  Fields:
    num_items: walks attempted (one per item; landmarks round-robin).
    seed: every random choice derives from it and the item index.
    hop_choices, hop_probs: h ~ Cat(hop_choices; hop_probs).
    max_retries: fresh walks per item before it is dropped.
    hub_in_degree: in-degree above which a node is a hub and skipped (see `paths.py` for the scaling).
    data_dir: shared data folder; '' = `osvl_jax.paths.data_dir()`.
    synthesize: run the oracle expert (needs tools/ and osvl_jax/trajectory.py).
    top_k: text_search hits per oracle call.
    min_pixels, max_pixels: the image processor budget (pixels) for the trajectories' images.
    tools: partial `tools.registry.default_config()` overrides.
  """
  c = ml_collections.ConfigDict()
  c.num_items = 60
  c.seed = 0
  c.hop_choices = (2, 3, 4)
  c.hop_probs = (0.4, 0.4, 0.2)
  c.max_retries = 10
  c.hub_in_degree = 300
  c.data_dir = ''
  c.synthesize = True
  c.top_k = 5
  # Image budget of the expert trajectories' image tokens (must match the policy's image processor).
  c.min_pixels = 64 * 64
  c.max_pixels = 128 * 128
  c.tools = ml_collections.ConfigDict()
  return c


def _save(records: list[dict], folder: pathlib.Path, counts: dict, features=None) -> None:
  """Writes `records` as a dataset + counts.json atomically (temp folder renamed into place)."""
  import datasets
  import shutil
  tmp = folder.with_name(folder.name + '.tmp')
  shutil.rmtree(tmp, ignore_errors=True)
  if records:
    ds = datasets.Dataset.from_list(records, features=features)
  else:
    ds = datasets.Dataset.from_dict({'prompt_id': []}) if features is None else datasets.Dataset.from_list(
        [], features=features)
  ds.save_to_disk(str(tmp))
  (tmp / 'counts.json').write_text(json.dumps(counts, indent=1, default=str))
  shutil.rmtree(folder, ignore_errors=True)
  os.replace(tmp, folder)


def _load(folder: pathlib.Path) -> tuple[list[dict], dict]:
  import datasets
  ds = datasets.load_from_disk(str(folder))
  counts = json.loads((folder / 'counts.json').read_text())
  return ds.to_list(), counts


def _items_features():
  import datasets
  v, seq = datasets.Value, lambda t: datasets.List(datasets.Value(t))
  return datasets.Features({
      'prompt_id': v('string'), 'question': v('string'), 'canonical_question': v('string'),
      'answers': seq('string'), 'image_path': v('string'), 'path': seq('string'), 'hops': v('int32'),
      'rejected': v('string'), 'landmark': v('string'), 'descriptors': seq('string'),
      'answer_attribute': v('string'), 'answer_evidence': v('string'), 'anchor_expression': v('string'),
      'rewrite_trace': seq('string'),
  })


def build_dataset(config: ml_collections.ConfigDict, out_dir: str | os.PathLike) -> dict:
  """Runs (or resumes) every stage and returns the stats (also written to `out_dir/stats.json`).

  Args:
    config: `default_config()` with overrides.
    out_dir: output folder (created).
  Returns:
    {stage: counts (with 'seconds', 'resumed')}, plus 'summary' (accepted items, landmarks, sft kept).
  """
  from data_pipeline import ground, paths, qa, rewrite
  from osvl_jax import paths as osvl_paths
  from tools import corpus as corpus_lib
  from tools import landmarks

  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  data_dir = pathlib.Path(config.data_dir) if config.data_dir else osvl_paths.data_dir()
  corpus = corpus_lib.load_wikispeedia(data_dir)
  graph = paths.Graph(corpus, hub_in_degree=config.hub_in_degree)
  stats = {}

  def stage(name, fn, features=None):
    folder = out / name
    t0 = time.perf_counter()
    if (folder / 'counts.json').is_file():
      records, counts = _load(folder)
      counts = dict(counts, resumed=True)
    else:
      records, counts = fn()
      counts = dict(counts, seconds=round(time.perf_counter() - t0, 2), resumed=False)
      _save(records, folder, counts, features)
    stats[name] = counts
    print(f'[data_pipeline] {name}: {json.dumps(counts, default=str)}', file=sys.stderr)
    return records

  stages = tqdm.tqdm(total=6, desc='data_pipeline', unit='stage')
  recs = stage('paths', lambda: paths.sample_paths(graph, landmarks.LANDMARK_ARTICLES, config))
  stages.update()
  recs = stage('qa', lambda: qa.add_qa(recs, graph, config.seed))
  stages.update()
  recs = stage('rewrite', lambda: rewrite.rewrite(recs, graph.all_titles, config.seed))
  stages.update()
  recs = stage('ground', lambda: ground.ground(recs, graph.all_titles))
  stages.update()

  def make_items():
    rows = [{k: r.get(k) for k in ITEM_COLUMNS} for r in recs]
    ok = [r for r in rows if not r['rejected']]
    counts = {'items': len(rows), 'accepted': len(ok), 'rejected': len(rows) - len(ok),
              'landmarks': len({r['landmark'] for r in ok}),
              'hops': {str(h): sum(r['hops'] == h for r in ok) for h in config.hop_choices},
              'attributes': {a: sum(r['answer_attribute'] == a for r in ok)
                             for a in sorted({r['answer_attribute'] for r in ok})},
              'distinct_questions': len({r['question'] for r in ok})}
    return rows, counts

  items = stage('items', make_items, _items_features())
  stages.update()
  if config.synthesize:
    from data_pipeline import synthesize
    from osvl_jax import trajectory as traj_lib

    def make_sft():
      processor = traj_lib.ImageProcessor(min_pixels=config.min_pixels, max_pixels=config.max_pixels)
      return synthesize.synthesize(items, graph, data_dir, config.tools.to_dict(), config.top_k, processor,
                                   progress=lambda it: tqdm.tqdm(it, desc='oracle', unit='item', leave=False))
    stage('sft', make_sft, traj_lib.record_features())
  stages.update()
  stages.close()
  stats['summary'] = {'accepted_items': stats['items']['accepted'], 'landmarks': stats['items']['landmarks'],
                      'sft_trajectories': stats.get('sft', {}).get('kept', 0)}
  (out / 'stats.json').write_text(json.dumps(stats, indent=1, default=str))
  return stats


def load_sft(out_dir: str | os.PathLike) -> list:
  """The oracle expert trajectories (`osvl_jax.trajectory.Trajectory`) of `out_dir/sft`.

  Raises:
    FileNotFoundError: naming the folder when the `sft` stage has not been built.
  """
  from osvl_jax import trajectory as traj_lib
  folder = pathlib.Path(out_dir) / 'sft'
  if not (folder / 'counts.json').is_file():
    raise FileNotFoundError(f'{folder}: no SFT trajectories; run `python -m data_pipeline.build --out_dir={out_dir}`')
  records, _ = _load(folder)
  return [traj_lib.Trajectory.from_record(r) for r in records]


def load_prompts(out_dir: str | os.PathLike, data_dir: str | os.PathLike | None = None) -> list[dict]:
  """The accepted items of `out_dir/items` as RL prompts.

  Returns:
    dicts with prompt_id (str), question (str), image (uint8 [H, W, 3] RGB), answers (list[str]), image_path.
  Raises:
    FileNotFoundError: naming the folder when the `items` stage has not been built.
  """
  from data_pipeline import synthesize
  from osvl_jax import paths as osvl_paths
  folder = pathlib.Path(out_dir) / 'items'
  if not (folder / 'counts.json').is_file():
    raise FileNotFoundError(f'{folder}: no items; run `python -m data_pipeline.build --out_dir={out_dir}`')
  records, _ = _load(folder)
  data_dir = pathlib.Path(data_dir) if data_dir else osvl_paths.data_dir()
  return [{'prompt_id': r['prompt_id'], 'question': r['question'], 'answers': list(r['answers']),
           'image_path': r['image_path'], 'image': synthesize.load_image(data_dir, r['image_path'])}
          for r in records if not r['rejected']]


def main(argv=None) -> None:
  """CLI: `python -m data_pipeline.build --out_dir=DIR [--num_items=N] [--seed=S] [--no_synthesize]`."""
  import argparse
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--out_dir', required=True)
  p.add_argument('--num_items', type=int, default=None)
  p.add_argument('--seed', type=int, default=None)
  p.add_argument('--max_retries', type=int, default=None)
  p.add_argument('--hub_in_degree', type=int, default=None)
  p.add_argument('--data_dir', default=None)
  p.add_argument('--no_synthesize', action='store_true')
  args = p.parse_args(argv)
  config = default_config()
  for k in ('num_items', 'seed', 'max_retries', 'hub_in_degree', 'data_dir'):
    if getattr(args, k) is not None:
      setattr(config, k, getattr(args, k))
  config.synthesize = not args.no_synthesize
  t0 = time.perf_counter()
  stats = build_dataset(config, args.out_dir)
  print(json.dumps(stats['summary']), f'{time.perf_counter() - t0:.1f}s')


if __name__ == '__main__':
  main()
