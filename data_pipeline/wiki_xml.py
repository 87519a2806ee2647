"""Reader of MediaWiki pages-articles XML dumps (`enwiki-*-pages-articles*.xml.bz2`) into `wiki.WikiData`.

The dump is streamed page by page (`mwxml.Dump` over `bz2.open`), so memory holds one page's wikitext at a time
plus the growing tables. Namespace 0 only; a page with `<redirect title=..>` becomes an alias. Each article's
wikitext is parsed with mwparserfromhell:
  * wikilinks (also those inside templates, tables, refs and image captions): target normalised as MediaWiki
    does (fragment dropped, `_` -> space, first letter upper-cased), anchor = the displayed text (plus a link
    trail: `[[Typeface|font]]s` -> `fonts`), sentence = the sentence of the article's running text that holds
    it ('' for links inside templates, tags such as refs and tables, or captions);
  * the first `{{Infobox ...}}` (or taxobox/speciesbox) template: its type and its parameters, values cleaned
    (`strip_code`, refs and comments dropped, `<br>` -> ', ');
  * image refs: infobox image fields, then `[[File:..]]` / `[[Image:..]]` links;
  * categories from `[[Category:..]]`; disambiguation pages from the `{{disambiguation}}` template family.
"""

import bisect
import bz2
import pathlib
import re
from xml.etree import ElementTree

import mwparserfromhell
import mwxml
from mwxml import errors as mwxml_errors
from mwparserfromhell import nodes as mw_nodes

from data_pipeline import wiki

_INFOBOX_NAMES = re.compile(r'^(infobox\b.*|taxobox|speciesbox|automatic taxobox|subspeciesbox)$', re.I)
_IMAGE_FIELDS = re.compile(r'^(image|img|photo|logo|cover)(_?\w*)?$', re.I)
_IMAGE_FILE = re.compile(r'\.(jpe?g|png|gif|svg|tiff?|webp|xcf|pdf|djvu)$', re.I)
_DISAMBIG_NAMES = frozenset(('disambiguation', 'disambig', 'dab', 'disamb', 'hndis', 'geodis', 'sia',
                             'set index article', 'human name disambiguation', 'place name disambiguation'))
# Interlanguage / interwiki prefixes (`[[fr:Anarchisme]]`, `[[wikt:word]]`): not links to this wiki's pages.
_INTERWIKI = re.compile(r'^([a-z]{2,3}(-[a-z]+)*|simple|wikt|wiktionary|commons|meta|species|wikisource|'
                        r'wikiquote|wikinews|wikibooks|wikiversity|wikivoyage|wikidata|s|q|n|b|v|d|c|m|w)$')
_FILE_NAMESPACES = frozenset(('file', 'image'))
_NO_SENTENCE_TAGS = frozenset(('ref', 'table', 'gallery', 'math', 'references', 'timeline', 'imagemap', 'tr',
                               'td', 'th', 'div', 'noinclude', 'includeonly', 'nowiki', 'pre', 'code',
                               'syntaxhighlight'))
_SENTENCE_END = re.compile(r'(?<=[.!?])["\')\]]*\s+(?=[^a-z\s])|\n+')
_TRAIL = re.compile(r'^[a-z]+')


def normalize_title(raw: str) -> str:
  """MediaWiki title normalisation: `_` -> space, runs of spaces collapsed, first letter upper-cased."""
  title = ' '.join(raw.replace('_', ' ').split())
  return title[:1].upper() + title[1:]


def _split_target(raw: str) -> tuple[str, str]:
  """(namespace prefix lower-cased or '', title) of a link target; a leading ':' (`[[:Category:X]]`) dropped."""
  target = raw.strip().lstrip(':').split('#', 1)[0]
  prefix, sep, rest = target.partition(':')
  if sep:
    p = prefix.strip()
    if p.replace('_', ' ').lower() in wiki.NAMESPACES or _INTERWIKI.match(p):
      return p.replace('_', ' ').lower(), rest.strip()
  return '', target.strip()


def _anchor(link: mw_nodes.Wikilink) -> str:
  text = link.text.strip_code().strip() if link.text is not None else ''
  return ' '.join((text or str(link.title).split('#', 1)[0].lstrip(':')).split())


