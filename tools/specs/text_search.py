"""`text_search{query, top_k=5}` (official: `text_search{q, hl, top_k}`): local BM25 or remote web search.

Backends: `local` (`tools.text_search`, BM25 over Wikispeedia), `remote` (`tools.remote.web_search`: Serper +
Jina reader + optional LLM summary). Nothing found -> `no_result` (ok=True).
"""

import ml_collections

from tools import base
from tools import schema


def _make(cfg: ml_collections.ConfigDict):
  from tools import text_search  # pylint: disable=import-outside-toplevel
  schema.check_backend('text_search', cfg.text_search.backend)

  def body(query: str, top_k: int = 5, hl: str | None = None) -> base.ToolResult:
    if not query.strip():
      raise schema.ArgumentError("argument 'query' is empty")
    if cfg.text_search.backend == 'remote':
      from tools import remote  # pylint: disable=import-outside-toplevel
      text = remote.web_search(cfg.text_search, query, top_k, hl)
      return base.ToolResult(ok=True, text=text) if text else base.error('no_result', f'No results for {query!r}.')
    hits = text_search.get_index(schema.data_dir(cfg)).search(query, top_k)
    if not hits:
      return base.error('no_result', f'No results for {query!r}.')
    return base.ToolResult(ok=True, text=text_search.format_hits(hits))
  return body


SPEC = schema.register(schema.ToolSpec(
    name='text_search',
    description='Web/Wikipedia text search; returns "[k] Title: snippet" lines.',
    params=(
        schema.Param('query', 'string', 'Search keywords.'),
        schema.Param('top_k', 'integer', 'Number of results.', required=False, default=5, minimum=1,
                     maximum=20),
    ),
    make=_make,
    official=schema.OfficialSchema('text_search', (
        schema.Param('q', 'string', 'Search query.'),
        schema.Param('hl', 'string', 'Interface language, e.g. "en".', required=False),
        schema.Param('top_k', 'integer', 'Number of results.', required=False, default=5, minimum=1, maximum=20),
    ), passthrough=('hl',))))
