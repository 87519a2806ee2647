"""An entity's class ("the chemical element", "the European country") from evidence that holds for it (§7.4).

Wikispeedia's `categories.tsv` files articles by topic, not by kind: 'Climate_and_the_Weather' holds Water,
'Military_History_and_War' the Royal Navy, 'Architecture' Architecture itself, 'Central_and_South_American_
Countries' the Falkland Islands. A descriptor read off the category alone is then wrong ("the weather phenomenon"
for Water), and a wrong descriptor is worse than none. So each category leaf maps (`CLASSES`, reviewed against
every leaf of categories.tsv and the members of the place and country leaves) to one or more rules, each a
phrase and the evidence it needs:

  * None: the category is a kind ('Birds', 'Chemical_elements', 'The_Planets', 'USA_Presidents'): membership is
    enough;
  * a regex over the head of the article's definition (`definition`: the first sentence "X is a/an/the …", the
    words before its first preposition or relative word): 'military conflict' needs war / battle / siege ...,
    'building' needs building / cathedral / tower ..., 'geographic feature' a landform noun;
  * 'person': a life span in the definition ("(c. 484 BC – c. 425 BC)") or a Born / Died infobox line
    ('historian' vs 'history book' of the old 'historian or history book': one class each, never "X or Y");
  * 'place': a place noun in the head or a Population / Area / Coordinates / Elevation infobox line.

Countries go by real membership, not by the category (`REGIONS`): a sovereign state of the region (reviewed
lists; the Falkland Islands, Anguilla, Hong Kong ... are territories, in no list), with the transcontinental or
disputed ones (Turkey, Russia, Cyprus, Georgia, ...) in no regional class but counted as its competitors
(`REGION_MAYBE`: a reader may take Turkey for a European country, so it can make "the European country
mentioned in X" ambiguous, but is never described so). `NOT_CLASS` lists the members a rule's evidence would admit
but that are not of the class (Isle of Man and the Faroe Islands are no place in Britain; Angkor is in Cambodia,
not Africa).

Classes overlap as a reader reads them: a US president or an emperor is a political figure too, a physicist a
scientist; so every person a text names competes for the broad person classes (`BROAD_PERSON`) and a member of a
narrow class for its `BROADER` ones.

`descriptors` returns the phrases whose evidence holds (abstaining when none does: the walks never step onto a
node without one); `competitor_phrases` the phrases whose class a title may be taken for by a reader (every
phrase its categories could give, evidence or not, and the `REGION_MAYBE` ones), the class the text-mention
uniqueness check counts (`mentions.py`).
"""

import dataclasses
import re

from data_pipeline import entities

PERSON, PLACE = 'person', 'place'  # evidence kinds besides a head regex


@dataclasses.dataclass(frozen=True)
class Rule:
  """One way a category leaf gives a descriptor.

  Attributes:
    phrase: the descriptor, a singular noun phrase ('chemical element').
    evidence: None (membership suffices), PERSON, PLACE, or a regex searched (case-insensitive, whole words) in
      the definition's head (`definition_head`).
  """
  phrase: str
  evidence: str | None = None


_BUILDING = (r'building|cathedral|church|chapel|abbey|basilica|mosque|temple|palace|castle|fortress|fort|tower|'
             r'skyscraper|bridge|monument|mausoleum|tomb|pyramid|house|hall|stadium|museum|theatre|dam|lighthouse|'
             r'structure|arch|gate|wall|amphitheatre|monastery|shrine|station|library')
_WAR = r'war|battle|conflict|siege|campaign|rebellion|revolution|invasion|uprising|crusade|offensive|operation'
_LANDFORM = (r'river|ocean|sea|lake|mountain|mountains|range|desert|island|islands|archipelago|peninsula|continent|'
             r'bay|gulf|strait|valley|plateau|volcano|glacier|reef|waterfall|falls|canyon|gorge|forest|plain|basin|'
             r'delta|cape|coast|channel|hill|hills|tributary|lagoon|atoll|sound|estuary|rainforest')
_PLACE_WORDS = (_LANDFORM + r'|city|town|village|capital|county|region|state|province|borough|district|port|'
                r'municipality|metropolis|settlement|territory|conurbation|suburb|community|seaport|parish|'
                r'commune|prefecture|oblast|department|governorate|colony|country|nation|kingdom|republic|'
                r'emirate|area|park|reservoir|national park|square|street|escarpment|crater|resort|heath|moor')

