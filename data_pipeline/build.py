"""Runs the data pipeline end to end and writes HF `datasets` (DESIGN.md §7).

  python -m data_pipeline.build --config=configs/data_wikispeedia.py --workdir=W [--config.data.num_items=60]

The config's `data` section is `default_config()` with overrides; the dataset goes to `config.data.dir`, else
`W/data` (`osvl_jax.data.pipeline.dataset_dir`, where the trainers read it: `--config=configs/demo.py` builds the
demo's dataset). Stages, each saved with `datasets.Dataset.save_to_disk` under `<dataset>/<stage>/` beside its
`counts.json`, skipped when that output already exists (rerunning continues an interrupted build; delete a stage
folder to redo it and everything after it is recomputed only if missing too):

  wiki     `data.source` (Wikispeedia TSVs or a pages-articles .xml.bz2) -> articles, redirects, links
           (`wiki.py`, parquet tables under `wiki/`) + the resolved link graph as CSR arrays (`graph.py`,
           `wiki/graph/{indptr,indices,in_degree}.npy`, open with `graph.load_csr`); its counts: reader, link
           resolution (missing targets dropped), CSR (self-loops, duplicates), hubs, excluded pages, domains
  paths    Appendix D.1 walks on the wiki stage's CSR graph (`paths.py`, through `wiki_graph.WikiGraph`, the
           same for both sources): stratified seeds with an image, hub tau, exclusions, no revisits, retries;
           per-path checks (mention, unique referent against the text's mentions of the descriptor's class,
           leak, answer of the present, at most 2 items per answer chain) counted by reason; relations per hop
  qa       answer from the answer node's infobox + canonical question (`qa.py`)
  rewrite  each hop's descriptor proposed by an LLM, checked in code and judged per rewrite step when
           `data.llm_descriptors` names an endpoint (`llm_descriptors.py`; offline: the code's descriptors), then
           farthest-to-nearest fuzzy rewrite from the hops' relations + non-leakage check (`rewrite.py`;
           `data.rewrite=False`: the canonical question)
  ground   the seed's image as the source anchor (`data.anchor='answer'`: the answer node's), v0 -> referring
           expression by domain, leak check again, missing image file rejected (`ground.py`)
  merge    `data.merge_external`: FVQA / LiveVQA / WebQA items added to the pool through the benchmark
           adapters, a held-out part of each corpus excluded, their source recorded (`merge.py`); off by
           default (the offline oracle expert has no path to walk for them)
  filter   Filter A (solved without tools) / Filter B (solved with one image_search hit) against a policy
           model behind an OpenAI-compatible endpoint (`filter.py`, `data.filter`); solved items kept with the
           reason; no endpoint (the offline default) = counted as skipped, nothing rejected
  degrade  a seeded `data.degrade_fraction` of the accepted items gets a blurred / downsampled / skewed anchor
           image (PNG under `<dataset>/degraded/`), its parameters and the repair tool recorded (`degrade.py`)
  items    the item table (`osvl_jax.data.pipeline.ITEM_COLUMNS`): prompt_id, question, canonical_question,
           answers, image_path, path, hops, rejected (None when accepted, else the reason), plus the descriptors,
           trace, evidence, degradation and original_image_path
  sft      expert trajectories (`synthesize.py`: the oracle, or K samples of a model behind SGLang's /generate,
           `experts.py`, run by `osvl_jax.rollout.agent_loop`; degraded items repaired before the image search)
           after the two-stage rejection (answer judge, process-quality judge; reasons counted), rows of
           `Trajectory.to_record()` (XML source: skipped with a counted reason, the oracle's text_search corpus is
           Wikispeedia's); also written as `<dataset>/sft_sharegpt.jsonl` (+ `sft_sharegpt_images/`),
           the official release's ShareGPT SFT format (`osvl_jax.data.official.write_sft`); the accepted items
           held out for RL (`data.rl_fraction`) are not synthesised
  rl       the GRPO prompts: the accepted items with no SFT trajectory (held out, or no kept trajectory), by
           prompt_id with the reason (`splits.py`); recomputed from the `sft` split on every build, so disjoint

A person reviews the product with `python -m data_pipeline.review W --sample 20 --seed 0` (`review.py`: each hop's
competitors in the text and the checks' verdicts, also as `<dataset>/review.html`).

`<dataset>/build_config.json` records the settings that decide the content (all of `data` but `dir`, `data_dir`,
`synthesize`); a rerun with other settings (another `num_items`, `seed`, ...) is refused with the differing fields
named, never resumed from the old items (a folder where no stage has finished takes the new settings). One build at
a time writes a folder: it holds `<dataset>/build.lock` (`dataset_folder.locked`; a second build fails at once naming
the holder's pid). A stage counts as finished only once its files are on disk (fsynced, `counts.json` last, the
folder renamed into place). A stage whose LLM endpoint did not answer (`llm.outages`: refused connections, timeouts, 5xx, ...) is not
saved and the build fails (`llm.EndpointDown`), so a rerun asks again.
`<dataset>/stats.json` has every stage's counts and seconds. The format and its readers (`load_sft`,
`load_prompts`) are in `osvl_jax/data/pipeline.py`. The steps that need an LLM endpoint or a policy model run only
when their section names one (offline they are skipped and counted): the canonical question and the whole-question
unique-referent judge (`data.llm_questions`), the descriptor proposal and per-step referent judge
(`data.llm_descriptors`), Filters A/B (`data.filter`, §7.6).
"""

