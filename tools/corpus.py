"""The Wikispeedia corpus: 4,598 Wikipedia articles (2007 Schools selection), their link graph and plaintext.

Data: `<data_dir>/wikipedia/wikispeedia/{articles,links,categories}.tsv` and `plaintext_all.tar.xz`
(see the SOURCE.md beside them). Titles are URL-decoded (`Taj_Mahal`, `Éire`, `AT&T`). The plaintext archive is
extracted once into `cache_dir()/wikispeedia_plaintext_<size>_<mtime>/` (about 2 s, 98 MB) and read from there
afterwards; a changed archive gets a new folder.

Used by the local `text_search` backend and by the data pipeline (entity chains over `links`).
"""

import collections
import dataclasses
import functools
import os
import pathlib
import shutil
import tarfile
import tempfile
import urllib.parse

from osvl_jax import paths

_HEADER_PREFIX = '2007 Schools Wikipedia Selection'
_FOOTER_PREFIX = 'Retrieved from "'


def cache_dir() -> pathlib.Path:
  """Writable cache folder: `$OSVL_CACHE_DIR`, default `~/.cache/osvl_jax` (created if missing)."""
  path = pathlib.Path(os.environ.get('OSVL_CACHE_DIR', pathlib.Path.home() / '.cache' / 'osvl_jax'))
  path.mkdir(parents=True, exist_ok=True)
  return path


def _read_tsv(path: pathlib.Path) -> list[list[str]]:
  """Rows of a Wikispeedia TSV with `#` comments and blank lines dropped; every field URL-decoded."""
  rows = []
  with open(path, encoding='utf-8') as f:
    for line in f:
      line = line.rstrip('\n')
      if not line or line.startswith('#'):
        continue
      rows.append([urllib.parse.unquote(x) for x in line.split('\t')])
  return rows


def extract_plaintext(archive: pathlib.Path, cache: pathlib.Path | None = None) -> pathlib.Path:
  """Extracts `plaintext_all.tar.xz` once into the cache and returns the folder of `<encoded title>.txt` files.

  The folder name carries the archive's size and mtime, so a replaced archive is re-extracted. Extraction goes
  to a temporary sibling that is renamed into place, so a crash never leaves a half-filled folder behind.

  Args:
    archive: path of `plaintext_all.tar.xz`.
    cache: cache root; default `cache_dir()`.
  Returns:
    The folder holding the 4,598 `.txt` files.
  """
  stat = archive.stat()
  cache = cache or cache_dir()
  target = cache / f'wikispeedia_plaintext_{stat.st_size}_{int(stat.st_mtime)}'
  articles = target / 'plaintext_articles'
  if articles.is_dir():
    return articles
  tmp = pathlib.Path(tempfile.mkdtemp(prefix='.extract_', dir=cache))
  try:
    with tarfile.open(archive, 'r:xz') as tar:
      tar.extractall(tmp, filter='data')
    try:
      os.replace(tmp, target)
    except OSError:  # Another process finished first.
      if not articles.is_dir():
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return articles


def clean_plaintext(raw: str) -> str:
  """Body text of one Wikispeedia plaintext file.

  Drops the `#copyright` line, the title line, the `2007 Schools Wikipedia Selection. Related subjects: ...`
  paragraph, the `Retrieved from "..."` licence footer and bare `Enlarge` image-caption lines; strips the
  3-space indentation. Paragraphs stay separated by blank lines.
  """
  lines = [line.strip() for line in raw.splitlines()]
  start = 0
  for i, line in enumerate(lines[:12]):
    if line.startswith(_HEADER_PREFIX):
      start = i
      while start < len(lines) and lines[start]:  # Skip the rest of that paragraph.
        start += 1
      break
  else:
    start = 1 if lines and lines[0] == '#copyright' else 0
  end = len(lines)
  for i in range(len(lines) - 1, start - 1, -1):
    if lines[i].startswith(_FOOTER_PREFIX):
      end = i
      break
  body = [line for line in lines[start:end] if line != 'Enlarge']
  return '\n'.join(body).strip()