# Category leaf -> rules, first that holds wins (several: one class each where the leaf mixes kinds).
CLASSES: dict[str, tuple[Rule, ...]] = {
    'Birds': (Rule('bird'),), 'Mammals': (Rule('mammal'),), 'Plants': (Rule('plant'),),
    'Dinosaurs': (Rule('dinosaur'),),
    'Insects_Reptiles_and_Fish': (Rule('insect', 'insect|beetle|butterfly|moth|ant|bee|wasp|fly'),
                                  Rule('reptile', 'reptile|lizard|snake|turtle|tortoise|crocodile'),
                                  Rule('fish', 'fish|shark|ray|eel|salmon')),
    'Organisms': (Rule('organism', 'organism|species|genus|bacterium|bacteria|virus|fungus|alga|algae|protist'),),
    'Chemical_elements': (Rule('chemical element', 'element|metal|metalloid|gas|halogen'),),
    'Chemical_compounds': (Rule('chemical compound', 'compound|acid|oxide|salt|molecule|chemical|substance'),),
    'Mineralogy': (Rule('mineral', 'mineral|gem|gemstone|crystal'), Rule('rock', 'rock')),
    'Geography_of_Great_Britain': (Rule('place in the British Isles', PLACE),),
    'North_American_Geography': (Rule('North American place', PLACE),),
    'European_Geography': (Rule('European place', PLACE),),
    'African_Geography': (Rule('African place', PLACE),),
    'Geography_of_Asia': (Rule('Asian place', PLACE),),
    'Geography_of_Oceania_Australasia': (Rule('place in Oceania', PLACE),),
    'Central_and_South_American_Geography': (Rule('Latin American place', PLACE),),
    'Geography_of_the_Middle_East': (Rule('Middle Eastern place', PLACE),),
    'Antarctica': (Rule('Antarctic place', PLACE),),
    'General_Geography': (Rule('geographic feature', _LANDFORM),),
    'Natural_Disasters': (Rule('natural disaster', r'disaster|earthquake|eruption|tsunami|flood|famine|'
                                                   r'hurricane|cyclone|typhoon|tornado|drought|landslide'),),
    'Storms': (Rule('storm', 'storm|hurricane|cyclone|typhoon|tornado|blizzard'),),
    'Climate_and_the_Weather': (Rule('weather phenomenon', r'weather|wind|rain|rainfall|precipitation|cloud|'
                                                           r'storm|monsoon|fog|snow|hail|tornado|drought|'
                                                           r'phenomenon'),),
    'Historical_figures': (Rule('historical figure', PERSON),),
    'Political_People': (Rule('political figure', PERSON),),
    'Writers_and_critics': (Rule('writer', PERSON),),
    'Performers_and_composers': (Rule('musician', PERSON),),
    'Sports_and_games_people': (Rule('sportsperson', PERSON),),
    'Monarchs_of_Great_Britain': (Rule('British monarch', PERSON),),
    'Religious_figures_and_leaders': (Rule('religious figure', PERSON),),
    'Artists': (Rule('artist', PERSON),),
    'USA_Presidents': (Rule('US president', PERSON),),
    'Engineers_and_inventors': (Rule('inventor', 'inventor'), Rule('engineer', 'engineer')),  # not Carnegie
    'Actors_models_and_celebrities': (Rule('celebrity', PERSON),),
    'Philosophers': (Rule('philosopher', PERSON),),
    'Human_Scientists': (Rule('scientist', PERSON),),
    'Military_People': (Rule('military leader', PERSON),),
    'Geographers_and_explorers': (Rule('explorer', PERSON),),
    'Astronomers_and_physicists': (Rule('physicist', 'physicist'),
                                   Rule('astronomer', 'astronomer|astrophysicist|cosmologist')),  # Carl Sagan
    'Mathematicians': (Rule('mathematician', PERSON),),
    'Computing_People': (Rule('computer scientist', PERSON),),
    'Producers_directors_and_media_figures': (Rule('media figure', PERSON),),
    'Chemists': (Rule('chemist', PERSON),),
    'Historians_chroniclers_and_history_books': (Rule('historian', PERSON),
                                                 Rule('history book', 'book|chronicle|history|histories|work')),
    'Space_Astronomy': (Rule('astronomical object', r'star|planet|moon|satellite|galaxy|nebula|comet|asteroid|'
                                                    r'cluster|constellation|dwarf|giant|supernova|quasar|pulsar|'
                                                    r'black hole|belt|cloud'),),
    'The_Planets': (Rule('planet', 'planet'),),
    'Railway_transport': (Rule('railway', 'railway|railroad|line|locomotive|train|metro|subway|tramway'),),
    'Air_and_Sea_transport': (Rule('canal', 'canal|waterway'),  # before 'ship': 'is a major ship canal'
                              Rule('ship', 'ship|vessel|liner|boat|submarine|battleship|steamship'),
                              Rule('aircraft', 'aircraft|airliner|aeroplane|airplane|airship|helicopter')),
    'Road_transport': (Rule('road', 'road|motorway|highway|route'), Rule('car', 'car|automobile|vehicle')),
    'Architecture': (Rule('building', _BUILDING),),
    'Novels': (Rule('novel', 'novel|novella|book'),), 'Films': (Rule('film', 'film|movie'),),
    'Television': (Rule('television programme', 'programme|program|series|show|sitcom|drama|soap opera'),),
    'Poetry_and_Opera': (Rule('poem', 'poem|epic|sonnet|ballad'), Rule('opera', 'opera')),
    'Languages': (Rule('language', 'language|dialect'),),
    'Peoples': (Rule('ethnic group', 'people|peoples|ethnic|tribe|group|nation'),),
    'Divinities': (Rule('deity', 'god|goddess|deity|divinity|spirit'),),
    'Myths': (Rule('myth', 'myth|legend|mythology|story|tale'),),
    'Religious_texts': (Rule('religious text', 'text|book|scripture|scriptures|collection|gospel|epic|work'),),
    'Religious_movements_traditions_and_organizations': (
        Rule('religious tradition', 'religion|faith|church|tradition|movement|denomination|sect|order|branch|'
                                    'school|belief|doctrine|philosophy'),),
    'Companies': (Rule('company', 'company|corporation|manufacturer|firm|business|airline|conglomerate|bank|'
                                  'retailer|group'),),
    'Currency': (Rule('currency', 'currency|coin|unit|money'),),
    'Sports_teams': (Rule('sports team', 'team|club|side'),),
    'Sports_events': (Rule('sporting event', 'event|tournament|championship|competition|race|cup|games|match'),),
    'Sports': (Rule('sport', 'sport|game'),),
    'Musical_Instruments': (Rule('musical instrument', 'instrument'),),
    'Musical_Recordings_and_compositions': (Rule('musical work', 'song|album|symphony|composition|opera|work|'
                                                                 'piece|single|concerto|suite'),),
    'Computer_and_Video_games': (Rule('video game', 'game'),),
    'Software': (Rule('piece of software', 'software|program|application|system|browser|editor|language'),),
    'Military_History_and_War': (Rule('military conflict', _WAR),),
    'Pre_1900_Military': (Rule('military conflict', _WAR),),
    'World_War_II': (Rule('military conflict', _WAR),),
    'Drink': (Rule('drink', 'drink|beverage|liquor|wine|beer|spirit|tea|coffee'),),
    'Food_and_agriculture': (Rule('food', r'food|dish|fruit|vegetable|cereal|grain|nut|spice|bread|cheese|sauce|'
                                          r'meat|herb|legume|tuber'), Rule('crop', 'crop')),
    'Cartoons': (Rule('fictional character', 'character|superhero'), Rule('cartoon', 'cartoon|comic|series|strip')),
}

