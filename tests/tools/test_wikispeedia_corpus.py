"""tools/corpus.py on the real Wikispeedia data."""

import os

from tools import corpus as corpus_lib


def test_titles_links_and_categories_are_decoded():
  c = corpus_lib.load_wikispeedia()
  assert len(c.titles) == 4598
  assert sum(len(v) for v in c.links.values()) == 119879
  assert 'Taj_Mahal' in c and 'Éire' in c and 'AT&T' in c
  assert 'Agra' not in c
  assert 'India' in c.links['Taj_Mahal']
  assert c.in_degree['Taj_Mahal'] == sum('Taj_Mahal' in v for v in c.links.values()) > 0
  assert 'subject.Geography.Geography_of_Asia' in c.categories['Taj_Mahal']


def test_text_is_clean_body_of_article():
  c = corpus_lib.load_wikispeedia()
  text = c.text('Taj_Mahal')
  assert 'monument located in Agra, India' in text.replace('\n', ' ')
  assert '#copyright' not in text and 'Schools Wikipedia Selection' not in text
  assert 'Retrieved from' not in text
  assert c.text('AT&T').startswith('AT&T Inc.')
  assert all(c.has_text(t) for t in c.titles)


def test_plaintext_is_extracted_once_into_cache_keyed_by_archive():
  c = corpus_lib.load_wikispeedia()
  folder = c.plaintext_dir.parent
  archive = os.stat(corpus_lib.paths.data_dir() / 'wikipedia/wikispeedia/plaintext_all.tar.xz')
  assert folder.name == f'wikispeedia_plaintext_{archive.st_size}_{int(archive.st_mtime)}'
  assert len(list(c.plaintext_dir.glob('*.txt'))) == 4598
  assert corpus_lib.load_wikispeedia() is c  # Memoised.


def test_clean_plaintext_strips_header_and_footer():
  raw = ('   #copyright\n\nFoo\n\n2007 Schools Wikipedia Selection. Related subjects: Bar\nBaz\n\n'
         '   Foo is a thing.\n   Enlarge\n   More.\n\n   Retrieved from " http://x"\n   licence\n')
  assert corpus_lib.clean_plaintext(raw) == 'Foo is a thing.\nMore.'
