"""Benchmark adapters: every evaluation file format -> `EvalItem` (DESIGN.md §9).

  EvalItem{id, benchmark, question, images, answers (gold first, then aliases), metadata, problems}

Adapters are registered by name in `ADAPTERS` (an `osvl_jax.registry.Registry`); each is
`adapter(path, benchmark=..., image_root=...) -> list[EvalItem | Rejected]`, in file order. `BENCHMARKS` names
every benchmark the evaluator knows, with its adapter and its file(s) relative to `osvl_jax.paths.data_dir()`:

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
An entry that cannot be an item is a `Rejected` with its place and kind, never a crash of the whole file and
never a silent drop: a line that is not JSON, valid JSON that is not an object, an object with unreadable fields,
no question (a LiveVQA level missing), no gold answer; `load_benchmark` adds a repeated id and repeated content.
A UTF-8 byte-order mark is accepted. Relative paths are resolved against `image_root` (default: the data file's
folder), also trying the path's trailing components (so `browsecomp-vl/images/level1/x.jpg` is found under an
`images/level1` root too).
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
from osvl_jax.data import eval_items
from osvl_jax.data.eval_items import EvalItem, Rejected, item_key, make_item  # noqa: F401  (re-exported)
from osvl_jax.data.records import (  # noqa: F401  (read_records, resolve_image: re-exported)
    ALIAS_KEYS, ANSWER_KEYS, ID_KEYS, IMAGE_KEYS, QUESTION_KEYS, BadLine, as_strings, first_field,
    image_entries, image_roots, is_url, iter_records, read_records, resolve_image)
from tools import image_io

Adapter = Callable[..., list[EvalItem | Rejected]]
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


def _entries(path: pathlib.Path, benchmark: str,
             build: Callable[[int, dict, str], Any]) -> list[EvalItem | Rejected]:
  """`build(n, record, where)` (an item, a `Rejected`, or a list of them) over the records of `path`; a bad line,
  a non-object entry and a record whose fields `build` cannot read become `Rejected` in their place."""
  out = []
  for n, record in iter_records(path):
    where = f'{path}:{n}'
    if isinstance(record, BadLine):
      out.append(Rejected(benchmark, record.where, eval_items.BAD_JSON, record.detail))
    elif not isinstance(record, dict):
      out.append(Rejected(benchmark, where, eval_items.NOT_AN_OBJECT,
                          f'a JSON {type(record).__name__}, not an object: {str(record)[:80]!r}'))
    else:
      try:
        built = build(n, record, where)
      except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        built = Rejected(benchmark, where, eval_items.MALFORMED, f'{type(e).__name__}: {str(e)[:200]}',
                         str(first_field(record, ID_KEYS) or ''))
      out.extend(built if isinstance(built, list) else [built])
  return out


# ----------------------------------------------------------------------------------------------------------------
# Adapters
# ----------------------------------------------------------------------------------------------------------------

@ADAPTERS.register('generic')
def generic(path: str | os.PathLike, benchmark: str,
            image_root: str | os.PathLike | None = None) -> list[EvalItem | Rejected]:
  """Any jsonl/json list whose records name question, answer(s) and image(s) with common keys.

  Question: first of `QUESTION_KEYS`; answers: first of `ANSWER_KEYS` plus every `ALIAS_KEYS` field; images:
  first of `IMAGE_KEYS` (path, URL, base64, HF `{"bytes", "path"}`, or a list of those); id: first of `ID_KEYS`.
  Used for VDR-Bench, the official SimpleVQA (data_id, image, question, answer, ...) and MMSearch end2end
  (sample_id, query, query_image, gt_answer, alternative_gt_answers, ...) releases. The remaining scalar fields
  are kept in metadata.

  Raises:
    FileNotFoundError: no such file.
  """
  path = pathlib.Path(path)
  roots = image_roots(path, image_root)
  used = set(QUESTION_KEYS + ANSWER_KEYS + ALIAS_KEYS + IMAGE_KEYS + ID_KEYS)

  def build(n, record, where):
    answers = as_strings(first_field(record, ANSWER_KEYS)) + [s for k in ALIAS_KEYS for s in as_strings(record.get(k))]
    item_id = first_field(record, ID_KEYS)
    metadata = {k: v for k, v in record.items()
                if k not in used and isinstance(v, (str, int, float, bool)) and len(str(v)) <= 500}
    return make_item(benchmark, item_id if item_id is not None else f'{path.stem}-{n}',
                     first_field(record, QUESTION_KEYS), answers, image_entries(first_field(record, IMAGE_KEYS)),
                     roots, metadata, where)
  return _entries(path, benchmark, build)


@ADAPTERS.register('browsecomp_vl')
def browsecomp_vl(path, benchmark: str = 'browsecomp_vl', image_root=None) -> list[EvalItem | Rejected]:
  """BrowseComp-VL (WebWatcher): {question, image_path, answers, domain}; id '<file stem>-<line>'."""
  path = pathlib.Path(path)
  roots = image_roots(path, image_root)
  level = path.stem.rsplit('_', 1)[-1]
  return _entries(path, benchmark, lambda n, r, where: make_item(
      benchmark, f'{path.stem}-{n}', r.get('question'), as_strings(r.get('answers')),
      image_entries(r.get('image_path')), roots, {'domain': r.get('domain'), 'level': level}, where))


@ADAPTERS.register('webwatcher')
def webwatcher(path, benchmark: str, image_root=None) -> list[EvalItem | Rejected]:
  """WebWatcher's eval jsonl (MMSearch, SimpleVQA, LiveVQA, HLE): {prompt, file_path, answers, question_id, ...}.

  `answers` may be a list of strings or (HLE) a list of lists; `file_path` a URL (not fetched offline: reported
  by `load_images`) or a path. The misleading `source` field ("HLE" in every file) is kept as `orig_source`.
  """
  path = pathlib.Path(path)
  roots = image_roots(path, image_root)

  def build(n, r, where):
    metadata = {k: r[k] for k in ('task', 'tags', 'lang', 'rationale') if k in r}
    metadata['orig_source'] = r.get('source')
    return make_item(benchmark, r.get('question_id', f'{path.stem}-{n}'), first_field(r, QUESTION_KEYS),
                     as_strings(r.get('answers')), image_entries(first_field(r, ('file_path', 'image_path', 'image'))),
                     roots, metadata, where)
  return _entries(path, benchmark, build)


@ADAPTERS.register('livevqa_official')
def livevqa_official(path, benchmark: str = 'livevqa_official', image_root=None) -> list[EvalItem | Rejected]:
  """Official LiveVQA JSON list; each entry gives two items, '<id>-l1' and '<id>-l2' (level1_qa, level2_qa).

  The options are appended to the question ("Choices:" then "A. ..."); answers are the gold option's text then
  `Ground_Truth_List`; the gold letter is `metadata['gold_letter']`. Image: the level's `img_path` (else the
  entry's), else its `img_url`. A level that is missing or has no question is a `Rejected` (`no_question`).
  """
  path = pathlib.Path(path)
  roots = image_roots(path, image_root)

  def build(n, r, where):
    out = []
    for level in ('level1_qa', 'level2_qa'):
      qa, item_id, at = r.get(level), f'{r.get("id")}-l{level[5]}', f'{where}/l{level[5]}'
      if not isinstance(qa, dict):
        out.append(Rejected(benchmark, at, eval_items.NO_QUESTION, f'entry has no {level} object', item_id))
        continue
      options = [str(o) for o in qa.get('options') or []]
      question = qa.get('question')
      if isinstance(question, str) and options:
        question += '\nChoices:\n' + '\n'.join(options)
      letter = str(qa.get('Ground_Truth', '')).strip()
      gold = [o.split('.', 1)[1].strip() for o in options if o.split('.', 1)[0].strip() == letter and '.' in o]
      image = qa.get('img_path') or r.get('img_path') or qa.get('img_url')
      out.append(make_item(
          benchmark, item_id, question, gold + as_strings(qa.get('Ground_Truth_List')), image_entries(image), roots,
          {'level': int(level[5]), 'question_type': qa.get('question_type'), 'gold_letter': letter or None,
           'source': r.get('source'), 'time': r.get('time'), 'file': path.stem}, at))
    return out
  return _entries(path, benchmark, build)


@ADAPTERS.register('fvqa')
def fvqa(path, benchmark: str = 'fvqa', image_root=None) -> list[EvalItem | Rejected]:
  """FVQA (MMSearch-R1): {data_id, question, ground_truth, candidate_answers, image, category, ...}."""
  path = pathlib.Path(path)
  roots = image_roots(path, image_root)
  return _entries(path, benchmark, lambda n, r, where: make_item(
      benchmark, r.get('data_id', f'{path.stem}-{n}'), r.get('question'),
      as_strings(r.get('ground_truth')) + as_strings(r.get('candidate_answers')), image_entries(r.get('image')),
      roots, {'category': r.get('category'), 'source_split': r.get('source_split')}, where))


@ADAPTERS.register('webqa')
def webqa(path, benchmark: str, image_root=None) -> list[EvalItem | Rejected]:
  """WebQA val gold columns: {Guid, Qcate, Q, A (list), Keywords_A}.

  Answers: `A` then `Keywords_A` (unless 'TBD'). Image queries name no image here (their ids are in the 7 GB
  release), so each such item carries the problem 'image not in this release'; text queries need none.
  """
  path = pathlib.Path(path)
  problems = ['image not in this release (WebQA image ids are in the full release)'] if 'img' in path.stem else []

  def build(n, r, where):
    keywords = [] if str(r.get('Keywords_A', '')).strip() in ('', 'TBD') else as_strings(r.get('Keywords_A'))
    return make_item(benchmark, r.get('Guid', f'{path.stem}-{n}'), first_field(r, QUESTION_KEYS),
                     as_strings(r.get('A')) + keywords, (), [], {'qcate': r.get('Qcate')}, where, problems)
  return _entries(path, benchmark, build)


@ADAPTERS.register('infoseek')
def infoseek(path, benchmark: str = 'infoseek', image_root=None) -> list[EvalItem | Rejected]:
  """InfoSeek (Chen et al. 2023): {data_id, image_id, question, answer, answer_eval, data_split}.

  `answer_eval` entries are strings, or for numerical questions `{"wikidata": x, "range": [lo, hi]}`: the
  value is added to the answers and the range kept in `metadata['numeric_ranges']` (a response number inside
  it is correct, InfoSeek's own rule; other numbers match within ±10%, `metadata['numeric_tolerance']`).
  The image is `<image_root>/<image_id>.{jpg,JPEG,jpeg,png}` (OVEN images).
  """
  path = pathlib.Path(path)
  roots = image_roots(path, image_root)

  def build(n, r, where):
    ranges = [list(map(float, e['range'])) for e in r.get('answer_eval') or []
              if isinstance(e, dict) and isinstance(e.get('range'), (list, tuple)) and len(e['range']) == 2]
    image_id = r.get('image_id')
    entries = []
    if image_id:
      names = [f'{image_id}{ext}' for ext in ('.jpg', '.JPEG', '.jpeg', '.png')]
      entries = [next((m for m in names if resolve_image(m, roots)[0] is not None), names[0])]
    metadata = {'data_split': r.get('data_split'), 'image_id': image_id, 'numeric_tolerance': 0.1}
    if ranges:
      metadata['numeric_ranges'] = ranges
    return make_item(benchmark, r.get('data_id', f'{path.stem}-{n}'), r.get('question'),
                     as_strings(r.get('answer')) + as_strings(r.get('answer_eval')), entries, roots, metadata, where)
  return _entries(path, benchmark, build)


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
                   limit: int | None = None, data_dir: str | os.PathLike | None = None,
                   rejected: list[Rejected] | None = None) -> list[EvalItem]:
  """Items of benchmark `name`, in file order (the first `limit` when given).

  Args:
    name: a `BENCHMARKS` key, or any name when `files` and `adapter` are given.
    files: file(s) to read instead of the benchmark's default ones.
    image_root: folder that relative image paths are resolved against (besides each file's folder).
    adapter: registered adapter name instead of the benchmark's.
    limit: at most this many items (None / <= 0: all).
    data_dir: the data folder (default `paths.data_dir()`).
    rejected: when given, every entry that is not an item is appended to it (`Rejected`, module docstring),
      also an item whose id or content (`item_key`) an earlier item of the benchmark has (the first one is
      kept). Pass a list whenever the entries left out must be reported.
  Returns:
    EvalItems; items with unusable images are kept and carry `problems`.
  Raises:
    ValueError: unknown benchmark or adapter.
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
  missing = [p for p in paths_ if not p.is_file()]
  if missing:
    raise FileNotFoundError(f'benchmark {name!r}: file {missing[0]} does not exist')
  items, left_out, ids, keys = [], [], set(), {}
  for p in paths_:
    for entry in fn(p, benchmark=name, image_root=image_root):
      if isinstance(entry, Rejected):
        left_out.append(entry)
      elif entry.id in ids:
        left_out.append(Rejected(name, str(p), eval_items.DUPLICATE_ID,
                                 f'id {entry.id!r} is already the id of an earlier item', entry.id))
      elif item_key(entry) in keys:
        left_out.append(Rejected(name, str(p), eval_items.DUPLICATE_ITEM,
                                 f'same question, answers and images as item {keys[item_key(entry)]!r}', entry.id))
      else:
        ids.add(entry.id)
        keys[item_key(entry)] = entry.id
        items.append(entry)
    if limit and limit > 0 and len(items) >= limit:
      break
  if rejected is not None:
    rejected.extend(left_out)
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