# Region class -> the sovereign states it describes (reviewed: the country leaves of categories.tsv).
REGIONS: dict[str, frozenset[str]] = {k: frozenset(v.split()) for k, v in {
    'European country': 'Albania Andorra Austria Belarus Belgium Bosnia_and_Herzegovina Bulgaria Croatia '
                        'Czech_Republic Denmark Estonia Finland France Germany Greece Hungary Iceland Italy Latvia '
                        'Liechtenstein Lithuania Luxembourg Malta Moldova Monaco Montenegro Netherlands Norway '
                        'Poland Portugal Republic_of_Ireland Republic_of_Macedonia Romania San_Marino Serbia '
                        'Slovakia Slovenia Spain Sweden Switzerland Ukraine United_Kingdom Vatican_City',
    'African country': "Algeria Angola Benin Botswana Burkina_Faso Burundi Côte_d'Ivoire Cameroon Cape_Verde "
                       'Central_African_Republic Chad Comoros Democratic_Republic_of_the_Congo Djibouti Egypt '
                       'Equatorial_Guinea Eritrea Ethiopia Gabon Ghana Guinea Guinea-Bissau Kenya Lesotho Liberia '
                       'Libya Madagascar Malawi Mali Mauritania Mauritius Morocco Mozambique Namibia Niger Nigeria '
                       'Republic_of_the_Congo Rwanda São_Tomé_and_Príncipe Senegal Seychelles Sierra_Leone Somalia '
                       'South_Africa Sudan Swaziland Tanzania The_Gambia Togo Tunisia Uganda Zambia Zimbabwe',
    'Asian country': "Afghanistan Bangladesh Bhutan Brunei Cambodia East_Timor India Indonesia Japan Kazakhstan "
                     "Kyrgyzstan Laos Malaysia Maldives Myanmar Nepal North_Korea Pakistan People's_Republic_of_China "
                     'Philippines Singapore South_Korea Sri_Lanka Tajikistan Thailand Turkmenistan Uzbekistan Vietnam '
                     'Bahrain Iran Iraq Israel Jordan Kuwait Lebanon Oman Qatar Saudi_Arabia Syria '
                     'United_Arab_Emirates Yemen',
    'Middle Eastern country': 'Bahrain Iran Iraq Israel Jordan Kuwait Lebanon Oman Qatar Saudi_Arabia Syria '
                              'United_Arab_Emirates Yemen',
    'Latin American country': 'Argentina Bolivia Brazil Chile Colombia Costa_Rica Cuba Dominican_Republic Ecuador '
                              'El_Salvador Guatemala Haiti Honduras Mexico Nicaragua Panama Paraguay Peru Uruguay '
                              'Venezuela',
    'Caribbean country': 'Antigua_and_Barbuda Bahamas The_Bahamas Barbados Cuba Dominica Dominican_Republic Grenada '
                         'Haiti Jamaica Saint_Kitts_and_Nevis Saint_Lucia Saint_Vincent_and_the_Grenadines '
                         'Trinidad_and_Tobago',
}.items()}
_CONTESTED = 'Turkey Russia Cyprus Armenia Azerbaijan Georgia_(country) Kosovo South_Ossetia Abkhazia '
# Region class -> titles never described so but counted as its members' competitors (transcontinental, disputed,
# territories of the region).
REGION_MAYBE: dict[str, frozenset[str]] = {k: frozenset(v.split()) for k, v in {
    'European country': _CONTESTED + 'Kazakhstan Turkish_Republic_of_Northern_Cyprus Serbia_and_Montenegro '
                                     'Åland Éire Ireland Greenland Faroe_Islands',
    'African country': 'Mayotte Réunion Saint_Helena Western_Sahara',
    'Asian country': _CONTESTED + 'Egypt China Korea Republic_of_China Taiwan Tibet Hong_Kong Christmas_Island '
                                  'British_Indian_Ocean_Territory Palestinian_territories Gaza_Strip West_Bank',
    'Middle Eastern country': 'Turkey Egypt Cyprus Abu_Dhabi Dubai Gaza_Strip West_Bank Palestinian_territories',
    'Latin American country': 'Belize Guyana Suriname Puerto_Rico French_Guiana Falkland_Islands Jamaica Bahamas '
                              'The_Bahamas Trinidad_and_Tobago Guadeloupe Martinique',
    'Caribbean country': 'Anguilla Aruba Bermuda British_Virgin_Islands Cayman_Islands Guadeloupe Martinique '
                         'Montserrat Netherlands_Antilles Puerto_Rico Turks_and_Caicos_Islands',
}.items()}
# Region class of countries -> the place classes its members and maybes also belong to (Ethiopia is an African
# place too: it competes with Addis Ababa for "the African place mentioned in ...").
REGION_PLACES: dict[str, tuple[str, ...]] = {
    'European country': ('European place',), 'African country': ('African place',),
    'Asian country': ('Asian place',), 'Middle Eastern country': ('Middle Eastern place', 'Asian place'),
    'Latin American country': ('Latin American place',), 'Caribbean country': ('Latin American place',)}