import json
import os
import pathlib
import sys
import time

import ml_collections
import tqdm
from absl import app, flags
from ml_collections import config_flags

from data_pipeline import clip_ground, dataset_folder, experts, llm, llm_descriptors, llm_questions, splits, vocab
from data_pipeline import filter as filter_lib
from data_pipeline import merge as merge_lib
from osvl_jax import config_checks as checks
from osvl_jax.data import pipeline as pipeline_data

ITEM_COLUMNS = pipeline_data.ITEM_COLUMNS
STAGES = ('wiki', 'paths', 'qa', 'rewrite', 'ground', 'merge', 'filter', 'degrade', 'items', 'sft', 'rl')
DEGRADED_DIR = pipeline_data.DEGRADED_DIR  # the degraded anchor images, `<dataset>/degraded/<prompt_id>.png`
BUILD_CONFIG_FILE = dataset_folder.BUILD_CONFIG_FILE  # the settings a folder was built with (`_check_resume`)
SHAREGPT_FILE = 'sft_sharegpt.jsonl'  # the `sft` split in the official release's ShareGPT SFT format
# Fields not compared on resume: where it goes / where the shared data sits, and the `sft` stage's settings (a
# later build with it enabled only adds the `sft` split; the split's counts name its expert, and another expert
# needs the `sft` folder and sft_sharegpt.jsonl deleted to be redone).
_NOT_RECORDED = ('dir', 'data_dir', 'synthesize')
# A field added since, whose default is not what a build from before it was made with: that value instead.
_BEFORE_RECORDED = {'min_image_side': 0, 'rl_fraction': 0.0, 'attributes_per_path': 1}


