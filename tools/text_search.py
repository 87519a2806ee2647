"""Local `text_search` backend: BM25 (`bm25s`) over the Wikispeedia plaintext, with extractive snippets.

Each article is indexed as `title title body` (title twice, as a field boost). Tokens: lower-cased runs of
letters/digits (`_` splits, so `Taj_Mahal` == `taj mahal`), English stopwords removed, a light plural stemmer
(`statues` -> `statue`, `cities` -> `city`). The index is saved under
`corpus.cache_dir()/bm25_wikispeedia_<key>/` keyed by the plaintext archive (size, mtime) and `INDEX_VERSION`,
so only the first process builds it (~40 s on one core); later ones load it (~0.3 s).

Result text, one hit per block, best first:

  [1] Taj Mahal: ... is a monument located in Agra, India, constructed between 1631 and 1654 ... as a
  mausoleum for his favourite wife ...
  [2] ...
"""

import dataclasses
import functools
import json
import os
import pathlib
import re
import shutil
import tempfile
import threading

import numpy as np

from tools import corpus as corpus_lib

INDEX_VERSION = 1
SNIPPET_WORDS = 40  # Window length of the extractive snippet, words.
MAX_TOP_K = 20

_WORD_RE = re.compile(r'[^\W_]+')
_STOPWORDS = frozenset((
    'a an and are as at be but by for if in into is it no not of on or such that the their then there these '
    'they this to was will with what which who whom whose where when why how did does do done from its his her '
    'he she were has have had been being can could would should than also about after before over under was'
).split())


def _stem(word: str) -> str:
  """Light plural stemmer: `cities`->`city`, `churches`->`church`, `statues`->`statue`; keeps `-ss`, `-us`, `-is`."""
  if len(word) > 4 and word.endswith('ies'):
    return word[:-3] + 'y'
  if len(word) > 4 and word.endswith(('sses', 'shes', 'ches', 'xes', 'zes')):
    return word[:-2]
  if len(word) > 3 and word.endswith('s') and not word.endswith(('ss', 'us', 'is')):
    return word[:-1]
  return word


def tokenize(text: str) -> list[str]:
  """Index/query tokens of `text` (lower-cased, stopwords dropped, light-stemmed)."""
  out = []
  for m in _WORD_RE.finditer(text.lower()):
    w = m.group()
    if w in _STOPWORDS or (len(w) < 2 and not w.isdigit()):
      continue
    out.append(_stem(w))
  return out


@functools.lru_cache(maxsize=1 << 18)
def _word_tokens(word: str) -> tuple[str, ...]:
  """`tokenize` of one whitespace-delimited word, memoised (snippets look at every word of an article)."""
  return tuple(tokenize(word))


@dataclasses.dataclass
class Hit:
  """One search hit: `title` (e.g. `Taj_Mahal`), BM25 `score` (> 0) and an extractive `snippet`."""
  title: str
  score: float
  snippet: str


def make_snippet(text: str, query_terms: set[str], num_words: int = SNIPPET_WORDS) -> str:
  """The `num_words`-word window of `text` holding the most distinct query terms (then most hits, earliest).

  Args:
    text: article body.
    query_terms: stemmed query tokens (see `tokenize`).
    num_words: window length in words.
  Returns:
    One line of text, whitespace collapsed, with `...` where it was cut; the opening words when no term occurs.
  """
  words = text.split()
  if not words:
    return ''
  tokens = map(_word_tokens, words)
  keys = [next((t for t in toks if t in query_terms), None) if toks else None for toks in tokens]
  best, best_key = 0, (-1, -1, 0)
  if any(k is not None for k in keys):
    for start in range(0, max(1, len(words) - num_words + 1)):
      if keys[start] is None:  # Windows worth scoring start on a hit.
        continue
      window = [k for k in keys[start:start + num_words] if k is not None]
      key = (len(set(window)), len(window), -start)
      if key > best_key:
        best, best_key = start, key
    best = max(0, best - 5)  # A few words of context before the first hit.
  end = min(len(words), best + num_words)
  snippet = ' '.join(words[best:end])
  return ('... ' if best > 0 else '') + snippet + (' ...' if end < len(words) else '')


class BM25Index:
  """BM25 over every Wikispeedia article that has plaintext.

  Attributes:
    corpus: the `WikiCorpus`.
    titles: list[str], the document order of the index.
  """

  def __init__(self, corpus: corpus_lib.WikiCorpus, cache: pathlib.Path | None = None):
    import bm25s  # Heavy-ish import; only when an index is wanted.
    self.corpus = corpus
    cache = cache or corpus_lib.cache_dir()
    key = corpus.plaintext_dir.parent.name.replace('wikispeedia_plaintext_', '')
    folder = cache / f'bm25_wikispeedia_{key}_v{INDEX_VERSION}'
    titles_file = folder / 'titles.json'
    if titles_file.is_file():
      self.titles = json.loads(titles_file.read_text())
      self.retriever = bm25s.BM25.load(str(folder), show_progress=False)
      self.build_seconds = 0.0
      return
    import time
    t0 = time.perf_counter()
    self.titles = [t for t in corpus.titles if corpus.has_text(t)]
    docs = []
    for t in self.titles:
      name = corpus_lib.display_title(t)
      docs.append(tokenize(f'{name} {name} {corpus.text(t)}'))
    self.retriever = bm25s.BM25()
    self.retriever.index(docs, show_progress=False)
    self.build_seconds = time.perf_counter() - t0
    tmp = pathlib.Path(tempfile.mkdtemp(prefix='.bm25_', dir=cache))
    try:
      self.retriever.save(str(tmp), show_progress=False)
      (tmp / 'titles.json').write_text(json.dumps(self.titles))
      try:
        os.replace(tmp, folder)
      except OSError:  # Another process saved it first.
        pass
    finally:
      shutil.rmtree(tmp, ignore_errors=True)

  def search(self, query: str, top_k: int = 5) -> list[Hit]:
    """Top-`top_k` articles for `query` with score > 0, best first (empty when no query term is indexed).

    Args:
      query: free text.
      top_k: number of hits wanted, >= 1.
    Returns:
      list of `Hit`, at most `top_k`.
    """
    vocab = self.retriever.vocab_dict
    terms = [t for t in tokenize(query) if t in vocab]
    if not terms:
      return []
    k = min(top_k, len(self.titles))
    docs, scores = self.retriever.retrieve([terms], k=k, show_progress=False, n_threads=1)
    hits = []
    term_set = set(terms)
    for d, s in zip(np.asarray(docs)[0], np.asarray(scores)[0]):
      if s <= 0:
        continue
      title = self.titles[int(d)]
      hits.append(Hit(title=title, score=float(s), snippet=make_snippet(self.corpus.text(title), term_set)))
    return hits


def format_hits(hits: list[Hit]) -> str:
  """`[k] Title: snippet` lines (display titles, 1-based k)."""
  return '\n'.join(f'[{i}] {corpus_lib.display_title(h.title)}: {h.snippet}' for i, h in enumerate(hits, 1))


_LOCK = threading.Lock()


@functools.lru_cache(maxsize=2)
def _index_for(data_dir: str) -> BM25Index:
  return BM25Index(corpus_lib.load_wikispeedia(data_dir))


def get_index(data_dir: str | os.PathLike | None = None) -> BM25Index:
  """The process-wide BM25 index for a data folder (built or loaded on first use, then shared)."""
  from osvl_jax import paths
  root = str(pathlib.Path(data_dir).resolve()) if data_dir is not None else str(paths.data_dir().resolve())
  with _LOCK:
    return _index_for(root)