# Person classes a reader applies to people of many kinds (Qin Shi Huang is a political figure too, whatever his
# category): every person a text names competes for them.
BROAD_PERSON = ('historical figure', 'political figure', 'religious figure', 'military leader', 'celebrity',
                'media figure')
# Phrase -> the broader phrases its members compete for (a physicist is a scientist).
BROADER: dict[str, tuple[str, ...]] = {
    'physicist': ('scientist', 'mathematician', 'astronomer'), 'chemist': ('scientist',),  # Galileo: all three
    'mathematician': ('scientist', 'physicist', 'astronomer'),
    'astronomer': ('scientist', 'physicist', 'mathematician'),
    'inventor': ('engineer',), 'engineer': ('inventor',),
    'computer scientist': ('scientist',), 'historian': ('writer',), 'philosopher': ('writer',),
    'planet': ('astronomical object',), 'storm': ('natural disaster', 'weather phenomenon'),
    'Caribbean country': ('country',), 'Latin American country': ('country',)}
COUNTRY_LEAVES = ('Countries', 'European_Countries', 'African_Countries', 'Asian_Countries',
                  'Middle_Eastern_Countries', 'Central_and_South_American_Countries')
SOVEREIGN = frozenset().union(*REGIONS.values()) | frozenset(
    'Australia Canada Fiji Kiribati Marshall_Islands Micronesia Nauru New_Zealand Palau Papua_New_Guinea Samoa '
    'Solomon_Islands Tonga Tuvalu United_States Vanuatu Belize Guyana Suriname'.split())
