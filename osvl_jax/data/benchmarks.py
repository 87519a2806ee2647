"""Benchmark adapters: every evaluation file format -> `EvalItem` (DESIGN.md §9).

  EvalItem{id, benchmark, question, images, answers (gold first, then aliases), metadata, problems}

Adapters are registered by name in `ADAPTERS` (an `osvl_jax.registry.Registry`); each is
`adapter(path, benchmark=..., image_root=...) -> list[EvalItem]`. `BENCHMARKS` names every benchmark the evaluator
knows, with its adapter and its file(s) relative to `osvl_jax.paths.data_dir()`:

  name                adapter              file(s) (under <data_dir>/benchmarks/)         notes
  browsecomp_vl       browsecomp_vl        browsecomp_vl/bc_vl_level{1,2}.jsonl          question, image_path, answers
  mmsearch            webwatcher           webwatcher_eval/mmsearch.jsonl                prompt, file_path, answers
  simplevqa           webwatcher           webwatcher_eval/simplevqa.jsonl
  livevqa             webwatcher           webwatcher_eval/livevqa.jsonl                 MC choices in the prompt
  hle                 webwatcher           webwatcher_eval/hle.jsonl                     answers: list of lists
  livevqa_official    livevqa_official     livevqa/{News,Paper,Video}_benchmark.json     2 items per entry (levels)
  fvqa                fvqa                 fvqa/fvqa_train_sample50.jsonl                ground_truth + images
  webqa_img           webqa                webqa/webqa_val_img_queries.jsonl             Q, A, Keywords_A
  webqa_txt           webqa                webqa/webqa_val_txt_queries.jsonl             text-only
  infoseek            infoseek             infoseek/infoseek_val.jsonl (not shipped)     numeric answer ranges
  vdr_bench           generic              vdr_bench/vdr_bench.jsonl (not shipped)
  simplevqa_official  generic              simplevqa_official/simplevqa.jsonl (n. s.)    m-a-p/SimpleVQA fields
  mmsearch_official   generic              mmsearch_official/end2end.jsonl (n. s.)       CaraJ/MMSearch end2end

Images: `EvalItem.images` holds image sources (an absolute local path, an http(s) URL, or encoded bytes); they
are decoded by `load_images` with `tools.image_io.load_image`, the project's one decoder. An image that cannot be
used is never a crash and never a silent drop: the adapter records each missing local file in `item.problems`
(and `load_images` each URL it does not fetch and each file it cannot decode), and the item stays in the list.
Relative paths are resolved against `image_root` (default: the data file's folder), also trying the path's
trailing components (so `browsecomp-vl/images/level1/x.jpg` is found under an `images/level1` root too).
"""

import dataclasses
import hashlib
import os
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from osvl_jax import paths
from osvl_jax import registry as registry_lib
from osvl_jax.data.records import (  # noqa: F401  (read_records, resolve_image: re-exported)
    ALIAS_KEYS, ANSWER_KEYS, ID_KEYS, IMAGE_KEYS, QUESTION_KEYS, as_strings, dedupe, first_field,
    image_entries, image_roots, is_url, read_records, resolve_image)
from tools import image_io


@dataclasses.dataclass
class EvalItem:
  """One benchmark question.

  Attributes:
    id: unique within its benchmark (the file's own id when it has one, else '<file stem>-<line or index>').
    benchmark: the benchmark name (a key of `BENCHMARKS`, or the name the caller gave).
    question: the question text as the model sees it (multiple-choice options included when the format keeps
      them apart).
    images: image sources in order: absolute local path (str), http(s) URL (str), or encoded bytes.
    answers: accepted answers, the gold answer first, then its aliases; never empty for a loadable item.
    metadata: format-specific fields kept for the report (level, domain, split, ...). `numeric_ranges`
      (list of [lo, hi]) marks a numeric answer accepted within a range (InfoSeek).
    problems: why an image cannot be used (missing file, remote URL, unreadable); empty when all are usable.
  """
  id: str
  benchmark: str
  question: str
  images: list[str | bytes] = dataclasses.field(default_factory=list)
  answers: list[str] = dataclasses.field(default_factory=list)
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
  problems: list[str] = dataclasses.field(default_factory=list)


