"""Reader of the Wikispeedia TSVs (the corpus `paths.Graph` walks) into `wiki.WikiData`.

Data: `<data_dir>/wikipedia/wikispeedia/{articles,links,categories}.tsv` + plaintext, read by
`tools.corpus.load_wikispeedia` (titles URL-decoded, underscores kept: `Taj_Mahal`). The TSVs carry no wikitext,
so: no redirects, no infobox type, no image refs, links without anchor text or sentence. Attributes are the
infobox facts `entities.infobox_attributes` reads from the plaintext (name -> answer), when `attributes=True`.
Counts (verified on the shipped files): 4,598 articles and 119,879 links (110 of them self-links); the data
README's "4,604 articles, 119,880 links" are the SNAP dataset's announced figures, not these files' rows.
"""

import os

from data_pipeline import entities, wiki


def read_wikispeedia(data_dir: str | os.PathLike | None = None, attributes: bool = False) -> wiki.WikiData:
  """Wikispeedia as a `WikiData` (article ids in articles.tsv order, links in links.tsv order).

  Args:
    data_dir: the shared data folder; default `osvl_jax.paths.data_dir()`.
    attributes: also read the infobox facts from each article's plaintext (~5 s more for 4,598 files; 744 have some).
  Returns:
    `WikiData` with counts {'articles', 'redirects', 'links'}.
  Raises:
    FileNotFoundError: the data folder or one of its files is missing (from `tools.corpus`).
  """
  from tools import corpus as corpus_lib
  corpus = corpus_lib.load_wikispeedia(data_dir)
  articles, links = [], []
  for i, title in enumerate(corpus.titles):
    cats = list(corpus.categories.get(title, []))
    attrs = {}
    if attributes and corpus.has_text(title):
      attrs = {k: v['answer'] for k, v in entities.infobox_attributes(corpus.text(title), cats).items()}
    articles.append(wiki.Article(id=i, title=title, attributes=attrs, categories=cats))
    links.extend(wiki.Link(i, dst) for dst in corpus.links.get(title, []))
  return wiki.WikiData(articles, {}, links, {'articles': len(articles), 'redirects': 0, 'links': len(links)})
