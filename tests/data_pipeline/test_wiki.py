"""The `wiki` stage readers on real dumps: every expected value below was read by hand from the files
(`bzcat <file> | less`, `grep` on the TSVs), not produced by the code under test."""

import bz2

import numpy as np
import pytest

from data_pipeline import graph, wiki, wiki_tsv, wiki_xml
from osvl_jax import paths as osvl_paths

WIKI_DIR = osvl_paths.data_dir() / 'wikipedia'
SAMPLE = WIKI_DIR / 'wikipedia2vec' / 'enwiki-pages-articles-sample.xml.bz2'
GENSIM = WIKI_DIR / 'gensim' / 'enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2'


@pytest.fixture(scope='module')
def sample():
  return wiki_xml.read_pages_articles(SAMPLE)


@pytest.fixture(scope='module')
def gensim_head():
  # The first 124 namespace-0 pages of the 2016 dump excerpt: 45 articles (Animal Farm, Ayn Rand, ...) + 79
  # redirects. Parsing all 206 pages takes ~10 s; this head holds every page the tests read.
  return wiki_xml.read_pages_articles(GENSIM, max_pages=124)


def _article(data, title):
  (art,) = [a for a in data.articles if a.title == title]
  return art


def test_sample_pages_redirect_and_counts(sample):
  # 3 pages: AccessibleComputing (#REDIRECT [[Computer accessibility]]), Computer accessibility, Accessibility.
  assert sample.counts == {'pages': 3, 'articles': 2, 'redirects': 1, 'other_namespaces': 0, 'links': 303}
  assert [a.title for a in sample.articles] == ['Computer accessibility', 'Accessibility']
  assert sample.redirects == {'AccessibleComputing': 'Computer accessibility'}
  assert sample.aliases('Computer accessibility') == ['AccessibleComputing']
  assert sample.aliases('Accessibility') == []


def test_sample_links_anchor_and_sentence(sample):
  art = _article(sample, 'Computer accessibility')
  links = [(l.dst, l.anchor) for l in sample.links if l.src == art.id]
  # Piped links: [[Cognitive disabilities|Cognitive impairments]], [[Learning disability|learning disabilities]];
  # a fragment dropped: [[Screen reader#Accessibility APIs|accessibility API]]; a link trail: [[Typeface|font]]s.
  for pair in [('Cognitive disabilities', 'Cognitive impairments'), ('Learning disability', 'learning disabilities'),
               ('Screen reader', 'accessibility API'), ('Typeface', 'fonts'),
               ('Color blindness', 'colour-blindness'),
               ('Human–computer interaction', 'human–computer interaction')]:
    assert pair in links
  first = next(l for l in sample.links if l.src == art.id)
  assert first.dst == 'Human–computer interaction'
  assert first.sentence == ('In human–computer interaction, computer accessibility (also known as Accessible '
                            'computing) refers to the accessibility of a computer system to all people, regardless '
                            'of disability or severity of impairment.')
  colour = next(l for l in sample.links if l.anchor == 'colour-blindness')
  assert colour.sentence == 'About 8% of people, mostly males, suffer from some form of colour-blindness.'
  # Inside a thumbnail caption: kept as a link, no sentence.
  assert ('BBC News', 'BBC News', '') in [(l.dst, l.anchor, l.sentence) for l in sample.links]


def test_sample_images_categories_no_infobox(sample):
  art = _article(sample, 'Computer accessibility')
  assert art.images[:2] == ['BBC News web accessibility demo.jpg', 'Single switch onscreen keyboard.jpg']
  assert art.categories == ['Computer accessibility']  # [[Category:Computer accessibility| ]]
  assert (art.infobox_type, art.attributes) == ('', {})  # this fixture page has no {{Infobox}}
  acc = _article(sample, 'Accessibility')
  assert acc.categories == ['Accessibility', 'Ergonomics', 'Transportation planning',
                            'Urban studies and planning terminology', 'Urban design']


