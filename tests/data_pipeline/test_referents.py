"""Eq. 6 (ii) against what the text says, and descriptors that fit, on the real Wikispeedia texts: each flawed
item of issue 25 planted back and refused, and a small build checked hop by hop."""

import re

import pytest

from data_pipeline import classes, ground, mentions, paths, qa, relations, rewrite
from osvl_jax import paths as osvl_paths

# (title, descriptor) pairs a reviewer found wrong in the build before these rules (issue 25).
BAD_DESCRIPTORS = (
    ('Poverty', 'organism'), ('Water', 'weather phenomenon'), ('Royal_Navy', 'military conflict'),
    ('Union_Flag', 'geographic feature'), ('Ottoman_Empire', 'subject of ancient history'),
    ('Falkland_Islands', 'Latin American country'), ('Falkland_Islands', 'country'),
    ('Isle_of_Man', 'place in Britain'), ('Isle_of_Man', 'place in the British Isles'),
    ('Turkey', 'European country'), ('Architecture', 'building'), ('Anthropology', 'people'),
    ('Anthropology', 'ethnic group'), ('Herodotus', 'historian or history book'),
    # issue 51's round-2 review: Gibraltar 'a place in the British Isles' (its category, Geography_of_Great_Britain)
    ('Gibraltar', 'place in the British Isles'), ('Moscow', 'place in the British Isles'),
    ('Stuttgart', 'place in the British Isles'))


@pytest.mark.parametrize('src, dst, winner, counts', [
    # "the chemical element mentioned in the article on the mausoleum": gold 7 times, copper twice.
    ('Taj_Mahal', 'Copper', 'Gold', {'Gold': 7, 'Copper': 2, 'Iron': 1}),
    # "the planet mentioned in the article on the structure": Earth (and 'earth') beside Mars.
    ('Great_Wall_of_China', 'Mars', 'Earth', {'Earth': 14, 'Mars': 2}),
    # "the African place mentioned in the article on the political figure": Ethiopia, Addis Ababa, Libya ...
    ('Benito_Mussolini', 'Tunis', 'Ethiopia', {'Ethiopia': 4, 'Addis_Ababa': 2, 'Libya': 2, 'Tunis': 1}),
])
def test_a_destination_the_text_names_beside_others_of_its_class_is_refused(graph, src, dst, winner, counts):
  assert dst in graph.out_links(src)            # the link table alone would have let the hop through
  d = graph.descriptors(dst)[0]
  found = dict(graph.competitors(src, dst, d))
  assert graph.competitors(src, dst, d)[0][0] == winner
  assert {t: found[t] for t in counts} == counts
  assert graph.referent_check(src, dst) == (None, '', 'another of its class in the text')
  assert paths.check_path(graph, [src, dst]) == 'no unique referent: another of its class in the text'


def test_a_destination_named_far_more_often_than_the_rest_of_its_class_is_the_most_mentioned_one(graph):
  # Gold 7 vs copper 2 in the Taj Mahal's text: "the chemical element mentioned most often in the article on X".
  assert graph.referent_check('Taj_Mahal', 'Gold') == ('chemical element', relations.MOST_OFTEN, '')
  assert relations.reference(relations.MOST_OFTEN, 'chemical element', 'X') == (
      'the chemical element mentioned most often in the article on X')
  from data_pipeline.wiki_graph import dominates
  assert dominates('Gold', [('Gold', 7), ('Copper', 2)]) and not dominates('Gold', [('Gold', 3), ('Copper', 2)])
  assert not dominates('Copper', [('Gold', 7), ('Copper', 2)]) and dominates('Mars', [('Mars', 2)])


@pytest.mark.parametrize('leader, second, holds', [
    (4, 2, True), (3, 1, True), (6, 3, True), (2, 0, True),      # at least twice as often and 2 places more
    (3, 2, False), (2, 1, False), (5, 3, False), (1, 0, False), (3, 3, False),
])
def test_most_often_needs_a_margin_of_twice_the_runner_up_and_two_places(leader, second, holds):
  from data_pipeline import wiki_graph
  assert (wiki_graph.MOST_OFTEN_RATIO, wiki_graph.MOST_OFTEN_LEAD) == (2, 2)
  found = [('A', leader)] + ([('B', second)] if second else [])
  assert wiki_graph.dominates('A', found) is holds
  assert not wiki_graph.dominates('B', found)


