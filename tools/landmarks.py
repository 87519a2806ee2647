"""The landmark photos in `images/landmarks/` (25 CC0 / PD thumbnails, 264x264) and their Wikispeedia articles.

Every photo has a display name (from `image-credits.md`). `LANDMARK_ARTICLES` maps a file stem to the
Wikispeedia article about that landmark, only where one exists (each title checked against articles.tsv,
see tests/tools/test_landmarks.py). Two entries point to the article that covers the landmark as a part:
`big-ben` -> `Palace_of_Westminster` (Big Ben is its clock tower; the article names it 4 times) and
`great-sphinx` -> `Giza_pyramid_complex`; `moai-statues` -> `Easter_Island` and `toronto-skyline` -> `Toronto`
as the brief asks. Landmarks without an article of their own but inside a city that has one are in
`LANDMARK_RELATED` (e.g. `eiffel-tower` -> `Paris`); the image_search tool states that relation explicitly
instead of passing the city off as the landmark.
"""

# File stem -> display name (image-credits.md titles, shortened).
LANDMARK_NAMES: dict[str, str] = {
    'big-ben': 'Big Ben',
    'burj-al-arab': 'Burj Al Arab',
    'colloseum': 'Colosseum',
    'eiffel-tower': 'Eiffel Tower',
    'floating-market-vietnam': 'Floating market, Vietnam',
    'grand-canyon': 'Grand Canyon',
    'great-pyramid-of-khufu': 'Great Pyramid of Khufu',
    'great-sphinx': 'Great Sphinx of Giza',
    'great-wall': 'Great Wall of China',
    'leaning-tower-of-pisa': 'Leaning Tower of Pisa',
    'machu-picchu': 'Machu Picchu',
    'moai-statues': 'Moai statues',
    'niagara-falls': 'Niagara Falls',
    'pasabag': 'Paşabağ',
    'st-basils-cathedral': "St. Basil's Cathedral",
    'statue-of-liberty': 'Statue of Liberty',
    'stonehenge': 'Stonehenge',
    'sukhoi-superjet-100': 'Sukhoi Superjet 100',
    'sydney-opera-house': 'Sydney Opera House',
    'table-mountain': 'Table Mountain',
    'taj-mahal': 'Taj Mahal',
    'toronto-skyline': 'Toronto skyline',
    'tower-sunset': 'Tower at sunset',
    'train-e-usa': 'Seaboard express passenger train',
    'two-windmills': 'Two windmills, Holland',
}

# File stem -> Wikispeedia article about the landmark (only those that exist in articles.tsv).
LANDMARK_ARTICLES: dict[str, str] = {
    'big-ben': 'Palace_of_Westminster',
    'grand-canyon': 'Grand_Canyon',
    'great-pyramid-of-khufu': 'Great_Pyramid_of_Giza',
    'great-sphinx': 'Giza_pyramid_complex',
    'great-wall': 'Great_Wall_of_China',
    'leaning-tower-of-pisa': 'Leaning_Tower_of_Pisa',
    'machu-picchu': 'Machu_Picchu',
    'moai-statues': 'Easter_Island',
    'niagara-falls': 'Niagara_Falls',
    'stonehenge': 'Stonehenge',
    'taj-mahal': 'Taj_Mahal',
    'toronto-skyline': 'Toronto',
}

# File stem -> article of the city / country the landmark stands in, for landmarks without their own article.
LANDMARK_RELATED: dict[str, str] = {
    'burj-al-arab': 'Dubai',
    'colloseum': 'Rome',
    'eiffel-tower': 'Paris',
    'floating-market-vietnam': 'Vietnam',
    'st-basils-cathedral': 'Moscow',
    'statue-of-liberty': 'New_York_City',
    'sydney-opera-house': 'Sydney',
    'table-mountain': 'Cape_Town',
}
