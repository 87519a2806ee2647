"""The evaluation item (`EvalItem`), the record of a file entry that is not one (`Rejected`), and item identity.

An item's identity is its content, never its place in a file (line numbers shift when a file is edited, and
BrowseComp-VL / HLE ids are line numbers): `item_key` hashes the question, the answers, the judging metadata
and each image's content (`EvalItem.image_keys`: sha256 of a local file's or inline image's bytes, a URL as
written, or the reference of an image that was not found).
"""

import dataclasses
import functools
import hashlib
import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any

from osvl_jax.data.records import dedupe, resolve_image

# Rejection kinds (`Rejected.kind`), as the report counts them.
BAD_JSON = 'bad_json'            # a line (or a .json file) that is not JSON
NOT_AN_OBJECT = 'not_an_object'  # valid JSON that is not an object (a string, a number, a list)
MALFORMED = 'malformed_entry'    # an object whose fields the adapter cannot read (wrong types)
NO_QUESTION = 'no_question'      # no question text (a LiveVQA entry: per missing level)
NO_ANSWER = 'no_answer'          # no gold answer: it could only be counted wrong
DUPLICATE_ID = 'duplicate_id'    # an id already given to an earlier item of the benchmark
DUPLICATE_ITEM = 'duplicate_item'  # the same content (question, answers, images) as an earlier item

# Metadata that changes how a response is judged, so it is part of the item's identity.
_JUDGING_METADATA = ('gold_letter', 'numeric_ranges', 'numeric_tolerance')


@dataclasses.dataclass
class EvalItem:
  """One benchmark question.

  Attributes:
    id: unique within its benchmark (the file's own id when it has one, else '<file stem>-<line or index>'); for
      display and held-out splits, not for identity (`item_key`).
    benchmark: the benchmark name (a key of `BENCHMARKS`, or the name the caller gave).
    question: the question text as the model sees it (multiple-choice options included when the format keeps
      them apart).
    images: image sources in order: absolute local path (str), http(s) URL (str), or encoded bytes.
    answers: accepted answers, the gold answer first, then its aliases; never empty.
    metadata: format-specific fields kept for the report (level, domain, split, ...). `numeric_ranges`
      (list of [lo, hi]) marks a numeric answer accepted within a range (InfoSeek); `gold_letter` the correct
      option of a multiple-choice item.
    problems: why an image cannot be used (missing file, remote URL, unreadable); empty when all are usable.
    image_keys: one content identity per image entry of the record, resolved or not ('sha256:<hex>', a URL, or
      'missing:<reference>').
  """
  id: str
  benchmark: str
  question: str
  images: list[str | bytes] = dataclasses.field(default_factory=list)
  answers: list[str] = dataclasses.field(default_factory=list)
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
  problems: list[str] = dataclasses.field(default_factory=list)
  image_keys: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Rejected:
  """A file entry that is not an evaluable item; it is counted in the report, by kind, never dropped silently.

  Attributes:
    benchmark: the benchmark name.
    where: '<file>:<line>' ('<file>:<index>' in a .json list), plus '/l1' or '/l2' for a LiveVQA level.
    kind: one of the kinds above (`BAD_JSON`, `NOT_AN_OBJECT`, ...).
    detail: what is wrong, for a person.
    id: the entry's id when it has one, else ''.
  """
  benchmark: str
  where: str
  kind: str
  detail: str
  id: str = ''


@functools.lru_cache(maxsize=65536)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
  del size, mtime_ns  # the cache key: a rewritten file is hashed again
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      h.update(block)
  return h.hexdigest()


def file_digest(path: str | os.PathLike) -> str:
  """sha256 hex digest of a file's bytes (cached per path, size and modification time)."""
  st = os.stat(path)
  return _file_digest(str(path), st.st_size, st.st_mtime_ns)


def _image_key(entry: Any, source: str | bytes | None) -> str:
  if isinstance(source, bytes):
    return 'sha256:' + hashlib.sha256(source).hexdigest()
  if isinstance(source, str) and pathlib.Path(source).is_file():
    return 'sha256:' + file_digest(source)
  if isinstance(source, str):
    return source  # a URL
  ref = entry.get('path') or entry.get('url') if isinstance(entry, dict) else entry
  ref = str(ref)
  return 'missing:' + (ref if len(ref) <= 300 else 'sha256:' + hashlib.sha256(ref.encode()).hexdigest())


def make_item(benchmark: str, item_id: Any, question: Any, answers: Sequence[str], image_entries: Sequence[Any],
              roots: Sequence[pathlib.Path], metadata: dict, where: str,
              problems: Sequence[str] = ()) -> EvalItem | Rejected:
  """The EvalItem of one entry, or a `Rejected` (`NO_QUESTION`, `NO_ANSWER`) when it cannot be evaluated.

  Args:
    benchmark: the benchmark name.
    item_id: the entry's id (str()-ed).
    question: the question text; anything but a non-empty string is `NO_QUESTION`.
    answers: gold answer first, then aliases (deduplicated here); none is `NO_ANSWER`.
    image_entries: the record's image field values (paths, URLs, base64, HF dicts), resolved under `roots`.
    roots: folders relative image paths are tried under.
    metadata: kept on the item.
    where: '<file>:<line>' of the entry, for a rejection.
    problems: image problems known beforehand.
  """
  item_id = str(item_id)
  if not isinstance(question, str) or not question.strip():
    return Rejected(benchmark, where, NO_QUESTION, f'no question text (got {str(question)[:80]!r})', item_id)
  answers = dedupe(answers)
  if not answers:
    return Rejected(benchmark, where, NO_ANSWER, 'no gold answer in the record', item_id)
  item = EvalItem(id=item_id, benchmark=benchmark, question=question.strip(), answers=answers,
                  metadata=metadata, problems=list(problems))
  for entry in image_entries:
    source, problem = resolve_image(entry, roots)
    item.image_keys.append(_image_key(entry, source))
    if source is not None:
      item.images.append(source)
    if problem is not None:
      item.problems.append(problem)
  return item


def item_key(item: EvalItem) -> str:
  """The content identity of an item: sha256 (hex, 32 chars) of its question, answers, judging metadata and
  image keys. Equal for the same question wherever it sits in its file; different when any of them changes."""
  content = {'question': item.question, 'answers': list(item.answers), 'images': list(item.image_keys),
             'judging': {k: item.metadata[k] for k in _JUDGING_METADATA if item.metadata.get(k) is not None}}
  blob = json.dumps(content, sort_keys=True, ensure_ascii=False, default=str)
  return hashlib.sha256(blob.encode('utf-8')).hexdigest()[:32]
