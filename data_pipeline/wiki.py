"""Stage `wiki` (DESIGN.md §7.1): one representation of a Wikipedia link corpus, whatever its source.

Two readers fill it: `wiki_xml.read_pages_articles` (a MediaWiki pages-articles `.xml.bz2` dump, mwxml +
mwparserfromhell) and `wiki_tsv.read_wikispeedia` (the Wikispeedia TSVs behind `tools.corpus`). Both give a
`WikiData`:

  articles   id (= position), title, infobox type, infobox attributes, image refs, categories, disambiguation flag,
             plain text
  redirects  alias -> title of the redirect target (as written; chains are followed when links are resolved)
  links      (src article id, dst title as written, anchor text, the sentence the link sits in)

`resolve_links` dereferences redirects and maps link targets to article ids (links to missing pages are dropped
and counted); `graph.build_csr` turns the (src, dst) id arrays into the CSR link graph. `node_domains` and
`exclusion_mask` give the per-node facts the walks need (`graph.sample_walks`). `save` / `load` write and read
the representation as parquet tables (`articles`, `redirects`, `links`).
"""

import dataclasses
import json
import pathlib
import re

import numpy as np

from data_pipeline import entities

DOMAINS = ('Person', 'Building-Place', 'Location', 'Organism', 'Artifact')  # seed strata (DESIGN.md §7.2)
MAX_REDIRECT_HOPS = 5  # redirect chains longer than this (or cycles) count as missing
# Standard MediaWiki namespace names (English); a title starting with one of them plus ':' is not an article.
NAMESPACES = frozenset((
    'talk user wikipedia wp project file image media mediawiki template help category portal draft module '
    'special book timedtext gadget topic education program').split()) | frozenset(
        f'{n} talk' for n in 'user wikipedia file image mediawiki template help category portal draft module'.split())

# (domain, pattern over a lower-cased infobox type or category leaf with '_' as ' '), first match wins: Person
# before Organism before Building-Place before Artifact before Location (broad geography categories last).
_DOMAIN_RULES = tuple((d, re.compile(p)) for d, p in (
    ('Person', r'\b(person|people|biography|officeholder|writer|scientist|philosopher|artist|royalty|'
               r'monarchs?|presidents?|politicians?|military person|actors?|musical artist|football biography|'
               r'tennis biography|saint|religious biography|births|deaths|figures|composers|critics|explorers|'
               r'inventors|mathematicians|chemists|astronomers|physicists|historians|scientists|philosophers|'
               r'writers|performers|leaders|celebrities|sportspeople)\b'),
    ('Organism', r'\b(taxobox|speciesbox|automatic taxobox|subspeciesbox|organisms?|mammals?|birds?|plants?|'
                 r'insects?|reptiles?|fish|fishes|amphibians?|dinosaurs?|fungi|species|taxa|animals?|dog breed|'
                 r'horse breed|cultivar)\b'),
    ('Building-Place', r'\b(building|buildings|architecture|structures?|church|churches|cathedral|castles?|'
                       r'museums?|bridges?|stadiums?|venue|monuments?|towers?|temples?|palaces?|landmarks?|'
                       r'historic site|religious building|skyscraper|dam|airport|station|lighthouse|'
                       r'world heritage sites?|ancient site|archaeological site)\b'),
    ('Artifact', r'\b(book|books|novels?|film|films|album|albums|songs?|single|ship|ships|aircraft|weapons?|'
                 r'automobile|vehicles?|painting|paintings|artwork|sculptures?|software|video games?|'
                 r'musical instruments?|instrument|spaceflight|spacecraft|locomotives?|rifle|firearm|'
                 r'computing hardware and infrastructure|document|journal|newspaper|publication|game)\b'),
    ('Location', r'\b(settlement|country|countries|u\.s\. state|states of|city|cities|province|provinces|'
                 r'territory|region|regions|river|rivers|lake|lakes|mountain|mountains|island|islands|continent|'
                 r'protected area|national park|body of water|geography|populated places|capitals?|'
                 r'county|counties|municipality|district|antarctica|the planets)\b'),
))
_DISAMBIGUATION = re.compile(r'\(disambiguation\)$|disambiguation', re.I)
_COUNTS = 'reader_counts.json'
_IMAGE_FIELD = re.compile(r'^(image|img|photo|logo|cover)(_?\w*)?$', re.I)  # infobox image parameters
_LIST_TITLE = re.compile(r'^(List|Lists|Index|Outline|Timeline) of[ _]', re.I)


