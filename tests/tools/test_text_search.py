"""tools/text_search.py: BM25 over the real Wikispeedia plaintext."""

import re

from tools import text_search


def test_taj_mahal_query_ranks_taj_mahal_first():
  hits = text_search.get_index().search('Taj Mahal Agra mausoleum', top_k=5)
  assert len(hits) == 5
  assert hits[0].title == 'Taj_Mahal'
  assert [h.score for h in hits] == sorted([h.score for h in hits], reverse=True)
  assert 'mausoleum' in hits[0].snippet.lower()


def test_descriptive_queries_find_the_landmark_article():
  index = text_search.get_index()
  assert index.search('Mughal emperor wife tomb white marble', 3)[0].title == 'Taj_Mahal'
  assert index.search('Leaning Tower', 3)[0].title == 'Leaning_Tower_of_Pisa'
  assert 'Easter_Island' in [h.title for h in index.search('moai statues Rapa Nui', 3)]
  assert index.search('Taj_Mahal', 1)[0].title == 'Taj_Mahal'  # Underscores split like spaces.


def test_unknown_words_give_no_hits():
  assert text_search.get_index().search('xyzzyqqq blorfnik', 5) == []
  assert text_search.get_index().search('the of and', 5) == []


def test_format_hits_is_numbered_title_colon_snippet():
  text = text_search.format_hits(text_search.get_index().search('Great Wall Ming', 2))
  lines = text.split('\n')
  assert len(lines) == 2
  assert all(re.match(r'^\[\d\] [^:]+: \S', line) for line in lines)
  assert lines[0].startswith('[1] ')


def test_snippet_is_window_around_query_terms():
  text = ' '.join(f'w{i}' for i in range(100)) + ' the pyramids of giza ' + ' '.join(f'v{i}' for i in range(100))
  snip = text_search.make_snippet(text, set(text_search.tokenize('pyramid giza')), num_words=10)
  assert snip.startswith('... ') and snip.endswith(' ...')
  assert 'pyramids of giza' in snip
  assert text_search.make_snippet('a b c', {'zzz'}) == 'a b c'


def test_tokenize_lowercases_drops_stopwords_and_stems_plurals():
  assert text_search.tokenize('The Cities of Easter_Island statues') == ['city', 'easter', 'island', 'statue']
