"""Stage `merge`: external VQA corpora added to the item pool (DESIGN.md §7; paper Sec. 3: "Pool merged with
LiveVQA, FVQA and WebQA", before Filters A/B).

Items come through the evaluator's benchmark adapters (`osvl_jax.data.benchmarks.load_benchmark`, files under
`<data_dir>/benchmarks`), by benchmark name (`data.merge_sources`, default `SOURCES`). Each becomes a pool record
with the item table's columns (`osvl_jax.data.pipeline.ITEM_COLUMNS`): prompt_id '<benchmark>-<id>', the question
(also as canonical_question: it is not rewritten), answers (gold first, then aliases), image_path (its local image,
relative to the data folder when it lies in it, as the wiki items' are), no path (hops 0), landmark None,
answer_attribute 'external', plus `source` (the benchmark) in this stage's own split. An item is not merged, with
the reason counted, when:
  held_out   it falls in the held-out part: `merge_holdout` of each corpus by a deterministic hash of
             '<benchmark>/<id>' (sha256, `benchmarks.holdout_key`), kept for evaluation so a trained model never saw it;
  no_image   it has no usable local image (the adapter's `problems`: a URL not fetched offline, an image that is
             not in this release); the pool's items are visual questions whose image is searched;
  no_answer  it has no answer, or its question is empty;
  duplicate  its question (folded) is already in the pool.
The shipped samples: FVQA has its images; LiveVQA's are URLs and WebQA's image ids are in the full release, so
offline only FVQA items are merged (the others are counted under no_image).
"""

import os
import pathlib
from collections.abc import Sequence

from osvl_jax.data import benchmarks
from osvl_jax.data import pipeline as pipeline_data

SOURCES = ('fvqa', 'livevqa_official', 'webqa_img')
EXTERNAL_ATTRIBUTE = 'external'  # the answer_attribute of a merged item (its answer is not an infobox attribute)


def _fold(text: str) -> str:
  return ' '.join(str(text).lower().split())


def check_settings(sources: Sequence[str], holdout: float, prefix: str = 'data') -> None:
  """Raises ValueError naming `<prefix>.merge_sources` (an unknown benchmark) or `<prefix>.merge_holdout` (not
  a fraction in [0, 1))."""
  if isinstance(holdout, bool) or not isinstance(holdout, (int, float)) or not 0 <= holdout < 1:
    raise ValueError(f'{prefix}.merge_holdout={holdout!r}: expected a fraction in [0, 1)')
  unknown = [s for s in sources if s not in benchmarks.BENCHMARKS]
  if unknown:
    raise ValueError(f'{prefix}.merge_sources: {unknown} are not among {sorted(benchmarks.BENCHMARKS)}')


def merge(records: list[dict], data_dir: str | os.PathLike, sources: Sequence[str] = SOURCES,
          holdout: float = 0.2, enabled: bool = True) -> tuple[list[dict], dict]:
  """The pool `records` plus the usable, not held-out items of the external `sources`.

  Args:
    records: the grounded walk items (passed through unchanged).
    data_dir: the shared data folder (benchmark files under `benchmarks/`).
    sources: `benchmarks.BENCHMARKS` names.
    holdout: fraction of each corpus held out for evaluation, in [0, 1).
    enabled: False passes `records` through (the default build: the offline oracle cannot solve external items).
  Returns:
    (records + merged ones, counts {'enabled', 'in', 'added', 'sources': {benchmark: {'read', 'added',
    'held_out', 'no_image', 'no_answer', 'duplicate'}}, 'holdout'}).
  Raises:
    ValueError: an unknown source (naming the known ones), holdout outside [0, 1).
    FileNotFoundError: a source's file is missing (naming it).
  """
  check_settings(sources, holdout)
  out = [dict(r, source=r.get('source') or 'wiki') for r in records]
  counts = {'enabled': bool(enabled), 'in': len(records), 'added': 0, 'sources': {}, 'holdout': float(holdout)}
  if not enabled:
    return out, counts
  seen = {_fold(r['question']) for r in records if r.get('question')}
  for name in sources:
    c = {'read': 0, 'added': 0, 'held_out': 0, 'no_image': 0, 'no_answer': 0, 'duplicate': 0}
    for item in benchmarks.load_benchmark(name, data_dir=data_dir):
      c['read'] += 1
      local = [im for im in item.images if isinstance(im, str) and pathlib.Path(im).is_file()]
      if benchmarks.holdout_key(name, item.id) < holdout:
        c['held_out'] += 1
      elif item.problems or not local:
        c['no_image'] += 1
      elif not item.answers or not item.question.strip():
        c['no_answer'] += 1
      elif _fold(item.question) in seen:
        c['duplicate'] += 1
      else:
        seen.add(_fold(item.question))
        c['added'] += 1
        out.append({'prompt_id': f'{name}-{item.id}', 'question': item.question.strip(),
                    'canonical_question': item.question.strip(), 'answers': list(item.answers),
                    'image_path': pipeline_data.relative_to(local[0], data_dir), 'path': [], 'hops': 0,
                    'rejected': None,
                    'landmark': None, 'descriptors': [], 'answer_attribute': EXTERNAL_ATTRIBUTE,
                    'answer_evidence': None, 'anchor_expression': None, 'rewrite_trace': [], 'source': name})
    counts['sources'][name] = c
    counts['added'] += c['added']
  return out, counts