@dataclasses.dataclass
class Article:
  """One article (namespace 0, not a redirect).

  Attributes:
    id: position in `WikiData.articles` (the node id of the link graph).
    title: page title as the source writes it (`Computer accessibility`; Wikispeedia: `Taj_Mahal`).
    infobox_type: the first infobox's template name without `Infobox`, lower-cased (`book`, `u.s. state`,
      `taxobox`), '' when none.
    attributes: that infobox's parameters, name -> cleaned value (markup stripped), non-empty values only.
    images: image file names (infobox image fields first, then `[[File:..]]`), without the namespace prefix.
    categories: category names (`1945 novels`; Wikispeedia: `subject.Countries`).
    disambiguation: the page is a disambiguation page (a `{{disambiguation}}`-family template).
    text: the article's plain text (Wikispeedia: the cleaned plaintext; XML: mwparserfromhell `strip_code()` of
      the body), read by the item stages (mentions, relations) and the oracle expert.
  """
  id: int
  title: str
  infobox_type: str = ''
  attributes: dict = dataclasses.field(default_factory=dict)
  images: list = dataclasses.field(default_factory=list)
  categories: list = dataclasses.field(default_factory=list)
  disambiguation: bool = False
  text: str = ''


@dataclasses.dataclass
class Link:
  """One wikilink as written: src article id, dst title (not yet resolved), anchor text, containing sentence."""
  src: int
  dst: str
  anchor: str = ''
  sentence: str = ''


@dataclasses.dataclass
class WikiData:
  """The common representation (see the module docstring); `counts` holds the reader's counts."""
  articles: list
  redirects: dict
  links: list
  counts: dict = dataclasses.field(default_factory=dict)

  def title_ids(self) -> dict:
    """title -> article id."""
    return {a.title: a.id for a in self.articles}

  def aliases(self, title: str) -> list[str]:
    """Redirect titles whose (dereferenced) target is `title`, sorted."""
    ids = self.title_ids()
    return sorted(a for a, t in self.redirects.items() if resolve_title(t, self.redirects, ids) == title)


def resolve_title(title: str, redirects: dict, ids: dict) -> str | None:
  """Follows redirects from `title` to an article title; None when the chain ends on no article, loops or is
  longer than `MAX_REDIRECT_HOPS`."""
  for _ in range(MAX_REDIRECT_HOPS + 1):
    if title in ids:
      return title
    title = redirects.get(title)
    if title is None:
      return None
  return None


def resolve_links(data: WikiData) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
  """Maps every link's dst title (redirects dereferenced) to an article id.

  Returns:
    (src [L'] int32, dst [L'] int32, kept [L] int64 positions in `data.links` of the resolved links, counts)
    with counts = {'links': L, 'resolved': L', 'via_redirect': ..., 'missing': L - L'}.
  """
  ids = data.title_ids()
  memo = {}
  src, dst, kept = [], [], []
  via = 0
  for i, link in enumerate(data.links):
    t = memo.get(link.dst, 0)
    if t == 0:
      t = memo[link.dst] = resolve_title(link.dst, data.redirects, ids)
    if t is None:
      continue
    via += t != link.dst
    src.append(link.src)
    dst.append(ids[t])
    kept.append(i)
  counts = {'links': len(data.links), 'resolved': len(kept), 'via_redirect': via,
            'missing': len(data.links) - len(kept)}
  return np.asarray(src, np.int32), np.asarray(dst, np.int32), np.asarray(kept, np.int64), counts


def domain_of(infobox_type: str, categories) -> int:
  """Index into `DOMAINS` of an article from its infobox type (tried first) and then its categories; -1 = none.

  Matching is by keyword (`_DOMAIN_RULES`) on the lower-cased infobox type and on each category's last
  `.`-separated segment (Wikispeedia `subject.Science.Biology.Birds` -> `birds`), `_` read as a space.
  """
  texts = [infobox_type.lower()] if infobox_type else []
  texts += [c.rsplit('.', 1)[-1].replace('_', ' ').lower() for c in categories]
  for text in texts:
    for k, (_, pattern) in enumerate(_DOMAIN_RULES):
      if pattern.search(text):
        return DOMAINS.index(_DOMAIN_RULES[k][0])
  return -1


def node_domains(data: WikiData) -> np.ndarray:
  """[N] int8 `domain_of` per article (-1 = no domain)."""
  return np.fromiter((domain_of(a.infobox_type, a.categories) for a in data.articles), np.int8,
                     len(data.articles))