# Phrase -> titles its evidence admits that are not of the class (reviewed against the place leaves; a region
# is no place *of* itself: "the Latin American place mentioned most often in ..." must not be Latin America).
_REGIONS_THEMSELVES = ('Latin_America South_America Central_America North_America Europe Africa Asia Middle_East '
                       'Oceania Australasia Antarctica Caribbean Sub-Saharan_Africa Horn_of_Africa Northwest_Africa '
                       'Southeast_Asia East_Asia South_Asia Central_Asia Western_Europe Eastern_Europe ')
NOT_CLASS: dict[str, frozenset[str]] = {k: frozenset((_REGIONS_THEMSELVES + v).split()) for k, v in {
    # Wikispeedia files Gibraltar (on the Iberian peninsula), Moscow and Stuttgart under Geography_of_Great_Britain.
    'place in the British Isles': 'Gibraltar Moscow Stuttgart '
                                  'Isle_of_Man Faroe_Islands Rock_of_Gibraltar Channel_Islands Jersey Guernsey '
                                  'British_Isles British_Isles_(terminology) City_status_in_the_United_Kingdom '
                                  'National_parks_of_England_and_Wales Geology_of_Dorset Jersey_Zoological_Park '
                                  'London_Zoo',
    'African place': 'Angkor Great_Rift_Valley',
    'Latin American place': '', 'Middle Eastern place': '', 'place in Oceania': '', 'Antarctic place': '',
    'British monarch': 'Oliver_Cromwell Richard_Cromwell',  # Lords Protector, not monarchs
    'Asian place': 'Chinyingi Andriyivskyy_Descent',
    'North American place': 'Great_Rift_Valley Hurricane_Lenny Michigan_State_University University_of_Chicago '
                            'University_of_Texas_at_Austin Education_in_the_United_States Phoenix_Zoo',
    'European place': 'Western_Roman_Empire Palio_di_Siena Macedon West_Flemish Zuid-Gelders Akrotiri_and_Dhekelia '
                      'Boltysh_crater Geography_of_Ireland',
}.items()}

_VERB = re.compile(r"\b(?:is|are|was|were)\s+(?:(?:also|now|currently|once|formerly|usually|generally|often)\s+)?"
                   r"(?:one of the|one of|an?|the|[A-Z][\w'’.-]*['’]s?)(?=\s)")
_HEAD_STOP = re.compile(r"\b(?:of|in|on|at|from|by|for|with|that|which|who|whose|where|whom|located|situated|to|"
                        r"between|near|under|since|during|made|used|known|named|called)\b|[;.:()]")
_MAX_SENTENCES = 80  # sentences `definition` reads
_LIFE = re.compile(r'\([^()]*\b\d{3,4}\b[^()]*\)|\bborn\b', re.I)
_PERSON_KEYS = re.compile(r'^(?:Born|Died)\b', re.M)
_PLACE_KEYS = re.compile(r'^(?:- )?(?:Population|Area|Coordinates|Elevation|Length|Highest point|Location)\b', re.M)