def test_every_person_a_text_names_competes_for_the_broad_person_classes(graph):
  # "the political figure named in the article on the structure" (Great Wall -> Mao Zedong): the text also names
  # Qin Shi Huang, the First Emperor, filed as a historical figure only; a US president is a political figure too.
  found = dict(graph.competitors('Great_Wall_of_China', 'Mao_Zedong', 'political figure'))
  assert {t: c for t, c in found.items() if not t.startswith('?')} == {
      'Buddha': 1, 'Confucius': 1, 'Mao_Zedong': 1, 'Neil_Armstrong': 1, 'Qin_Shi_Huang': 1}
  assert found['?Arthur Waldron'] == 1 and found['?Herbert Ponting'] == 2   # no article: unnamed people
  assert graph.referent_check('Great_Wall_of_China', 'Mao_Zedong') == (None, '', 'another of its class in the text')
  assert 'Richard_Nixon' in graph.class_members('political figure')
  # People without an article compete too: Mexico's text names Miguel Hidalgo and Benito Juárez beside Cortés.
  found = dict(graph.competitors('Mexico', 'Hernán_Cortés', 'historical figure'))
  # ('Hidalgo' alone counted too, but not in "the state of Hidalgo": a place)
  assert found['Hernán_Cortés'] == 2 and found['?Miguel Hidalgo'] == 2 and found['?Benito Juárez'] == 2
  assert graph.referent_check('Mexico', 'Hernán_Cortés') == (None, '', 'another of its class in the text')
  assert 'miguel' in graph.given_names and 'the' not in graph.given_names
  # "the mathematician named in the article on the tower" (Pisa -> Archimedes): the text names Galileo too.
  assert dict(graph.competitors('Leaning_Tower_of_Pisa', 'Archimedes', 'mathematician')) == {
      'Archimedes': 1, 'Galileo_Galilei': 2}   # 'Galileo Galilei' and 'Galileo' alone
  assert 'Albert_Einstein' in graph.class_members('scientist') and 'Earth' in graph.class_members('astronomical object')


def test_unnamed_people_are_given_name_pairs_that_are_no_article():
  index = mentions.alias_index([('Hernán_Cortés', ('Hernán Cortés',)), ('Mexico_City', ('Mexico City',))])
  text = 'Miguel Hidalgo rose; Hernán Cortés came to Mexico City. Miguel Hidalgo again, and Francisco I. Madero.'
  assert mentions.unnamed_people(text, frozenset({'miguel', 'hernan', 'francisco', 'mexico'}), index) == {
      'Miguel Hidalgo': 2, 'Francisco I. Madero': 1}


def test_mention_counts_give_each_place_to_the_longest_name():
  index = mentions.alias_index([('Mexico', ('Mexico',)), ('New_Mexico', ('New Mexico',)),
                                ('Georgia_(country)', ('Georgia (country)', 'Georgia')),
                                ('Georgia_(U.S._state)', ('Georgia (U.S. state)', 'Georgia'))])
  text = 'Mexico borders New Mexico. MEXICO again; Georgia too.'
  assert mentions.mention_counts(text, index) == {
      'Mexico': 2, 'New_Mexico': 1, 'Georgia_(country)': 1, 'Georgia_(U.S._state)': 1}


@pytest.mark.parametrize('title, bad', BAD_DESCRIPTORS)
def test_the_descriptors_a_reviewer_found_wrong_are_never_given(graph, title, bad):
  assert bad not in graph.descriptors(title)


@pytest.mark.parametrize('title, expected', [
    ('Copper', ('chemical element',)), ('Mars', ('planet',)), ('Tunis', ('African place',)),
    ('France', ('European country', 'country')), ('Turkey', ()), ('Falkland_Islands', ()),
    ('Herodotus', ('historian',)), ('Westminster_Abbey', ('building',)), ('Water', ()), ('Royal_Navy', ()),
    ('American_Revolutionary_War', ()), ('Aberdeen', ('place in the British Isles',)),
    ('Carl_Sagan', ('astronomer',)), ('Andrew_Carnegie', ()), ('Nikola_Tesla', ('physicist', 'inventor')),
])
def test_descriptors_need_evidence_that_holds_for_the_entity(graph, title, expected):
  assert graph.descriptors(title) == expected


def test_contested_countries_are_competitors_but_never_described_by_region(graph):
  assert 'European country' not in graph.descriptors('Turkey')
  assert 'Turkey' in graph.class_members('European country') and 'Turkey' in graph.class_members('Asian country')
  assert 'Ethiopia' in graph.class_members('African place')     # a country is a place of its region too
  assert 'Falkland_Islands' in graph.class_members('Latin American country')


def test_no_descriptor_is_x_or_y(graph):
  phrases = [r.phrase for rules in classes.CLASSES.values() for r in rules] + list(classes.REGIONS)
  assert phrases and not [p for p in phrases if ' or ' in p]
  assert not [(t, d) for t in graph.titles for d in graph.descriptors(t) if ' or ' in d]
  assert rewrite.reading_error(['historian or history book'], ['named in']) == "hop 1: an 'X or Y' descriptor"


def test_a_garden_path_or_two_relative_clauses_in_a_hop_is_refused():
  # The old centre-embedded template: "the Asian place that the Middle Eastern place mentioned in ... is located on".
  old = 'the Asian place that {x} is located on'.format(x='{x}')
  assert relations.reading_error(old, '{x}') == 'garden path (the previous reference is embedded, not last)'
  assert relations.reading_error('the river that flows where {x}', '{x}') == 'more than one relative clause in a hop'
  for rel in relations.RELATIONS + (relations.MOST_OFTEN, 'mentioned in'):
    assert relations.reading_error(relations.reference(rel, 'river', '{x}'), '{x}') is None, rel
  assert rewrite.reading_error(['Asian place', 'river'], ['mentioned in', 'located on']) is None