@dataclasses.dataclass(eq=False)  # Hash by identity (lru_cache on methods).
class WikiCorpus:
  """Wikispeedia articles, link graph and text.

  Attributes:
    titles: all 4,598 article titles (decoded, underscores kept, e.g. `Taj_Mahal`), in articles.tsv order.
    links: title -> out-linked titles (links.tsv order; every title has an entry, possibly empty).
    in_degree: title -> number of articles linking to it.
    categories: title -> category paths, e.g. `['subject.Geography.Geography_of_Asia', ...]` (possibly empty).
    plaintext_dir: folder of `<url-encoded title>.txt` files.
  """
  titles: list[str]
  links: dict[str, list[str]]
  in_degree: dict[str, int]
  categories: dict[str, list[str]]
  plaintext_dir: pathlib.Path

  def __post_init__(self):
    self._title_set = frozenset(self.titles)

  def __contains__(self, title: str) -> bool:
    return title in self._title_set

  def __len__(self) -> int:
    return len(self.titles)

  def has_text(self, title: str) -> bool:
    """Whether a plaintext file exists for `title`."""
    return self._path(title).is_file()

  def _path(self, title: str) -> pathlib.Path:
    return self.plaintext_dir / (urllib.parse.quote(title, safe='') + '.txt')

  @functools.lru_cache(maxsize=512)
  def raw_text(self, title: str) -> str:
    """The plaintext file of `title` as shipped (header, body, licence footer).

    Raises:
      KeyError: `title` is not an article, or it has no plaintext file.
    """
    if title not in self._title_set:
      raise KeyError(f'{title!r} is not a Wikispeedia article')
    path = self._path(title)
    if not path.is_file():
      raise KeyError(f'article {title!r} has no plaintext file')
    return path.read_text(encoding='utf-8', errors='replace')

  def text(self, title: str) -> str:
    """Cleaned body text of `title` (see `clean_plaintext`). Raises KeyError as `raw_text`."""
    return clean_plaintext(self.raw_text(title))


def display_title(title: str) -> str:
  """`Great_Wall_of_China` -> `Great Wall of China`."""
  return title.replace('_', ' ')


@functools.lru_cache(maxsize=4)
def _load(data_dir: str) -> WikiCorpus:
  root = pathlib.Path(data_dir) / 'wikipedia' / 'wikispeedia'
  titles = [row[0] for row in _read_tsv(root / 'articles.tsv')]
  links = {t: [] for t in titles}
  in_degree = collections.Counter()
  for row in _read_tsv(root / 'links.tsv'):
    src, dst = row[0], row[1]
    links.setdefault(src, []).append(dst)
    in_degree[dst] += 1
  categories = {t: [] for t in titles}
  for row in _read_tsv(root / 'categories.tsv'):
    categories.setdefault(row[0], []).append(row[1])
  plaintext = extract_plaintext(root / 'plaintext_all.tar.xz')
  return WikiCorpus(titles=titles, links=links, in_degree={t: in_degree.get(t, 0) for t in titles},
                    categories=categories, plaintext_dir=plaintext)


def load_wikispeedia(data_dir: str | os.PathLike | None = None) -> WikiCorpus:
  """Loads the Wikispeedia corpus (memoised per data folder within a process).

  Args:
    data_dir: the shared data folder (the one holding `wikipedia/`); default `osvl_jax.paths.data_dir()`.
  Returns:
    A `WikiCorpus`. The first call in a fresh cache extracts the plaintext archive (~2 s); later calls only
    read the three TSVs (~0.3 s).
  Raises:
    FileNotFoundError: the data folder or one of its files is missing.
  """
  root = pathlib.Path(data_dir) if data_dir is not None else paths.data_dir()
  return _load(str(root.resolve()))