def test_sample_resolution_counts_missing(sample):
  src, dst, kept, counts = wiki.resolve_links(sample)
  # Only two links point inside the file: [[accessibility]] (Computer accessibility -> Accessibility) and the
  # "See also" [[Computer accessibility]] on Accessibility; the other 301 targets are missing pages.
  assert counts == {'links': 303, 'resolved': 2, 'via_redirect': 0, 'missing': 301}
  assert src.tolist() == [0, 1] and dst.tolist() == [1, 0]
  assert sample.links[kept[0]].anchor == 'accessibility'


def test_gensim_infobox_type_attributes_images(gensim_head):
  art = _article(gensim_head, 'Animal Farm')
  assert art.infobox_type == 'book'  # {{Infobox book
  assert art.attributes['author'] == 'George Orwell'  # | author = [[George Orwell]]
  assert art.attributes['published'] == '17 August 1945 (Secker and Warburg, London, England)'
  assert art.attributes['pages'] == '112 (UK paperback edition)'  # the <!-- comment --> dropped
  assert 'illustrator' not in art.attributes  # empty value
  assert art.images[0] == 'Animal Farm - 1st edition.jpg'  # | image = Animal Farm - 1st edition.jpg
  assert art.categories[:2] == ['1945 novels', 'Allegory']
  assert wiki.DOMAINS[wiki.domain_of(art.infobox_type, art.categories)] == 'Artifact'
  assert gensim_head.aliases('Ayn Rand') == ['AynRand']  # <title>AynRand</title> <redirect title="Ayn Rand" />
  assert _article(gensim_head, 'Ayn Rand').attributes['birth_place'] == 'St. Petersburg, Russia'
  # {{Infobox writer}} -> Person; {{Automatic taxobox}} -> Organism.
  assert wiki.domain_of(_article(gensim_head, 'Ayn Rand').infobox_type, []) == wiki.DOMAINS.index('Person')


def test_gensim_disambiguation_pages_excluded(gensim_head):
  for title in ('Austin (disambiguation)', 'Aberdeen (disambiguation)', 'Ada'):
    art = _article(gensim_head, title)
    assert art.disambiguation
  mask = wiki.exclusion_mask(gensim_head)
  assert mask[_article(gensim_head, 'Ada').id] and not mask[_article(gensim_head, 'Animal Farm').id]


def test_resolve_links_dereferences_redirect_chains():
  arts = [wiki.Article(0, 'A'), wiki.Article(1, 'B')]
  redirects = {'B1': 'B', 'B2': 'B1', 'Loop1': 'Loop2', 'Loop2': 'Loop1', 'Gone': 'Nowhere'}
  links = [wiki.Link(0, 'B'), wiki.Link(0, 'B2'), wiki.Link(1, 'Loop1'), wiki.Link(1, 'Gone'),
           wiki.Link(1, 'A'), wiki.Link(1, 'Missing')]
  data = wiki.WikiData(arts, redirects, links)
  src, dst, kept, counts = wiki.resolve_links(data)
  assert src.tolist() == [0, 0, 1] and dst.tolist() == [1, 1, 0] and kept.tolist() == [0, 1, 4]
  assert counts == {'links': 6, 'resolved': 3, 'via_redirect': 1, 'missing': 3}
  assert data.aliases('B') == ['B1', 'B2']


def test_parse_article_disambiguation_and_namespaces():
  got = wiki_xml.parse_article("'''Mercury''' may refer to:\n* [[Mercury (planet)]]\n* [[fr:Mercure]]\n"
                               '* [[Wikipedia:Disambiguation|x]]\n[[Category:Planets]]\n{{disambiguation}}')
  assert got['disambiguation'] and got['categories'] == ['Planets']
  assert [l[0] for l in got['links']] == ['Mercury (planet)']


@pytest.mark.parametrize('title, excluded', [
    ('List of Prison Break characters', True), ('Mercury (disambiguation)', True), ('Category:Planets', True),
    ('Wikipedia talk:Sandbox', True), ('1990s', True), ('January', True), ('Taj_Mahal', False),
    ('Star Wars: Episode IV – A New Hope', False), ('Animal Farm', False)])
