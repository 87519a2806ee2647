"""Reader of the Wikispeedia TSVs (the corpus behind `tools.corpus`) into `wiki.WikiData`.

Data: `<data_dir>/wikipedia/wikispeedia/{articles,links,categories}.tsv` + plaintext, read by
`tools.corpus.load_wikispeedia` (titles URL-decoded, underscores kept: `Taj_Mahal`). The TSVs carry no wikitext,
so: no redirects, no infobox type, no image refs, links without anchor text or sentence (the item stages find
the sentence of the source text that mentions the target, `wiki_graph.WikiGraph.link`). Each article keeps its
cleaned plaintext (`corpus.text`, '' for the 6 titles without a file); the 12 landmark articles that have a
photo under `images/landmarks/` (`tools.landmarks.LANDMARK_ARTICLES`) have it as their image (`taj-mahal.jpg`). Attributes are the
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
  from tools import landmarks
  corpus = corpus_lib.load_wikispeedia(data_dir)
  photos = {t: f'{stem}.jpg' for stem, t in sorted(landmarks.LANDMARK_ARTICLES.items())}
  articles, links = [], []
  for i, title in enumerate(corpus.titles):
    cats = list(corpus.categories.get(title, []))
    attrs = {}
    if attributes and corpus.has_text(title):
      attrs = {k: v['answer'] for k, v in entities.infobox_attributes(corpus.text(title), cats).items()}
    text = corpus.text(title) if corpus.has_text(title) else ''
    articles.append(wiki.Article(id=i, title=title, attributes=attrs, categories=cats, text=text,
                                 images=[photos[title]] if title in photos else []))
    links.extend(wiki.Link(i, dst) for dst in corpus.links.get(title, []))
  return wiki.WikiData(articles, {}, links, {'articles': len(articles), 'redirects': 0, 'links': len(links)})