Adapter = Callable[..., list[EvalItem]]
ADAPTERS: registry_lib.Registry[Adapter] = registry_lib.Registry('benchmark adapter')


@dataclasses.dataclass(frozen=True)
class BenchmarkSpec:
  """A benchmark the evaluator knows: its adapter and file(s) relative to `<data_dir>/benchmarks`."""
  adapter: str
  files: tuple[str, ...]


BENCHMARKS: dict[str, BenchmarkSpec] = {
    'browsecomp_vl': BenchmarkSpec('browsecomp_vl', ('browsecomp_vl/bc_vl_level1.jsonl',
                                                     'browsecomp_vl/bc_vl_level2.jsonl')),
    'mmsearch': BenchmarkSpec('webwatcher', ('webwatcher_eval/mmsearch.jsonl',)),
    'simplevqa': BenchmarkSpec('webwatcher', ('webwatcher_eval/simplevqa.jsonl',)),
    'livevqa': BenchmarkSpec('webwatcher', ('webwatcher_eval/livevqa.jsonl',)),
    'hle': BenchmarkSpec('webwatcher', ('webwatcher_eval/hle.jsonl',)),
    'livevqa_official': BenchmarkSpec('livevqa_official', ('livevqa/News_benchmark.json',
                                                           'livevqa/Paper_benchmark.json',
                                                           'livevqa/Video_benchmark.json')),
    'fvqa': BenchmarkSpec('fvqa', ('fvqa/fvqa_train_sample50.jsonl',)),
    'webqa_img': BenchmarkSpec('webqa', ('webqa/webqa_val_img_queries.jsonl',)),
    'webqa_txt': BenchmarkSpec('webqa', ('webqa/webqa_val_txt_queries.jsonl',)),
    'infoseek': BenchmarkSpec('infoseek', ('infoseek/infoseek_val.jsonl',)),
    'vdr_bench': BenchmarkSpec('generic', ('vdr_bench/vdr_bench.jsonl',)),
    'simplevqa_official': BenchmarkSpec('generic', ('simplevqa_official/simplevqa.jsonl',)),
    'mmsearch_official': BenchmarkSpec('generic', ('mmsearch_official/end2end.jsonl',)),
}

# The seven benchmarks of the paper's main table, by the names above (files we have; InfoSeek / VDR-Bench are
# read when their files are placed under <data_dir>/benchmarks or given in the eval config).
PAPER_BENCHMARKS = ('simplevqa', 'vdr_bench', 'mmsearch', 'livevqa', 'browsecomp_vl', 'fvqa', 'infoseek')

def _make_item(benchmark: str, item_id: str, question: str, answers: Sequence[str], image_entries: Sequence[Any],
               roots: Sequence[pathlib.Path], metadata: dict, problems: Sequence[str] = ()) -> EvalItem:
  item = EvalItem(id=str(item_id), benchmark=benchmark, question=question.strip(), answers=dedupe(answers),
                  metadata=metadata, problems=list(problems))
  for entry in image_entries:
    source, problem = resolve_image(entry, roots)
    if source is not None:
      item.images.append(source)
    if problem is not None:
      item.problems.append(problem)
  if not item.answers:
    item.problems.append('no reference answer in the record')
  return item


# ----------------------------------------------------------------------------------------------------------------
# Adapters
# ----------------------------------------------------------------------------------------------------------------

@ADAPTERS.register('generic')
def generic(path: str | os.PathLike, benchmark: str, image_root: str | os.PathLike | None = None) -> list[EvalItem]:
  """Any jsonl/json list whose records name question, answer(s) and image(s) with common keys.

  Question: first of `QUESTION_KEYS`; answers: first of `ANSWER_KEYS` plus every `ALIAS_KEYS` field; images:
  first of `IMAGE_KEYS` (path, URL, base64, HF `{"bytes", "path"}`, or a list of those); id: first of `ID_KEYS`.
  Used for VDR-Bench, the official SimpleVQA (data_id, image, question, answer, ...) and MMSearch end2end
  (sample_id, query, query_image, gt_answer, alternative_gt_answers, ...) releases. The remaining scalar fields
  are kept in metadata.

  Raises:
    FileNotFoundError / ValueError: from `read_records`.
  """
  path = pathlib.Path(path)
  roots = image_roots(path, image_root)
  items = []
  used = set(QUESTION_KEYS + ANSWER_KEYS + ALIAS_KEYS + IMAGE_KEYS + ID_KEYS)
  for n, record in read_records(path):
    question = first_field(record, QUESTION_KEYS) or ''
    answers = as_strings(first_field(record, ANSWER_KEYS)) + [s for k in ALIAS_KEYS for s in as_strings(record.get(k))]
    item_id = first_field(record, ID_KEYS)
    metadata = {k: v for k, v in record.items()
                if k not in used and isinstance(v, (str, int, float, bool)) and len(str(v)) <= 500}
    items.append(_make_item(benchmark, item_id if item_id is not None else f'{path.stem}-{n}', str(question),
                            answers, image_entries(first_field(record, IMAGE_KEYS)), roots, metadata))
  return items