def definition(text: str, names=()) -> tuple[str, str]:
  """(sentence, predicate): the article's defining sentence "X is a …" and what follows its subject.

  The first sentence (paragraphs joined, the infobox lines included: their end is not always found) in which a
  name of the article (`names`, or the last word of one: 'Carl Edward Sagan', up to case and accents) stands
  before 'is / are / was / were' + a determiner or a possessive ('Aberdeen is Scotland's third largest city') within 250 characters of the sentence start; ('', '')
  when none (the evidence that needs it then fails: abstain).

  Args:
    text: the article's plain text.
    names: the article's names (`WikiGraph.aliases`, e.g. ('Isle of Man',)); () = any sentence.
  """
  names = tuple(names) + tuple(n.split()[-1] for n in names if len(n.split()) > 1)  # 'Carl Edward Sagan'
  paragraphs = (' '.join(p.split()) for p in re.split(r'\n\s*\n', text))
  sentences = (s for p in paragraphs for s in re.split(r'(?<=[.!?])\s+(?=[A-Z])', p))
  for k, s in enumerate(sentences):
    if k >= _MAX_SENTENCES:
      break
    m = _VERB.search(s)
    if m and m.start() < 250 and (not names or entities.names_in_text(s[:m.start()], names)):
      return s, s[m.start():]
  return '', ''


def definition_head(text: str, names=()) -> str:
  """The defining phrase's head words, lower-cased: the predicate of `definition` up to its first preposition or
  relative word ('is a large, mainly Gothic church, in Westminster' -> 'is a large, mainly gothic church,')."""
  return _HEAD_STOP.split(definition(text, names)[1], 1)[0].lower()


def _holds(rule: Rule, text: str, head: str, sentence: str) -> bool:
  if rule.evidence is None:
    return True
  infobox = '\n'.join(entities.infobox_lines(text))
  if rule.evidence == PERSON:
    return bool(_PERSON_KEYS.search(infobox) or _LIFE.search(sentence))
  if rule.evidence == PLACE:
    return bool(_PLACE_KEYS.search(infobox) or re.search(rf'\b(?:{_PLACE_WORDS})s?\b', head))
  return bool(re.search(rf'\b(?:{rule.evidence})s?\b', head))


def descriptors(title: str, categories, text: str, names=()) -> list[str]:
  """The descriptor phrases whose evidence holds for the article, most specific category first, no repeats.

  Countries: the `REGIONS` classes the title is a sovereign member of, then 'country' (`SOVEREIGN`); a
  non-sovereign member of a country leaf gets none from it.

  Args:
    title: Wikispeedia title ('Falkland_Islands'); categories: its category paths; text: its plain text;
      names: its names (`definition`).
  Returns:
    Phrases (possibly none: abstain), e.g. ['European country', 'country'] for France.
  """
  out, head, sentence = [], None, ''
  for cat in sorted(categories, key=lambda c: -c.count('.')):
    leaf = cat.split('.')[-1]
    if leaf in COUNTRY_LEAVES:
      got = [r for r, members in REGIONS.items() if title in members] + (['country'] if title in SOVEREIGN else [])
    else:
      if head is None:
        sentence, predicate = definition(text, names)
        head = _HEAD_STOP.split(predicate, 1)[0].lower()
      got = [r.phrase for r in CLASSES.get(leaf, ()) if title not in NOT_CLASS.get(r.phrase, ())
             and _holds(r, text, head, sentence)][:1]
    out += [p for p in got if p not in out]
  return out


def competitor_phrases(title: str, categories) -> set[str]:
  """Every phrase a reader may take `title` for: each rule's phrase of each of its category leaves (evidence or
  not), the `REGIONS` classes it is in or `REGION_MAYBE` of with their `REGION_PLACES`, 'country' for any member of
  a country leaf, every `BROAD_PERSON` phrase for a person, and the `BROADER` phrases of all these."""
  out = set()
  for cat in categories:
    leaf = cat.split('.')[-1]
    out.update(r.phrase for r in CLASSES.get(leaf, ()))
    if leaf in COUNTRY_LEAVES:
      out.add('country')
  regions = [r for r in REGIONS if title in REGIONS[r] | REGION_MAYBE[r]]
  out.update(regions)
  out.update(p for r in regions for p in REGION_PLACES[r])
  if any(r.evidence == PERSON for cat in categories for r in CLASSES.get(cat.split('.')[-1], ())):
    out.update(BROAD_PERSON)
  out.update(b for p in list(out) for b in BROADER.get(p, ()))
  return out