def is_excluded_page(title: str, categories=(), disambiguation: bool = False) -> bool:
  """Pages no walk visits: another namespace, lists / indexes / outlines / timelines, disambiguation pages
  (flag, `(disambiguation)` title or category), and the calendar hubs of `entities.is_excluded` (years,
  decades, centuries, months)."""
  prefix, sep, _ = title.partition(':')
  if sep and prefix.strip().replace('_', ' ').lower() in NAMESPACES:
    return True
  if _LIST_TITLE.match(title) or disambiguation or _DISAMBIGUATION.search(title):
    return True
  if any('disambiguation' in c.lower() for c in categories):
    return True
  return entities.is_excluded(title.replace(' ', '_'))


def exclusion_mask(data: WikiData) -> np.ndarray:
  """[N] bool, True for the articles `is_excluded_page` rules out (computed once per graph)."""
  return np.fromiter((is_excluded_page(a.title, a.categories, a.disambiguation) for a in data.articles), bool,
                     len(data.articles))


def seed_mask(data: WikiData, require_infobox_image: bool) -> np.ndarray:
  """[N] bool: articles that may start a walk besides the in-degree window (DESIGN.md §7.2: infobox + image).

  With `require_infobox_image=True` (XML) the first image must be the infobox's own (an image field of the
  infobox names it: `wiki_xml.infobox` puts those first), not a `[[File:..]]` of the body. With False
  (Wikispeedia: no infobox markup) an image alone qualifies (the landmark articles with a photo, `wiki_tsv`).
  """
  if not require_infobox_image:
    return np.fromiter((bool(a.images) for a in data.articles), bool, len(data.articles))

  def boxed(a):
    first = a.images[0].replace('_', ' ').lower() if a.images else ''
    return bool(a.infobox_type and first) and any(
        _IMAGE_FIELD.match(k) and v.replace('_', ' ').lower().endswith(first) for k, v in a.attributes.items())
  return np.fromiter((boxed(a) for a in data.articles), bool, len(data.articles))


def _schemas():
  import pyarrow as pa
  string = pa.string()
  return {
      'articles': pa.schema([('id', pa.int32()), ('title', string), ('infobox_type', string),
                             ('attributes', pa.list_(pa.struct([('name', string), ('value', string)]))),
                             ('images', pa.list_(string)), ('categories', pa.list_(string)),
                             ('disambiguation', pa.bool_()), ('text', string)]),
      'redirects': pa.schema([('alias', string), ('title', string)]),
      'links': pa.schema([('src', pa.int32()), ('dst', string), ('anchor', string), ('sentence', string)])}


def save(data: WikiData, folder: str | pathlib.Path) -> None:
  """Writes `articles.parquet`, `redirects.parquet`, `links.parquet` and `reader_counts.json` (the reader's
  `counts`) under `folder` (created). Attributes are stored as a list of {name, value} rows (their keys differ
  per article). The parquet files read as HF datasets too: `datasets.load_dataset('parquet', data_files=...)`.
  """
  import pyarrow as pa
  import pyarrow.parquet as pq
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  arts, links, schemas = data.articles, data.links, _schemas()
  columns = {
      'articles': {'id': [a.id for a in arts], 'title': [a.title for a in arts],
                   'infobox_type': [a.infobox_type for a in arts],
                   'attributes': [[{'name': k, 'value': v} for k, v in a.attributes.items()] for a in arts],
                   'images': [list(a.images) for a in arts], 'categories': [list(a.categories) for a in arts],
                   'disambiguation': [a.disambiguation for a in arts], 'text': [a.text for a in arts]},
      'redirects': {'alias': list(data.redirects), 'title': list(data.redirects.values())},
      'links': {'src': np.fromiter((l.src for l in links), np.int32, len(links)), 'dst': [l.dst for l in links],
                'anchor': [l.anchor for l in links], 'sentence': [l.sentence for l in links]}}
  for name, cols in columns.items():
    pq.write_table(pa.Table.from_pydict(cols, schema=schemas[name]), folder / f'{name}.parquet')
  (folder / _COUNTS).write_text(json.dumps(data.counts, indent=1))