@ADAPTERS.register('browsecomp_vl')
def browsecomp_vl(path, benchmark: str = 'browsecomp_vl', image_root=None) -> list[EvalItem]:
  """BrowseComp-VL (WebWatcher): {question, image_path, answers, domain}; id '<file stem>-<line>'."""
  path = pathlib.Path(path)
  roots = image_roots(path, image_root)
  level = path.stem.rsplit('_', 1)[-1]
  return [_make_item(benchmark, f'{path.stem}-{n}', r.get('question', ''), as_strings(r.get('answers')),
                     image_entries(r.get('image_path')), roots, {'domain': r.get('domain'), 'level': level})
          for n, r in read_records(path)]


@ADAPTERS.register('webwatcher')
def webwatcher(path, benchmark: str, image_root=None) -> list[EvalItem]:
  """WebWatcher's eval jsonl (MMSearch, SimpleVQA, LiveVQA, HLE): {prompt, file_path, answers, question_id, ...}.

  `answers` may be a list of strings or (HLE) a list of lists; `file_path` a URL (not fetched offline: reported
  by `load_images`) or a path. The misleading `source` field ("HLE" in every file) is kept as `orig_source`.
  """
  path = pathlib.Path(path)
  roots = image_roots(path, image_root)
  items = []
  for n, r in read_records(path):
    item_id = r.get('question_id', f'{path.stem}-{n}')
    metadata = {k: r[k] for k in ('task', 'tags', 'lang', 'rationale') if k in r}
    metadata['orig_source'] = r.get('source')
    items.append(_make_item(benchmark, item_id, first_field(r, QUESTION_KEYS) or '', as_strings(r.get('answers')),
                            image_entries(first_field(r, ('file_path', 'image_path', 'image'))), roots, metadata))
  return items


@ADAPTERS.register('livevqa_official')
def livevqa_official(path, benchmark: str = 'livevqa_official', image_root=None) -> list[EvalItem]:
  """Official LiveVQA JSON list; each entry gives up to two items, '<id>-l1' and '<id>-l2' (level1_qa, level2_qa).

  The options are appended to the question ("Choices:" then "A. ..."); answers are the gold option's text then
  `Ground_Truth_List`; the gold letter is `metadata['gold_letter']`. Image: the level's `img_path` (else the
  entry's), else its `img_url`.
  """
  path = pathlib.Path(path)
  roots = image_roots(path, image_root)
  items = []
  for _, r in read_records(path):
    for level in ('level1_qa', 'level2_qa'):
      qa = r.get(level)
      if not isinstance(qa, dict) or not qa.get('question'):
        continue
      options = [str(o) for o in qa.get('options') or []]
      question = qa['question'] + ('\nChoices:\n' + '\n'.join(options) if options else '')
      letter = str(qa.get('Ground_Truth', '')).strip()
      gold = [o.split('.', 1)[1].strip() for o in options if o.split('.', 1)[0].strip() == letter and '.' in o]
      image = qa.get('img_path') or r.get('img_path') or qa.get('img_url')
      items.append(_make_item(
          benchmark, f'{r.get("id")}-l{level[5]}', question, gold + as_strings(qa.get('Ground_Truth_List')),
          image_entries(image), roots,
          {'level': int(level[5]), 'question_type': qa.get('question_type'), 'gold_letter': letter,
           'source': r.get('source'), 'time': r.get('time'), 'file': path.stem}))
  return items