def test_a_small_build_names_every_hop_uniquely_and_caps_answer_chains(graph, small_config):
  """paths -> qa -> rewrite -> ground on 24 real walks; every accepted hop re-counted independently (each class
  member's places, a longer article name winning a place; a person's surname alone counted when it is the short
  form of that person only): the next node is named more often than
  any other entity of its descriptor's class in the previous article (or in the link sentence, for a read relation)."""
  c = small_config.copy_and_resolve_references()
  c.num_items = 24
  recs, counts = paths.sample_paths(graph, c, c.image_dir)
  recs, _ = qa.add_qa(recs, graph, c.seed)
  recs, _ = rewrite.rewrite(recs, graph)
  recs, _ = ground.ground(recs, graph, osvl_paths.data_dir(), c.image_dir)
  ok = [r for r in recs if not r['rejected']]
  assert len(ok) >= 12 and counts['max_items_per_chain'] <= paths.MAX_PER_CHAIN == 2
  chains = [paths.answer_chain(r['path']) for r in ok]
  assert max(chains.count(k) for k in chains) <= 2
  bad = dict(BAD_DESCRIPTORS)
  for r in ok:
    for src, dst, d, rel in zip(r['path'], r['path'][1:], r['descriptors'], r['relations']):
      assert ' or ' not in d and bad.get(dst) != d and d in graph.descriptors(dst)
      text = graph.link(src, dst)[1] if rel in relations.RELATIONS else graph.text(src)
      spans = mentions.mention_spans(text, graph.alias_index)   # a longer name wins ('Papua New Guinea')
      n = {t: _places(graph, text, spans, t) for t in graph.class_members(d) if t != src}
      rivals = {t: k for t, k in n.items() if t != dst and k >= n[dst]}
      assert n[dst] >= 1 and not rivals, (r['path'], src, dst, d, rivals)


def _places(graph, text, spans, title):
  """Places of `text` naming `title`: its full names (`spans`: `mentions.mention_spans` of `text`), and its short
  forms standing alone outside any article's name and beside no other capitalised word ('Taft'; not 'Vincent' of
  'Saint Vincent and the Grenadines')."""
  full = spans.get(title, [])
  named = [ab for t, ss in spans.items() for ab in ss]
  starts = {a for a, _ in full}
  for tok in graph.short_forms.tokens(title):
    if graph.short_forms.people(tok) == [title]:
      starts |= {m.start() for m in re.finditer(r'(?<![\w-])' + re.escape(tok) + r'(?![\w-])', text)
                 if not any(a <= m.start() < b for a, b in full + named)
                 and not re.search(r"[A-Z][\w'’.-]*\s+$", text[max(0, m.start() - 40):m.start()])
                 and not re.match(r'\s+[A-Z]', text[m.end():m.end() + 3])}   # alone: not 'Harrison Pierce'
  return len(starts)


def test_a_capital_of_the_past_is_no_answer(graph):
  # 'Capital  Söğüt (1299-1326)': the Ottoman Empire's first capital, with no alias for Istanbul.
  assert graph.attributes('Ottoman_Empire')['capital']['answer'] == 'Söğüt'
  assert paths.historical(graph, 'Ottoman_Empire', 'capital', 'Capital        Söğüt (1299-1326)') == (
      'a value with a period')
  assert paths.historical(graph, 'Roman_Empire', 'capital', 'Capital Rome') == 'an entity of the past'
  assert paths.answer_attribute(graph, ['Herodotus', 'Ottoman_Empire']) is None
  assert paths.historical(graph, 'Ottoman_Empire', 'currency', 'Currency       Akçe, Kuruş, Lira') == (
      'one of several values')
  assert paths.answer_attribute(graph, ['Moon', 'Neil_Armstrong'])[1]['answer'] == '1930'  # a birth year is kept
  assert paths.answer_attribute(graph, ['Herodotus', 'France'])[1]['answer'] == 'Paris'
  assert paths.historical(graph, 'Herodotus', 'born', 'Born c. 484 BC') is None


def test_a_ship_canal_is_a_canal_a_region_no_place_of_itself_and_two_currencies_no_answer(graph):
  assert graph.descriptors('Panama_Canal')[0] == 'canal'   # 'is a major ship canal': was 'the ship'
  assert 'Latin American place' not in graph.descriptors('Latin_America')
  assert paths.historical(graph, 'Panama', 'currency', 'Currency        Balboa and US Dollar (USD) ( PAB)') == (
      'one of several values')
  assert paths.historical(graph, 'Trinidad_and_Tobago', 'currency', 'Currency  Trinidad and Tobago dollar') is None