def load(folder: str | pathlib.Path) -> WikiData:
  """Reads what `save` wrote.

  Raises:
    FileNotFoundError: naming the missing `articles`, `redirects` or `links` parquet file.
  """
  import pyarrow.parquet as pq
  folder = pathlib.Path(folder)
  tables = {}
  for name in ('articles', 'redirects', 'links'):
    path = folder / f'{name}.parquet'
    if not path.is_file():
      raise FileNotFoundError(f'{path}: no saved wiki {name} (data_pipeline.wiki.save)')
    tables[name] = pq.read_table(path).to_pydict()
  arts, red, lk = tables['articles'], tables['redirects'], tables['links']
  if 'text' not in arts:  # saved before article texts were kept: every walk would find no usable node
    raise ValueError(f'{folder}: a wiki stage saved before article texts were kept (no text column); delete this '
                     'folder (and the stages after it) to rebuild it')
  texts = arts['text']
  articles = [Article(id=i, title=t, infobox_type=ib, attributes={x['name']: x['value'] for x in at},
                      images=im, categories=ca, disambiguation=di, text=tx)
              for i, t, ib, at, im, ca, di, tx in zip(arts['id'], arts['title'], arts['infobox_type'],
                                                      arts['attributes'], arts['images'], arts['categories'],
                                                      arts['disambiguation'], texts)]
  links = [Link(*row) for row in zip(lk['src'], lk['dst'], lk['anchor'], lk['sentence'])]
  counts_path = folder / _COUNTS
  counts = json.loads(counts_path.read_text()) if counts_path.is_file() else {}
  return WikiData(articles, dict(zip(red['alias'], red['title'])), links, counts)


def check_source(source, field: str = 'data.source') -> None:
  """Raises ValueError (naming `field`) unless `source` is 'wikispeedia' or an existing `.bz2` file."""
  if source == 'wikispeedia':
    return
  path = pathlib.Path(str(source))
  if not isinstance(source, str) or not path.is_file() or not path.name.endswith('.bz2'):
    raise ValueError(f"{field}={source!r}: expected 'wikispeedia' or the path of an existing pages-articles "
                     '.xml.bz2 file')


def read_source(source: str, data_dir: str | pathlib.Path | None = None) -> WikiData:
  """Reads `source`: 'wikispeedia' (the TSVs under `data_dir`) or the path of a pages-articles `.xml.bz2`.

  Raises:
    ValueError: from `check_source`, or a file that is not a pages-articles dump.
  """
  check_source(source)
  if source == 'wikispeedia':
    from data_pipeline import wiki_tsv
    return wiki_tsv.read_wikispeedia(data_dir)
  from data_pipeline import wiki_xml
  return wiki_xml.read_pages_articles(source)


def build_stage(source: str, hub_in_degree: int, folder: pathlib.Path, data_dir: pathlib.Path) -> dict:
  """The pipeline's stage `wiki`: reads `source` (`read_source`), resolves the links, builds the CSR graph, writes
  both under `folder` (a temp folder made the finished split once on disk, `pipeline_data.publish_split`); skipped
  when `folder` holds it.

  Returns:
    counts: {'read', 'links', 'graph' (build_csr counts), 'hubs' (in-degree > hub_in_degree), 'excluded',
    'domains' (articles per domain, 'none' = no domain), 'seconds', 'resumed'}.
  """
  import shutil
  import time
  from data_pipeline import graph as graph_lib
  from osvl_jax.data import pipeline as pipeline_data
  if pipeline_data.has_split(folder):
    return dict(json.loads((folder / pipeline_data.COUNTS_FILE).read_text()), resumed=True)
  t0 = time.perf_counter()
  data = read_source(source, data_dir)
  src, dst, _, link_counts = resolve_links(data)
  csr, csr_counts = graph_lib.build_csr(src, dst, len(data.articles))
  domains = node_domains(data)
  counts = {'read': data.counts, 'links': link_counts, 'graph': csr_counts,
            'hubs': int((np.asarray(csr.in_degree) > hub_in_degree).sum()),
            'excluded': int(exclusion_mask(data).sum()),
            'domains': {name: int((domains == k).sum()) for k, name in enumerate(DOMAINS)}
            | {'none': int((domains < 0).sum())}}
  tmp = folder.with_name(folder.name + '.tmp')
  shutil.rmtree(tmp, ignore_errors=True)
  save(data, tmp)
  graph_lib.save_csr(csr, tmp / 'graph')
  counts = dict(counts, seconds=round(time.perf_counter() - t0, 2), resumed=False)
  pipeline_data.publish_split(tmp, folder, counts)
  return counts