@ADAPTERS.register('fvqa')
def fvqa(path, benchmark: str = 'fvqa', image_root=None) -> list[EvalItem]:
  """FVQA (MMSearch-R1): {data_id, question, ground_truth, candidate_answers, image, category, ...}."""
  path = pathlib.Path(path)
  roots = image_roots(path, image_root)
  return [_make_item(benchmark, r.get('data_id', f'{path.stem}-{n}'), r.get('question', ''),
                     as_strings(r.get('ground_truth')) + as_strings(r.get('candidate_answers')),
                     image_entries(r.get('image')), roots,
                     {'category': r.get('category'), 'source_split': r.get('source_split')})
          for n, r in read_records(path)]


@ADAPTERS.register('webqa')
def webqa(path, benchmark: str, image_root=None) -> list[EvalItem]:
  """WebQA val gold columns: {Guid, Qcate, Q, A (list), Keywords_A}.

  Answers: `A` then `Keywords_A` (unless 'TBD'). Image queries name no image here (their ids are in the 7 GB
  release), so each such item carries the problem 'image not in this release'; text queries need none.
  """
  path = pathlib.Path(path)
  image_query = 'img' in path.stem
  items = []
  for n, r in read_records(path):
    keywords = [] if str(r.get('Keywords_A', '')).strip() in ('', 'TBD') else as_strings(r.get('Keywords_A'))
    problems = ['image not in this release (WebQA image ids are in the full release)'] if image_query else []
    items.append(_make_item(benchmark, r.get('Guid', f'{path.stem}-{n}'), first_field(r, QUESTION_KEYS) or '',
                            as_strings(r.get('A')) + keywords, (), [], {'qcate': r.get('Qcate')}, problems))
  return items


@ADAPTERS.register('infoseek')
def infoseek(path, benchmark: str = 'infoseek', image_root=None) -> list[EvalItem]:
  """InfoSeek (Chen et al. 2023): {data_id, image_id, question, answer, answer_eval, data_split}.

  `answer_eval` entries are strings, or for numerical questions `{"wikidata": x, "range": [lo, hi]}`: the
  value is added to the answers and the range kept in `metadata['numeric_ranges']` (a response number inside
  it is correct, InfoSeek's own rule; other numbers match within ±10%, `metadata['numeric_tolerance']`). The image is `<image_root>/<image_id>.{jpg,JPEG,jpeg,png}` (OVEN images).
  """
  path = pathlib.Path(path)
  roots = image_roots(path, image_root)
  items = []
  for n, r in read_records(path):
    ranges = [list(map(float, e['range'])) for e in r.get('answer_eval') or []
              if isinstance(e, dict) and isinstance(e.get('range'), (list, tuple)) and len(e['range']) == 2]
    image_id = r.get('image_id')
    entries = []
    if image_id:
      names = [f'{image_id}{ext}' for ext in ('.jpg', '.JPEG', '.jpeg', '.png')]
      entries = [next((n for n in names if resolve_image(n, roots)[0] is not None), names[0])]
    metadata = {'data_split': r.get('data_split'), 'image_id': image_id, 'numeric_tolerance': 0.1}
    if ranges:
      metadata['numeric_ranges'] = ranges
    items.append(_make_item(benchmark, r.get('data_id', f'{path.stem}-{n}'), r.get('question', ''),
                            as_strings(r.get('answer')) + as_strings(r.get('answer_eval')), entries, roots, metadata))
  return items


# ----------------------------------------------------------------------------------------------------------------
# Loading by name, and images
# ----------------------------------------------------------------------------------------------------------------

def benchmark_files(name: str, data_dir: str | os.PathLike | None = None) -> list[pathlib.Path]:
  """The file(s) of a known benchmark under `<data_dir>/benchmarks` (default `paths.data_dir()`).

  Raises:
    ValueError: unknown benchmark name (lists the known ones).
    FileNotFoundError: no data folder (from `paths.data_dir`).
  """
  if name not in BENCHMARKS:
    raise ValueError(f'benchmark {name!r} is not one of {sorted(BENCHMARKS)}')
  root = pathlib.Path(data_dir) if data_dir else paths.data_dir()
  return [root / 'benchmarks' / f for f in BENCHMARKS[name].files]