def default_config() -> ml_collections.ConfigDict:
  """Pipeline settings.

  Fields:
    source: the `wiki` stage's input: 'wikispeedia' (the shared TSVs) or the path of a pages-articles .xml.bz2;
      every item stage reads the wiki stage's output.
    num_items: walk items attempted (seeds stratified over the domains).
    seed: every random choice derives from it and the item index.
    hop_choices, hop_probs: h ~ Cat(hop_choices; hop_probs).
    max_retries: fresh walks per item before it is dropped.
    attributes_per_path: items per accepted walk, each asking another attribute of its answer node (`qa.add_qa`).
    hub_in_degree: tau, in-degree above which a node is a hub and skipped (10,000: full English Wikipedia;
      configs/data_wikispeedia.py uses 600, see `paths.py` for the in-degree figures).
    min_seed_in_degree: lower end of the seed in-degree window [min_seed_in_degree, tau] (paper: 50).
    image_dir: folder of the article images (relative to the data folder, or absolute): Wikispeedia's landmark
      photos are `images/landmarks/<stem>.jpg`; an XML infobox image is looked up here by its file name.
    anchor: 'source' (v0's image) | 'answer' (the answer node's image: the Table 3a ablation).
    rewrite: False = the Table 3a "no fuzzy rewriting" ablation (the canonical question is the question).
    data_dir: shared data folder; '' = `osvl_jax.paths.data_dir()`.
    synthesize: the `sft` stage (`experts.default_config()`): enabled, expert ('oracle' offline | 'model' behind
      SGLang's /generate | 'openai' behind an OpenAI-compatible endpoint), K samples, the two-stage rejection's judge and threshold, limits.
    top_k: text_search hits per oracle call.
    min_pixels, max_pixels: the image processor budget (pixels) for the trajectories' images.
    tools: partial `tools.env.default_config()` overrides.
    degrade: degrade a subset of the anchor images (False = the Table 3a "no degradation" ablation).
    degrade_fraction: share of the accepted items degraded (paper: 10%).
    merge_external: add the external VQA corpora `merge_sources` to the pool (stage `merge`).
    merge_sources: `osvl_jax.data.benchmarks.BENCHMARKS` names (default `merge.SOURCES`).
    merge_holdout: fraction of each external corpus held out for evaluation (never merged), in [0, 1).
    llm_questions: the LLM of `qa` (canonical question, template kept when its reply fails the checks) and of
      `rewrite` (Eq. 6 (ii) unique-referent judge) (`data_pipeline.llm_questions.default_config()`; base_url ''
      = offline: templates, nothing judged, counted as skipped).
    llm_descriptors: the LLM of `rewrite` that proposes each hop's descriptor (checked in code) and judges the
      unique referent after each rewrite step (`data_pipeline.llm_descriptors.default_config()`; base_url '' =
      offline: the code's descriptors, the records untouched, counted as skipped).
    clip_ground: `ground`'s CLIP model (`data_pipeline.clip_ground.default_config()`; clip_path '' = the
      infobox image is kept).
    filter: the policy endpoint and limits of Filters A/B (`data_pipeline.filter.default_config()`;
      `filter.enabled=False` = the Table 3a "no filtering" ablation; `filter.base_url=''` = offline, skipped).
    min_image_side: Appendix D.1's seed rule, the anchor image at least N x N pixels (512); smaller ones are
      rejected at `ground`, counted by reason (`wikispeedia_walks` lowers it to Wikispeedia's ~264-pixel photos).
    rl_fraction: share of the accepted items held out of synthesis as RL prompts (`splits.rl_held_out`; the
      paper's ~8K RL prompts beside 36,592 SFT trajectories: ~0.18), in [0, 1).
    system_prompt: the agent's instructions in the expert trajectories' system turn
      (`trajectory.system_prompt_text`: 'builder_default' or an agent prompt such as 'agent_system_v2'); the
      trainer configs tie it to their own `system_prompt` (one per run).
    dir: the dataset folder; '' = `<workdir>/data` (read by `main` and the trainers, not by `build_dataset`).
  """
  c = ml_collections.ConfigDict()
  c.source = 'wikispeedia'
  c.num_items = 60
  c.seed = 0
  c.hop_choices = (2, 3, 4)
  c.hop_probs = (0.4, 0.4, 0.2)
  c.max_retries = 10
  c.attributes_per_path = 1
  c.hub_in_degree = 10_000
  c.min_seed_in_degree = 50
  c.image_dir = 'images/landmarks'
  c.anchor = 'source'
  c.rewrite = True
  c.data_dir = ''
  c.synthesize = experts.default_config()
  c.top_k = 5
  # Image budget of the expert trajectories' image tokens (must match the policy's image processor).
  c.min_pixels = 64 * 64
  c.max_pixels = 128 * 128
  c.tools = ml_collections.ConfigDict()
  c.degrade = True
  c.degrade_fraction = 0.1
  c.merge_external = False
  c.merge_sources = merge_lib.SOURCES
  c.merge_holdout = 0.2
  c.llm_questions = llm_questions.default_config()
  c.llm_descriptors = llm_descriptors.default_config()
  c.clip_ground = clip_ground.default_config()
  c.filter = filter_lib.default_config()
  c.min_image_side = 512
  c.rl_fraction = 0.2
  c.system_prompt = 'builder_default'
  c.dir = ''
  return c