class _PageParser:
  """Collects the links, images and categories of one article's wikicode."""

  def __init__(self):
    self.links, self.images, self.categories = [], [], []
    self.plain = []  # running text pieces (for sentences)
    self.size = 0    # characters in `plain`
    self.offsets = []  # (index into self.links, offset in plain text) of links in running text

  def _emit(self, text: str) -> None:
    self.plain.append(text)
    self.size += len(text)

  def _add_link(self, link: mw_nodes.Wikilink, in_text: bool, trail: str = '') -> None:
    ns, target = _split_target(str(link.title))
    if ns in _FILE_NAMESPACES:
      if target:
        self.images.append(normalize_title(target))
      if link.text is not None:  # Caption links: no sentence.
        for inner in link.text.filter_wikilinks(recursive=True):
          self._add_link(inner, False)
      return
    if ns == 'category':
      if target:
        self.categories.append(normalize_title(target.split('|', 1)[0]))
      return
    if ns or not target:
      return
    anchor = _anchor(link) + trail
    if in_text:
      self.offsets.append((len(self.links), self.size))
      self._emit(anchor)
    self.links.append([normalize_title(target), anchor, ''])

  def _nested(self, code) -> None:
    """Links inside templates / refs / tables: recorded without a sentence."""
    for link in code.filter_wikilinks(recursive=True):
      self._add_link(link, False)

  def walk(self, nodelist) -> None:
    """Renders `nodelist` (a Wikicode's nodes) to running text, recording links as it goes."""
    skip_trail = 0
    for i, node in enumerate(nodelist):
      if isinstance(node, mw_nodes.Text):
        text = str(node)[skip_trail:]
        skip_trail = 0
        self._emit(text)
      elif isinstance(node, mw_nodes.Wikilink):
        nxt = nodelist[i + 1] if i + 1 < len(nodelist) else None
        m = _TRAIL.match(str(nxt)) if isinstance(nxt, mw_nodes.Text) else None
        trail = m.group(0) if m else ''
        before = len(self.links)
        self._add_link(node, True, trail)
        skip_trail = len(trail) if len(self.links) > before else 0
      elif isinstance(node, mw_nodes.Tag):
        if str(node.tag).lower() in _NO_SENTENCE_TAGS or node.contents is None:
          if node.contents is not None:
            self._nested(node.contents)
        else:
          self.walk(node.contents.nodes)
      elif isinstance(node, mw_nodes.Heading):
        self._emit('\n')
        self._nested(node.title)
        self._emit('\n')
      elif isinstance(node, mw_nodes.Template):
        for param in node.params:
          self._nested(param.value)
      elif isinstance(node, mw_nodes.ExternalLink):
        self._emit(node.title.strip_code() if node.title is not None else '')
      elif isinstance(node, mw_nodes.HTMLEntity):
        self._emit(node.normalize())

  def assign_sentences(self) -> None:
    """Sets each running-text link's sentence (split at . ! ? followed by space, and at line breaks)."""
    text = ''.join(self.plain)
    starts = [0] + [m.end() for m in _SENTENCE_END.finditer(text)]
    for idx, off in self.offsets:
      k = bisect.bisect_right(starts, off) - 1
      end = starts[k + 1] if k + 1 < len(starts) else len(text)
      self.links[idx][2] = ' '.join(text[starts[k]:end].replace("'''", '').replace("''", '').split())


def clean_value(value) -> str:
  """An infobox parameter value as plain text: refs and comments dropped, `<br>` -> ', ', markup stripped
  (`[[George Orwell]]` -> `George Orwell`, templates dropped), whitespace collapsed."""
  text = re.sub(r'<br\s*/?>', ', ', str(value), flags=re.I)
  text = re.sub(r'<ref[^>]*/>|<ref[^>]*>.*?</ref>', '', text, flags=re.I | re.S)
  code = mwparserfromhell.parse(text)
  return ' '.join(code.strip_code(normalize=True, collapse=True).split()).strip(' ,;')