def holdout_key(benchmark: str, item_id: str) -> float:
  """A deterministic number in [0, 1) per item: the first 8 bytes of sha256('<benchmark>/<id>') / 2**64.

  The pipeline's `merge` stage merges an external corpus's items with key >= `merge_holdout` into the training
  pool and keeps the rest (key < holdout) for evaluation (`held_out_items`).
  """
  digest = hashlib.sha256(f'{benchmark}/{item_id}'.encode('utf-8')).digest()
  return int.from_bytes(digest[:8], 'big') / 2.0 ** 64


def held_out_items(name: str, items: Sequence[EvalItem], train_settings: dict) -> tuple[list[EvalItem], int]:
  """The items of benchmark `name` a policy trained on a pipeline dataset has not seen.

  Args:
    name: the benchmark.
    items: its items.
    train_settings: the dataset's `build_config.json` (`data_pipeline.build.build_settings`): when
      `merge_external` is true and `name` is in `merge_sources`, only items with `holdout_key < merge_holdout`
      were held out of training.
  Returns:
    (the unseen items in order, how many were left out as possibly trained on).
  Raises:
    ValueError: a build with `merge_external` whose settings lack `merge_sources` or `merge_holdout` (guessing
      either could evaluate on trained-on items).
  """
  if not train_settings.get('merge_external'):
    return list(items), 0
  missing = [k for k in ('merge_sources', 'merge_holdout') if k not in train_settings]
  if missing:
    raise ValueError(f'the training dataset merged external corpora but its build settings lack {missing}')
  if name not in tuple(train_settings['merge_sources']):
    return list(items), 0
  holdout = float(train_settings['merge_holdout'])
  kept = [it for it in items if holdout_key(name, str(it.id)) < holdout]
  return kept, len(items) - len(kept)


def load_benchmark(name: str, files: Sequence[str | os.PathLike] | str | None = None,
                   image_root: str | os.PathLike | None = None, adapter: str | None = None,
                   limit: int | None = None, data_dir: str | os.PathLike | None = None) -> list[EvalItem]:
  """Items of benchmark `name`, in file order (the first `limit` when given).

  Args:
    name: a `BENCHMARKS` key, or any name when `files` and `adapter` are given.
    files: file(s) to read instead of the benchmark's default ones.
    image_root: folder that relative image paths are resolved against (besides each file's folder).
    adapter: registered adapter name instead of the benchmark's.
    limit: at most this many items (None / <= 0: all).
    data_dir: the data folder (default `paths.data_dir()`).
  Returns:
    EvalItems; items with unusable images are kept and carry `problems`.
  Raises:
    ValueError: unknown benchmark or adapter; a malformed file.
    FileNotFoundError: a benchmark file is missing (the message names it).
  """
  spec = BENCHMARKS.get(name)
  if adapter is None:
    if spec is None:
      raise ValueError(f'benchmark {name!r} is not one of {sorted(BENCHMARKS)}; pass an adapter and files')
    adapter = spec.adapter
  fn = ADAPTERS.get(adapter)
  if files is None:
    paths_ = benchmark_files(name, data_dir)
  else:
    paths_ = [pathlib.Path(files)] if isinstance(files, (str, os.PathLike)) else [pathlib.Path(f) for f in files]
  items = []
  for p in paths_:
    if not p.is_file():
      raise FileNotFoundError(f'benchmark {name!r}: file {p} does not exist')
    items.extend(fn(p, benchmark=name, image_root=image_root))
    if limit and limit > 0 and len(items) >= limit:
      break
  return items[:limit] if limit and limit > 0 else items


def load_images(item: EvalItem, max_pixels: int = image_io.DEFAULT_MAX_DECODE_PIXELS
                ) -> tuple[list[np.ndarray], list[str]]:
  """Decodes the item's images with `tools.image_io.load_image`.

  Returns:
    (images uint8 [H, W, 3] that decoded, problems): a URL is not fetched (offline) and a file or byte string
    that does not decode is reported; neither raises.
  """
  out, problems = [], []
  for source in item.images:
    if isinstance(source, str) and is_url(source):
      problems.append(f'remote image not fetched (offline): {source}')
      continue
    try:
      out.append(image_io.load_image(source, max_pixels=max_pixels))
    except image_io.ImageDecodeError as e:
      where = 'image bytes' if isinstance(source, bytes) else source
      problems.append(f'image unreadable: {where}: {e}')
  return out, problems
