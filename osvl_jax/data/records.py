"""Reading benchmark files: JSON lines / JSON lists, the field names public benchmarks use for question, answers,
aliases, images and ids, and image references (local paths under candidate roots, URLs, base64).

Used by the adapters of `osvl_jax.data.benchmarks`; nothing here decodes pixels (`tools.image_io` does).
"""

import base64
import binascii
import dataclasses
import json
import os
import pathlib
import re
from collections.abc import Sequence
from typing import Any

QUESTION_KEYS = ('question', 'prompt', 'Q', 'query')
ANSWER_KEYS = ('answers', 'answer', 'gt_answer', 'ground_truth', 'A', 'Ground_Truth_List')
ALIAS_KEYS = ('alternative_gt_answers', 'candidate_answers', 'aliases', 'answer_aliases')
IMAGE_KEYS = ('image_path', 'images', 'image', 'img_path', 'file_path', 'query_image', 'image_url', 'img_url')
ID_KEYS = ('id', 'data_id', 'question_id', 'sample_id', 'Guid', 'uid')


# ----------------------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BadLine:
  """A line (or a whole .json file) of a data file that is not JSON.

  Attributes:
    where: '<file>:<line>' (1-based line), or '<file>' for a .json file.
    detail: the parser's message.
  """
  where: str
  detail: str


def iter_records(path: str | os.PathLike) -> list[tuple[int, Any]]:
  """(1-based line number, or 0-based list index for .json, parsed JSON value or `BadLine`) of a file.

  Tolerant: a UTF-8 byte-order mark (at the start of the file or of a line, as concatenated files carry it) is
  dropped; a line that is not JSON gives a `BadLine` in its place and the other lines are still read; a .json
  file that is not JSON gives one `BadLine` (line 0). Values are returned as parsed (objects, but also lists,
  strings, numbers: the caller decides what an entry must be).

  Raises:
    FileNotFoundError: no such file.
    UnicodeDecodeError: the file is not UTF-8.
  """
  path = pathlib.Path(path)
  text = path.read_text(encoding='utf-8-sig')
  if path.suffix == '.json':
    try:
      data = json.loads(text)
    except json.JSONDecodeError as e:
      return [(0, BadLine(str(path), f'not JSON: {e}'))]
    return list(enumerate(data if isinstance(data, list) else [data]))
  out = []
  for line_no, line in enumerate(text.splitlines(), 1):
    line = line.lstrip('\ufeff')
    if line.strip():
      try:
        out.append((line_no, json.loads(line)))
      except json.JSONDecodeError as e:
        out.append((line_no, BadLine(f'{path}:{line_no}', f'not JSON: {e}')))
  return out


def read_records(path: str | os.PathLike) -> list[tuple[int, Any]]:
  """`iter_records`, strict: the first line (or .json file) that is not JSON raises.

  Raises:
    FileNotFoundError: no such file.
    ValueError: a line (or the .json file) that is not JSON, naming the file and line.
  """
  out = iter_records(path)
  bad = next((r for _, r in out if isinstance(r, BadLine)), None)
  if bad is not None:
    raise ValueError(f'{bad.where}: {bad.detail}')
  return out


def first_field(record: dict, keys: Sequence[str]) -> Any:
  """The value of the first of `keys` present in `record` with a non-empty value, else None."""
  for k in keys:
    if record.get(k) not in (None, '', []):
      return record[k]
  return None


def as_strings(value: Any) -> list[str]:
  """Answer strings of a field: a string, a number, a list (of lists, HLE), or dicts with `wikidata`/`answer`."""
  if value is None:
    return []
  if isinstance(value, (list, tuple)):
    return [s for v in value for s in as_strings(v)]
  if isinstance(value, dict):
    return as_strings(first_field(value, ('wikidata', 'answer', 'text', 'value')))
  if isinstance(value, float) and value.is_integer():
    value = int(value)
  text = str(value).strip()
  return [text] if text else []


def dedupe(values: Sequence[str]) -> list[str]:
  """`values` without repeats (compared case- and whitespace-insensitively), in order of first appearance."""
  seen, out = set(), []
  for v in values:
    key = ' '.join(v.lower().split())
    if key not in seen:
      seen.add(key)
      out.append(v)
  return out


def is_url(source: str) -> bool:
  """True for an http(s) URL (never fetched offline: reported as an image problem)."""
  return source.startswith(('http://', 'https://'))


def resolve_image(entry: Any, roots: Sequence[pathlib.Path]) -> tuple[str | bytes | None, str | None]:
  """(source, problem) of one image field value.

  source: absolute path of an existing file, a URL, or bytes (HF `{"bytes": ...}` or a base64 string);
  problem: None, or why the image cannot be used (a missing file names every place looked at).
  """
  if isinstance(entry, dict):
    if entry.get('bytes'):
      data = entry['bytes']
      return (bytes(data) if isinstance(data, (bytes, bytearray)) else b64_bytes(str(data))), None
    entry = entry.get('path') or entry.get('url')
  if isinstance(entry, (bytes, bytearray)):
    return bytes(entry), None
  if not isinstance(entry, str) or not entry.strip():
    return None, f'no image in field value {str(entry)[:80]!r}'
  entry = entry.strip()
  if is_url(entry):
    return entry, None
  if entry.startswith('data:image') or (len(entry) > 256 and _BASE64_RE.fullmatch(entry)):
    data = b64_bytes(entry.split(',', 1)[-1])
    return (data, None) if data else (None, 'image field holds an undecodable base64 string')
  path = pathlib.Path(entry)
  if path.is_absolute():
    return (str(path), None) if path.is_file() else (None, f'image file missing: {path}')
  tried = []
  for root in roots:
    parts = path.parts
    for k in range(len(parts)):
      candidate = root.joinpath(*parts[k:])
      tried.append(str(candidate))
      if candidate.is_file():
        return str(candidate.resolve()), None
  return None, f'image file missing: {entry} (looked in {", ".join(str(r) for r in roots)})'


_BASE64_RE = re.compile(r'[A-Za-z0-9+/=\s]+')


def b64_bytes(text: str) -> bytes | None:
  """`text` decoded as base64 (no data-URL prefix), or None when it is not base64."""
  try:
    return base64.b64decode(text, validate=False)
  except (binascii.Error, ValueError):
    return None


def image_roots(path: pathlib.Path, image_root: str | os.PathLike | None) -> list[pathlib.Path]:
  """Folders relative image paths are tried under: `image_root` (if given), then the data file's folder."""
  roots = [pathlib.Path(image_root)] if image_root else []
  return roots + [path.parent]


def image_entries(value: Any) -> list[Any]:
  """An image field as a list of entries (one path / URL / base64 string, or a list of them); [] when empty."""
  if value in (None, '', []):
    return []
  return list(value) if isinstance(value, (list, tuple)) else [value]