def infobox(code) -> tuple[str, dict, list[str]]:
  """(type, attributes, image file names) of the first infobox template of `code` (Wikicode), else ('', {}, [])."""
  for tpl in code.filter_templates(recursive=True):
    name = ' '.join(tpl.name.strip_code().replace('_', ' ').split())
    if not _INFOBOX_NAMES.match(name):
      continue
    kind = re.sub(r'^infobox\s*', '', name, flags=re.I).lower()
    attrs, images = {}, []
    for param in tpl.params:
      key = ' '.join(str(param.name).split())
      value = clean_value(param.value)
      if value:
        attrs[key] = value
      if _IMAGE_FIELDS.match(key) and not param.value.filter_wikilinks():
        name_only = re.sub(r'^(file|image)\s*:', '', value, flags=re.I).strip()
        if _IMAGE_FILE.search(name_only):
          images.append(normalize_title(name_only))
    return kind, attrs, images
  return '', {}, []


def parse_article(text: str) -> dict:
  """Everything `WikiData` keeps from one article's wikitext.

  Returns:
    {'infobox_type', 'attributes', 'images', 'categories', 'disambiguation',
     'links': [(dst title, anchor, sentence)], 'text' (`plain_text`)}.
  """
  code = mwparserfromhell.parse(text)
  parser = _PageParser()
  parser.walk(code.nodes)
  parser.assign_sentences()
  kind, attrs, box_images = infobox(code)
  disamb = any(' '.join(t.name.strip_code().replace('_', ' ').split()).lower() in _DISAMBIG_NAMES
               for t in code.filter_templates(recursive=False))
  return {'infobox_type': kind, 'attributes': attrs, 'images': list(dict.fromkeys(box_images + parser.images)),
          'categories': list(dict.fromkeys(parser.categories)), 'disambiguation': disamb,
          'links': [tuple(l) for l in parser.links], 'text': plain_text(code)}


def plain_text(code) -> str:
  """The body as plain text: `strip_code(normalize=True, collapse=True)` with refs and templates dropped,
  bold/italic quotes removed, one paragraph per block separated by a blank line (the article text the item
  stages and the oracle read; `relations.mention_sentence` splits sentences at blank lines too)."""
  text = code.strip_code(normalize=True, collapse=True).replace("'''", '').replace("''", '')
  return '\n\n'.join(' '.join(line.split()) for line in text.split('\n') if line.strip())


def read_pages_articles(path: str | pathlib.Path, max_pages: int | None = None) -> wiki.WikiData:
  """Streams a pages-articles `.xml.bz2` dump into a `WikiData` (namespace 0; redirects as aliases).

  Args:
    path: the dump (bz2-compressed MediaWiki export XML).
    max_pages: stop after this many namespace-0 pages (None = all).
  Returns:
    `WikiData` whose counts are {'pages', 'articles', 'redirects', 'other_namespaces', 'links'}.
  Raises:
    FileNotFoundError: `path` does not exist.
    ValueError: `path` is not bz2-compressed MediaWiki XML (the message names the file).
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f'{path}: no such pages-articles dump')
  articles, redirects, links = [], {}, []
  counts = {'pages': 0, 'articles': 0, 'redirects': 0, 'other_namespaces': 0, 'links': 0}
  try:
    with bz2.open(path, 'rb') as f:
      dump = mwxml.Dump.from_file(f)
      for page in dump:
        counts['pages'] += 1
        if page.namespace != 0:
          counts['other_namespaces'] += 1
          continue
        if max_pages is not None and counts['articles'] + counts['redirects'] >= max_pages:
          break
        title = normalize_title(page.title)
        if page.redirect:
          redirects[title] = normalize_title(page.redirect.split('#', 1)[0])
          counts['redirects'] += 1
          continue
        text = ''
        for revision in page:  # pages-articles holds the latest revision only; keep the last one seen.
          text = revision.text or ''
        parsed = parse_article(text)
        art = wiki.Article(id=len(articles), title=title, infobox_type=parsed['infobox_type'],
                           attributes=parsed['attributes'], images=parsed['images'],
                           categories=parsed['categories'], disambiguation=parsed['disambiguation'],
                           text=parsed['text'])
        links.extend(wiki.Link(art.id, *l) for l in parsed['links'])
        articles.append(art)
        counts['articles'] += 1
  except (OSError, EOFError) as e:
    raise ValueError(f'{path}: not a bz2-compressed pages-articles dump ({e})') from e
  except (ElementTree.ParseError, mwxml_errors.MalformedXML) as e:
    raise ValueError(f'{path}: not MediaWiki export XML ({type(e).__name__}: {e})') from e
  counts['links'] = len(links)
  return wiki.WikiData(articles, redirects, links, counts)