def test_is_excluded_page(title, excluded):
  assert wiki.is_excluded_page(title) == excluded


@pytest.mark.parametrize('infobox, categories, domain', [
    ('officeholder', [], 'Person'), ('', ['subject.People.USA_Presidents'], 'Person'),
    ('', ['subject.Science.Biology.Birds'], 'Organism'), ('automatic taxobox', [], 'Organism'),
    ('', ['subject.Design_and_Technology.Architecture'], 'Building-Place'), ('stadium', [], 'Building-Place'),
    ('', ['subject.Countries'], 'Location'), ('u.s. state', [], 'Location'),
    ('', ['1945 novels'], 'Artifact'), ('film', ['American films'], 'Artifact'),
    ('', ['Organizations based in the United States'], None), ('', [], None)])
def test_domain_of(infobox, categories, domain):
  got = wiki.domain_of(infobox, categories)
  assert (wiki.DOMAINS[got] if got >= 0 else None) == domain


def test_wikispeedia_tsv_same_representation():
  data = wiki_tsv.read_wikispeedia()
  # Hand counts: `grep -v '^#' articles.tsv | grep -c .` = 4,598; links.tsv the same way = 119,879 (the data
  # README's 4,604 / 119,880 are the SNAP announcement's figures), 110 of them self-links (`awk '$1==$2'`).
  assert data.counts == {'articles': 4598, 'redirects': 0, 'links': 119879}
  ids = data.title_ids()
  assert data.articles[ids['Taj_Mahal']].categories == [
      'subject.Design_and_Technology.Architecture', 'subject.Geography.Geography_of_Asia']
  src, dst, _, counts = wiki.resolve_links(data)
  assert counts['missing'] == 0 and counts['resolved'] == 119879
  g, gc = graph.build_csr(src, dst, len(data.articles))
  assert gc == {'nodes': 4598, 'edges_in': 119879, 'self_loops': 110, 'duplicates': 0, 'edges': 119769}
  assert g.in_degree[ids['United_States']] == 1551  # grep -c $'\tUnited_States$' links.tsv
  taj = g.neighbors(ids['Taj_Mahal'])
  assert len(taj) == 48  # grep -c $'^Taj_Mahal\t' links.tsv
  assert ids['Akbar'] in taj and ids['Babur'] in taj
  assert not np.any(wiki.exclusion_mask(data)[[ids['Taj_Mahal'], ids['United_States']]])


def test_save_load_round_trip(sample, tmp_path):
  wiki.save(sample, tmp_path / 'wiki')
  back = wiki.load(tmp_path / 'wiki')
  assert back.articles == sample.articles and back.redirects == sample.redirects
  assert back.links == sample.links and back.counts == sample.counts


def test_bad_inputs_named(tmp_path):
  with pytest.raises(ValueError, match='data.source=.*nope.xml.bz2'):
    wiki.read_source(str(tmp_path / 'nope.xml.bz2'))
  bad = tmp_path / 'bad.xml.bz2'
  bad.write_bytes(bz2.compress(b'this is not xml'))
  with pytest.raises(ValueError, match='bad.xml.bz2'):
    wiki_xml.read_pages_articles(bad)
  plain = tmp_path / 'plain.xml.bz2'
  plain.write_bytes(b'<mediawiki/> not compressed')
  with pytest.raises(ValueError, match='plain.xml.bz2'):
    wiki_xml.read_pages_articles(plain)
  with pytest.raises(FileNotFoundError, match='articles.parquet'):
    wiki.load(tmp_path)


def test_a_wiki_folder_saved_without_texts_is_refused_by_name(sample, tmp_path):
  """A folder from before texts were kept would give 0 usable nodes silently; it is refused, naming the folder."""
  import pyarrow.parquet as pq
  folder = tmp_path / 'wiki'
  wiki.save(sample, folder)
  table = pq.read_table(folder / 'articles.parquet')
  pq.write_table(table.drop(['text']), folder / 'articles.parquet')
  with pytest.raises(ValueError, match=f'{folder}.*no text column'):
    wiki.load(folder)