def wikispeedia_walks(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Sets the walk settings of the 4,598-article Wikispeedia graph on a `data` section (and returns it):
  tau = 600 (in-degree p99 = 294, p99.7 = 541: the 8 above are hubs, United_States 1,551, France, Europe, ...; at
  300 the only hop that names a unique referent from Giza_pyramid_complex, Palace_of_Westminster, Stonehenge and
  most of Toronto's leads to a hub: Egypt 362, London 587, New_Zealand 301, Canada 571) and a seed
  window [2, 600] that admits all 12 landmark articles with a photo (in-degree 2: Giza_pyramid_complex,
  Leaning_Tower_of_Pisa ... 76: Toronto; the paper's lower end 50 would admit Toronto alone), and anchor images of
  at least 256 pixels a side (the photos are 259-271; D.1's 512 would reject them all)."""
  config.hub_in_degree = 600
  config.min_seed_in_degree = 2
  config.min_image_side = 256   # the landmark photos are 259-271 pixels a side (D.1's 512 would admit none)
  return config


def check_config(config: ml_collections.ConfigDict, prefix: str = 'data') -> None:
  """Fails fast on pipeline settings (`default_config()` shape) that cannot build a dataset.

  Args:
    config: the `data` section.
    prefix: how errors name the section ('data' -> 'data.num_items=0: ...').
  Raises:
    ValueError: naming the field: num_items / top_k / hub_in_degree not ints >= 1, a non-int seed, max_retries
      < 0, hop_choices empty or not ints >= 1, hop_probs not one probability >= 0 per choice summing to 1, pixel
      limits not ints >= 1 with min <= max, min_seed_in_degree not an int >= 1 or above hub_in_degree, image_dir not a string, anchor
      not 'source' / 'answer', rewrite not a bool, source neither 'wikispeedia' nor an existing .bz2 file,
      degrade_fraction outside [0, 1], rl_fraction outside [0, 1), min_image_side (attributes_per_path) not int >= 0 (1),
      an unknown system_prompt, a bad `filter`, `llm_questions`, `llm_descriptors`, `clip_ground` or `synthesize`
      section (their `check_config`), unknown merge_sources or merge_holdout outside [0, 1) (`merge.check_settings`).
  """
  from data_pipeline import wiki
  wiki.check_source(config.get('source', 'wikispeedia'), f'{prefix}.source')
  root = {prefix: config}
  for field in ('num_items', 'top_k', 'hub_in_degree', 'min_seed_in_degree'):
    checks.positive_int(root, f'{prefix}.{field}')
  if config.min_seed_in_degree > config.hub_in_degree:
    raise ValueError(f'{prefix}.min_seed_in_degree={config.min_seed_in_degree} > {prefix}.hub_in_degree='
                     f'{config.hub_in_degree}: the seed in-degree window is empty')
  checks.number(root, f'{prefix}.seed', integer=True)
  checks.number(root, f'{prefix}.max_retries', integer=True, low=0)
  choices, probs = tuple(config.hop_choices), tuple(config.hop_probs)
  if not choices or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in choices):
    raise ValueError(f'{prefix}.hop_choices={choices}: expected one or more ints >= 1')
  if (len(probs) != len(choices) or any(isinstance(p, bool) or not isinstance(p, (int, float)) or p < 0
                                        for p in probs) or abs(sum(probs) - 1) > 1e-6):
    raise ValueError(f'{prefix}.hop_probs={probs}: expected {len(choices)} probabilities >= 0 (one per '
                     f'{prefix}.hop_choices={choices}) summing to 1')
  checks.pixel_limits(root, prefix)
  from data_pipeline import ground
  if config.get('anchor', 'source') not in ground.ANCHORS:
    raise ValueError(f"{prefix}.anchor={config.get('anchor')!r}: expected one of {ground.ANCHORS}")
  if not isinstance(config.get('rewrite', True), bool):
    raise ValueError(f"{prefix}.rewrite={config.get('rewrite')!r}: expected True or False")
  if not isinstance(config.get('image_dir', ''), str) or not config.get('image_dir', 'x'):
    raise ValueError(f"{prefix}.image_dir={config.get('image_dir')!r}: expected a folder (relative to the data "
                     'folder, or absolute)')
  fraction = config.get('degrade_fraction', 0.1)
  if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
    raise ValueError(f'{prefix}.degrade_fraction={fraction!r}: expected a fraction in [0, 1]')
  checks.number(root, f'{prefix}.rl_fraction', low=0, high=1, high_open=True, optional=True)
  checks.number(root, f'{prefix}.attributes_per_path', integer=True, low=1, optional=True)
  checks.number(root, f'{prefix}.min_image_side', integer=True, low=0, optional=True)
  from osvl_jax import trajectory as traj_lib
  try:
    traj_lib.system_prompt_text(config.get('system_prompt'))
  except ValueError as e:
    raise ValueError(f'{prefix}.{e}') from None
  filter_lib.check_config(config.get('filter', filter_lib.default_config()), f'{prefix}.filter')
  llm_questions.check_config(config.get('llm_questions', llm_questions.default_config()), f'{prefix}.llm_questions')
  llm_descriptors.check_config(config.get('llm_descriptors', llm_descriptors.default_config()),
                               f'{prefix}.llm_descriptors')
  clip_ground.check_config(config.get('clip_ground', clip_ground.default_config()), f'{prefix}.clip_ground')
  experts.check_config(config.get('synthesize', experts.default_config()), f'{prefix}.synthesize')
  merge_lib.check_settings(tuple(config.get('merge_sources', merge_lib.SOURCES)), config.get('merge_holdout', 0.2),
                           prefix)


def build_settings(config: ml_collections.ConfigDict) -> dict:
  """The settings that decide a build's content, as JSON values (recorded in `<dataset>/build_config.json`)."""
  settings = {k: v for k, v in config.to_dict().items() if k not in _NOT_RECORDED}
  return json.loads(json.dumps(settings, sort_keys=True, default=str))


def _check_resume(out: pathlib.Path, settings: dict) -> None:
  """`dataset_folder.check_settings` with this build's stages; a field missing from an older build_config.json
  (added to `default_config()` since) counts as built with its default value, or with the value the build had
  before the field existed (`_BEFORE_RECORDED`: no anchor size rule, nothing held out for RL)."""
  dataset_folder.check_settings(out, settings, {**build_settings(default_config()), **_BEFORE_RECORDED}, STAGES)


def _reasons(reasons) -> dict[str, int]:
  """Rejection reason -> count, the reason cut at its first ' (' / ': ' detail (`answer_type:capital (...)`)."""
  out = {}
  for r in reasons:
    key = ': '.join(r.split(' (')[0].split(': ')[:2])
    out[key] = out.get(key, 0) + 1
  return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def build_dataset(config: ml_collections.ConfigDict, out_dir: str | os.PathLike) -> dict:
  """Runs (or resumes) every stage and returns the stats (also written to `out_dir/stats.json`).

  The settings that decide the content (`build_settings`) are recorded in `out_dir/build_config.json`; a folder
  built with other settings is refused, never silently resumed.

  Args:
    config: `default_config()` with overrides.
    out_dir: output folder (created).
  Returns:
    {stage: counts (with 'seconds', 'resumed')}, plus 'summary' (accepted items, landmarks, sft kept).
  A stage's output counts as finished once it is on disk (`pipeline_data.publish_split`); one build at a time
  writes a folder (`dataset_folder.locked`).

  Raises:
    ValueError: from `check_config` (before anything is written), or a folder built with other settings.
    BlockingIOError: another build holds the folder (naming its pid); nothing was written.
    llm.EndpointDown: a stage's LLM endpoint did not answer (naming the stage, endpoint and failure kinds); that
      stage is not saved (a rerun asks again), the stages before it are.
  """
  check_config(config)
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  with dataset_folder.locked(out):
    return _build(config, out)


def _build(config: ml_collections.ConfigDict, out: pathlib.Path) -> dict:
  """`build_dataset`'s stages, run while holding the folder's lock."""
  from data_pipeline import degrade, ground, paths, qa, rewrite, wiki, wiki_graph
  from osvl_jax import paths as osvl_paths
  from osvl_jax import trajectory as traj_lib

  _check_resume(out, build_settings(config))
  data_dir = pathlib.Path(config.data_dir) if config.data_dir else osvl_paths.data_dir()
  stats = {}

  def stage(name, fn, features=None, files=()):  # `files`: what the stage wrote beside its split
    folder = out / name
    t0 = time.perf_counter()
    if pipeline_data.has_split(folder):
      records, counts = pipeline_data.read_split(folder)
      counts = dict(counts, resumed=True)
    else:
      records, counts = fn()
      down = llm.outages(counts)
      if down:
        raise llm.EndpointDown(f'stage {name}: the LLM endpoint did not answer ({json.dumps(down)}); {name} is '
                               'not saved: rerun once the endpoint answers (the finished stages are resumed)')
      for path in files:
        if path.exists():
          pipeline_data.fsync_tree(path)
      counts = dict(counts, seconds=round(time.perf_counter() - t0, 2), resumed=False)
      dataset_folder.save_split(records, folder, counts, features)
    stats[name] = counts
    print(f'[data_pipeline] {name}: {json.dumps(counts, default=str)}', file=sys.stderr)
    return records

  stages = tqdm.tqdm(total=len(STAGES), desc='data_pipeline', unit='stage')
  stats['wiki'] = wiki.build_stage(config.source, config.hub_in_degree, out / 'wiki', data_dir)
  print(f'[data_pipeline] wiki: {json.dumps(stats["wiki"])}', file=sys.stderr)
  graph = wiki_graph.WikiGraph.open(out / 'wiki')
  stages.update()
  recs = stage('paths', lambda: paths.sample_paths(graph, config, config.image_dir))
  stages.update()
  def then(first, name, fn):  # a stage's second step (an LLM / CLIP pass), its counts under `name`
    records, counts = first
    records, counts[name] = fn(records)
    return records, counts

  llm_cfg = config.llm_questions
  per_path = config.get('attributes_per_path', 1)
  recs = stage('qa', lambda: then(qa.add_qa(recs, graph, config.seed, per_path), 'llm_questions',
                                  lambda r: llm_questions.canonical_questions(r, llm_cfg, aliases=graph.aliases)))
  stages.update()
  def rewrite_stage():  # the descriptors chosen first, their counts beside the rewrite's
    chosen, chosen_counts = llm_descriptors.choose_descriptors(recs, graph, config.llm_descriptors, config.rewrite)
    records, counts = rewrite.rewrite(chosen, graph, config.rewrite)
    return records, dict(counts, llm_descriptors=chosen_counts)

  recs = stage('rewrite', lambda: then(then(
      rewrite_stage(), 'unique_referent',
      lambda r: llm_questions.unique_referent(r, llm_cfg)), 'obfuscate',
      lambda r: llm_questions.obfuscate_answers(r, llm_cfg.obfuscate_fraction, config.seed)))
  stages.update()
  recs = stage('ground', lambda: then(ground.ground(recs, graph, data_dir, config.image_dir, config.anchor,
                                                    config.rewrite, config.get('min_image_side', 0)), 'clip',
                                      lambda r: clip_ground.ground_by_clip(r, config.clip_ground, data_dir)))
  stages.update()
  recs = stage('merge', lambda: merge_lib.merge(recs, data_dir, tuple(config.merge_sources), config.merge_holdout,
                                                config.merge_external))
  stages.update()
  recs = stage('filter', lambda: filter_lib.run_filters(recs, config.filter, data_dir, config.tools.to_dict()))
  stages.update()
  recs = stage('degrade', lambda: degrade.degrade(recs, data_dir, out / DEGRADED_DIR, config.seed,
                                                  config.degrade_fraction, config.degrade),
               files=(out / DEGRADED_DIR,))
  stages.update()

  def make_items():
    rows = [{k: r.get(k) for k in ITEM_COLUMNS} for r in recs]
    ok = [r for r in rows if not r['rejected']]
    counts = {'items': len(rows), 'accepted': len(ok), 'rejected': len(rows) - len(ok),
              'landmarks': len({r['landmark'] for r in ok}),
              'hops': {str(h): sum(r['hops'] == h for r in ok) for h in config.hop_choices},
              'attributes': {a: sum(r['answer_attribute'] == a for r in ok)
                             for a in sorted({r['answer_attribute'] for r in ok})},
              'distinct_questions': len({r['question'] for r in ok}),
              'distinct_paths': len({tuple(r['path']) for r in ok}),
              'distinct_answers': len({r['answers'][0] for r in ok if r['answers']}),
              'items_per_landmark': {k: sum(r['landmark'] == k for r in ok)
                                     for k in sorted({r['landmark'] for r in ok})},
              'degraded': sum(bool(r['degradation']) for r in ok),
              'rejected_reasons': _reasons(r['rejected'] for r in rows if r['rejected'])}
    return rows, counts

  items = stage('items', make_items, pipeline_data.items_features())
  stages.update()
  rl_fraction = float(config.get('rl_fraction', 0.0))
  system = traj_lib.system_prompt_text(config.get('system_prompt'))
  if config.synthesize.enabled:
    from data_pipeline import synthesize

    def make_sft():
      if config.source != 'wikispeedia':  # the oracle's text_search reads the Wikispeedia corpus (tools.corpus)
        n = sum(not r['rejected'] for r in items)
        return [], {'expert': config.synthesize.expert, 'in': n, 'kept': 0, 'rejected': n,
                    'reasons': {'skipped: xml source (text_search corpus is Wikispeedia)': n} if n else {}}
      processor = traj_lib.ImageProcessor(min_pixels=config.min_pixels, max_pixels=config.max_pixels)
      return synthesize.synthesize(splits.synthesis_items(items, rl_fraction, config.seed), graph, data_dir,
                                   config.tools.to_dict(), config.top_k, processor,
                                   progress=lambda it: tqdm.tqdm(it, desc='expert', leave=False),
                                   config=config.synthesize, dataset_dir=out, system_prompt=system)
    sft = stage('sft', make_sft, traj_lib.record_features())
    stats['sft_sharegpt'] = splits.sharegpt(sft, out / SHAREGPT_FILE, config.tools.to_dict(), system)
  stages.update()
  rl_rows, rl_counts = splits.rl_split(items, sft if config.synthesize.enabled else [], rl_fraction, config.seed)
  resumed = pipeline_data.has_split(out / 'rl') and pipeline_data.read_split(out / 'rl')[0] == rl_rows
  if not resumed:   # recomputed from the sft split each build (a later build may have added it)
    dataset_folder.save_split(rl_rows, out / 'rl', rl_counts, pipeline_data.rl_features())
  stats['rl'] = dict(rl_counts, resumed=resumed)
  stats['vocab_ids'] = vocab.write_wikipedia(out, sft if config.synthesize.enabled else [], items, system)
  stages.update()
  stages.close()
  stats['summary'] = {'accepted_items': stats['items']['accepted'], 'landmarks': stats['items']['landmarks'],
                      'distinct_paths': stats['items'].get('distinct_paths'),
                      'distinct_answers': stats['items'].get('distinct_answers'),
                      'sft_trajectories': stats.get('sft', {}).get('kept', 0), 'rl_prompts': rl_counts['prompts']}
  pipeline_data.write_durably(out / 'stats.json', json.dumps(stats, indent=1, default=str))
  return stats


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  config = _CONFIG.value
  if 'data' not in config:
    raise ValueError('the config has no `data` section (data_pipeline.build.default_config())')
  check_config(config.data)
  out = pipeline_data.dataset_dir(config, _WORKDIR.value)
  t0 = time.perf_counter()
  stats = build_dataset(config.data, out)
  print(json.dumps(stats['summary']), f'{out}', f'{time.perf_counter() - t0:.1f}s')


if __name__ == '__main__':
  # Flags are defined only when run as a program, so the module imports freely (configs, tests, the demo).
  _CONFIG = config_flags.DEFINE_config_file('config', 'configs/data_wikispeedia.py', 'ml_collections config file.')
  _WORKDIR = flags.DEFINE_string('workdir', None, 'Job folder; the dataset is `<workdir>/data` unless '
                                 '--config.data.dir; rerunning resumes.', required=True)
  app.run(main)
