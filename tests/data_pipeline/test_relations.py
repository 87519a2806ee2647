"""Relation phrases from a link's anchor and sentence, on hand-made sentences (data_pipeline/relations.py)."""

import pytest

from data_pipeline import relations


@pytest.mark.parametrize('sentence, anchor, subject, expected', [
    ('The Taj Mahal was designed by Ustad Ahmad Lahauri.', 'Ustad Ahmad Lahauri', 'Taj Mahal', 'designed by'),
    ('Designed by Isambard Kingdom Brunel, it is a landmark.', 'Isambard Kingdom Brunel', 'Clifton Bridge',
     'designed by'),
    ('The bridge was built by the Romans in 40 AD.', 'Romans', 'Pont du Gard', 'built by'),
    ('The mausoleum was commissioned by Shah Jahan.', 'Shah Jahan', 'Taj Mahal', 'commissioned by'),
    ('The company was founded by Steve Jobs.', 'Steve Jobs', 'Apple Inc.', 'founded by'),
    ('Das Kapital is a treatise written by Karl Marx.', 'Karl Marx', 'Das Kapital', 'written by'),
    ('The city is named after Alexander the Great.', 'Alexander the Great', 'Alexandria', 'named after'),
    ('Einstein was born in Ulm, Germany.', 'Ulm', 'Albert Einstein', 'born in'),   # a word of the subject's name
    ('Lincoln died in Chicago.', 'Chicago', 'Abraham Lincoln', 'died in'),
    ('Baghdad is located on the Tigris River.', 'Tigris', 'Baghdad', 'located on'),
    ('The city lies on the banks of the Danube.', 'Danube', 'Vienna', 'located on'),
    ('The Taj Mahal is a mausoleum located in Agra, India.', 'Agra', 'Taj Mahal', 'located in'),
    ('Cairo is the capital of Egypt.', 'Egypt', 'Cairo', 'capital of'),
    ('Vojvodina is part of Serbia.', 'Serbia', 'Vojvodina', 'part of'),
    ('Ruled by the Habsburgs, the city grew.', 'Habsburgs', 'Vienna', 'ruled by'),
    ('BORN IN São Paulo, he moved to Rio.', 'São Paulo', 'Pelé', 'born in'),   # case and accents folded
    # Wikispeedia, Milan -> Western_Roman_Empire: the clause after the last comma is about 'the city'.
    ('In the 4th century, at the time of the bishop Saint Ambrose and Emperor Theodosius I, the city was briefly '
     'the capital of the Western Roman Empire.', 'Western Roman Empire', 'Milan', 'capital of'),
])
def test_relation_read_from_the_words_before_the_anchor(sentence, anchor, subject, expected):
  domain = 'Person' if expected in ('born in', 'died in') else 'Location'
  assert relations.extract(anchor, sentence, (subject,), domain) == expected


@pytest.mark.parametrize('sentence, anchor, subject, domain', [
    ('Agra is a city in India.', 'India', 'Agra', 'Location'),                     # no relation phrase
    ('He designed the bridge by the river Thames.', 'Thames', 'Brunel', 'Person'),  # 'designed' not right before
    ('The Tigris is located on maps of Iraq.', 'Iraq', 'Tigris', 'Location'),    # 'located on' then other words
    ('Cairo is the capital of Egypt.', 'Nile', 'Cairo', 'Location'),              # the anchor is not there
    ('', 'Egypt', 'Cairo', 'Location'),
    # The four false relations of the Wikispeedia build (the clause is about another entity):
    # Hernán_Cortés -> Ottoman_Empire ('which' after a comma; and a person is not 'part of' anything).
    ('The emperor finally permitted Cortés to join the great expedition against Algiers in 1541, which was then '
     'part of the Ottoman Empire.', 'Ottoman Empire', 'Hernán Cortés', 'Person'),
    # Madagascar -> Tanzania (the clause after '(' starts with 'now').
    ('The British accepted a French protectorate over Madagascar in return for control over Zanzibar (now part of '
     'Tanzania) and as part of an overall definition.', 'Tanzania', 'Madagascar', 'Location'),
    # Iron -> Georgia_(country) (the clause starts with 'but', not with the subject).
    ('Such as the Khaldi (Chaldei) and the Khalib (Chalybes)[very likely the same people mentioned above - but '
     'erroneously located in Georgia, instead!', 'Georgia', 'Iron', ''),
    # Glacier -> Andes ('that part of'; other capitalised names before it).
    ("This occurs today in Antarctica's Dry Valleys and in that part of the Andes between 19°S and 27°S.", 'Andes',
     'Glacier', 'Location'),
    ('Lincoln grew up in Springfield and died in Chicago.', 'Chicago', 'Abraham Lincoln', 'Person'),  # other name
    ('Algiers, ruled by the Ottomans, was a base.', 'Ottomans', 'Barbarossa', 'Person'),  # participle on another
])
def test_no_relation_read(sentence, anchor, subject, domain):
  assert relations.extract(anchor, sentence, (subject,), domain) is None


def test_relation_checks_the_subject_domain():
  """A relation that cannot hold for v(i-1)'s domain is not read, even in a clause about it."""
  assert relations.extract('Tanzania', 'Zanzibar is part of Tanzania.', ('Zanzibar',), 'Location') == 'part of'
  assert relations.extract('Tanzania', 'The lion is part of Tanzania.', ('Lion',), 'Organism') is None
  assert relations.extract('Ulm', 'Einstein is located in Ulm.', ('Albert Einstein',), 'Person') is None
  assert relations.extract('Ulm', 'The bridge was born in Ulm.', ('Ulm Bridge',), 'Building-Place') is None
  assert relations.relation('Tanzania', 'The lion is part of Tanzania.', 'Location', ('Lion',), 'Organism') == (
      'mentioned in')


def test_fallback_by_the_destination_domain_and_references():
  assert relations.relation('India', 'Agra is a city in India.', 'Location') == 'mentioned in'
  assert [relations.fallback(d) for d in ('Person', 'Building-Place', 'Organism', 'Artifact', '', 'Other')] == [
      'named in', 'referred to in', 'described in', 'cited in', 'mentioned in', 'mentioned in']
  assert relations.reference('designed by', 'architect', '{E0}', person=True) == 'the architect who designed {E0}'
  assert relations.reference('located on', 'river', 'Agra') == 'the river on which lies Agra'
  assert relations.reference('located in', 'city', 'the Taj Mahal') == 'the city containing the Taj Mahal'
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
