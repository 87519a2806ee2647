"""Relation phrases from a link's anchor and sentence, on hand-made sentences (data_pipeline/relations.py)."""

import pytest

from data_pipeline import relations


@pytest.mark.parametrize('sentence, anchor, expected', [
    ('The Taj Mahal was designed by Ustad Ahmad Lahauri.', 'Ustad Ahmad Lahauri', 'designed by'),
    ('Designed by Isambard Kingdom Brunel, it is a landmark.', 'Isambard Kingdom Brunel', 'designed by'),
    ('The bridge was built by the Romans in 40 AD.', 'Romans', 'built by'),
    ('The mausoleum was commissioned by Shah Jahan.', 'Shah Jahan', 'commissioned by'),
    ('The company was founded by Steve Jobs.', 'Steve Jobs', 'founded by'),
    ('Das Kapital is a treatise written by Karl Marx.', 'Karl Marx', 'written by'),
    ('The city is named after Alexander the Great.', 'Alexander the Great', 'named after'),
    ('Einstein was born in Ulm, Germany.', 'Ulm', 'born in'),
    ('Lincoln grew up in Springfield and died in Chicago.', 'Chicago', 'died in'),
    ('Baghdad is located on the Tigris River.', 'Tigris', 'located on'),
    ('The city lies on the banks of the Danube.', 'Danube', 'located on'),
    ('The Taj Mahal is a mausoleum located in Agra, India.', 'Agra', 'located in'),
    ('Cairo is the capital of Egypt.', 'Egypt', 'capital of'),
    ('Vojvodina is now part of Serbia.', 'Serbia', 'part of'),
    ('Ruled by the Habsburgs, the city grew.', 'Habsburgs', 'ruled by'),
    ('BORN IN São Paulo, he moved to Rio.', 'São Paulo', 'born in'),   # case and accents folded
])
def test_relation_read_from_the_words_before_the_anchor(sentence, anchor, expected):
  assert relations.extract(anchor, sentence) == expected


@pytest.mark.parametrize('sentence, anchor', [
    ('Agra is a city in India.', 'India'),                        # no relation phrase
    ('He designed the bridge by the river Thames.', 'Thames'),    # 'designed' not right before the anchor
    ('The Tigris is located on maps of Iraq.', 'Iraq'),           # 'located on' followed by other words
    ('Cairo is the capital of Egypt.', 'Nile'),                   # the anchor is not in the sentence
    ('', 'Egypt'),
])
def test_no_relation_read(sentence, anchor):
  assert relations.extract(anchor, sentence) is None


def test_fallback_by_the_destination_domain_and_references():
  assert relations.relation('India', 'Agra is a city in India.', 'Location') == 'mentioned in'
  assert [relations.fallback(d) for d in ('Person', 'Building-Place', 'Organism', 'Artifact', '', 'Other')] == [
      'named in', 'referred to in', 'described in', 'cited in', 'mentioned in', 'mentioned in']
  assert relations.reference('designed by', 'architect', '{E0}', person=True) == 'the architect who designed {E0}'
  assert relations.reference('located on', 'river', 'Agra') == 'the river that Agra is located on'
  assert relations.reference('located in', 'city', 'the Taj Mahal') == 'the city in which the Taj Mahal is located'
  assert relations.reference('capital of', 'country', 'Cairo') == 'the country whose capital is Cairo'
  assert relations.reference('named in', 'political figure', 'Luftwaffe') == (
      'the political figure named in the article on Luftwaffe')
  with pytest.raises(ValueError, match="relation 'eats'"):
    relations.reference('eats', 'animal', 'X')


def test_mention_sentence_finds_the_first_sentence_naming_a_name():
  text = ('The Taj Mahal is a mausoleum.\nIt stands in Agra,\nIndia. Shah Jahan built it.\n\nAgra lies on the '
          'Yamuna')
  assert relations.mention_sentence(text, ['Agra']) == ('Agra', 'It stands in Agra, India.')
  assert relations.mention_sentence(text, ['Yamuna River', 'Yamuna']) == ('Yamuna', 'Agra lies on the Yamuna')
  assert relations.mention_sentence(text, ['Jahan Shah', 'India']) == ('India', 'It stands in Agra, India.')
  assert relations.mention_sentence(text, ['Taj']) == ('Taj', 'The Taj Mahal is a mausoleum.')
  assert relations.mention_sentence(text, ['Mahal Taj', 'Ag']) == ('', '')  # whole words only
  assert relations.mention_sentence('Built in São Paulo.', ['Sao Paulo']) == ('São Paulo', 'Built in São Paulo.')
