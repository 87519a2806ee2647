"""The words a reader classes a name by (`reader.py`): class nouns, titles, openers, sentence cues.

A text says what an entity is in a few set ways, whether or not the entity has an article: an appositive ("the
historian Jacob Burckhardt", "Mann's 1947 novel Doktor Faustus", "novelists Hermann Hesse, André Gide and D. H.
Lawrence"), a title ("President Eisenhower", "King Louis"), a naming ("a local instrument called the cajón"), a
copula ("José Hernández was the author of ..."). `NOUNS` maps the class nouns to the descriptor phrases of
`classes.py` (a person noun makes the name a person's); `TITLES` the titles before a name; `CUES` the words of a
sentence that class a person the text names with no such noun (Röntgen in "what Wilhelm Röntgen later identified
as effects of X-rays" is a physicist to a reader). `OPENERS` and `DEMONYMS` are capitalised words that start a
name-like run without being part of the name ('The', 'However', 'Soviet' in 'Soviet cosmonaut Yuri Gagarin').
"""

import re

# Person nouns -> descriptor phrases (`classes.CLASSES` person classes).
PERSON_NOUNS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(('historian', 'chronicler'), ('historian',)),
    'physicist': ('physicist',), 'astrophysicist': ('physicist', 'astronomer'), 'astronomer': ('astronomer',),
    'mathematician': ('mathematician',), 'chemist': ('chemist',),
    **dict.fromkeys(('scientist', 'biologist', 'naturalist', 'geologist', 'zoologist', 'botanist', 'economist',
                     'psychologist', 'sociologist', 'anthropologist', 'physician', 'researcher'), ('scientist',)),
    'inventor': ('inventor',), 'engineer': ('engineer',), 'computer scientist': ('computer scientist',),
    **dict.fromkeys(('writer', 'novelist', 'poet', 'author', 'playwright', 'dramatist', 'essayist', 'critic',
                     'journalist', 'satirist'), ('writer',)),
    'philosopher': ('philosopher',),
    **dict.fromkeys(('composer', 'musician', 'singer', 'pianist', 'violinist', 'guitarist', 'conductor',
                     'songwriter', 'rapper', 'drummer', 'bandleader'), ('musician',)),
    **dict.fromkeys(('painter', 'sculptor', 'artist', 'photographer', 'illustrator'), ('artist',)),
    **dict.fromkeys(('actor', 'actress', 'model', 'comedian'), ('celebrity',)),
    **dict.fromkeys(('director', 'producer', 'presenter', 'broadcaster', 'filmmaker'), ('media figure',)),
    **dict.fromkeys(('explorer', 'navigator', 'astronaut', 'cosmonaut', 'aviator', 'geographer', 'pilot'),
                    ('explorer',)),
    **dict.fromkeys(('politician', 'statesman', 'senator', 'chancellor', 'governor', 'diplomat', 'revolutionary',
                     'dictator', 'president', 'prime minister', 'minister'), ('political figure',)),
    **dict.fromkeys(('king', 'queen', 'emperor', 'empress', 'pharaoh', 'tsar', 'czar', 'sultan', 'monarch', 'shah',
                     'prince', 'princess', 'ruler'), ('political figure', 'historical figure')),
    **dict.fromkeys(('general', 'admiral', 'commander', 'marshal', 'warlord', 'conqueror'), ('military leader',)),
    **dict.fromkeys(('pope', 'saint', 'bishop', 'archbishop', 'prophet', 'priest', 'monk', 'rabbi', 'imam',
                     'missionary', 'theologian', 'cardinal'), ('religious figure',)),
    **dict.fromkeys(('footballer', 'athlete', 'cyclist', 'boxer', 'tennis player', 'racing driver', 'golfer',
                     'cricketer', 'swimmer', 'sprinter'), ('sportsperson',)),
}
# Thing nouns -> descriptor phrases.
THING_NOUNS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(('novel', 'novella'), ('novel',)), 'poem': ('poem',), 'opera': ('opera',),
    **dict.fromkeys(('film', 'movie'), ('film',)),
    **dict.fromkeys(('song', 'album', 'symphony', 'concerto', 'single'), ('musical work',)),
    'instrument': ('musical instrument',), **dict.fromkeys(('ship', 'liner', 'battleship'), ('ship',)),
    **dict.fromkeys(('aircraft', 'airliner'), ('aircraft',)),
    **dict.fromkeys(('company', 'corporation', 'firm', 'airline', 'manufacturer'), ('company',)),
    **dict.fromkeys(('language', 'dialect'), ('language',)),
    **dict.fromkeys(('god', 'goddess', 'deity'), ('deity',)),
    **dict.fromkeys(('team', 'club'), ('sports team',)), 'video game': ('video game',),
    'dinosaur': ('dinosaur',), 'element': ('chemical element',), 'planet': ('planet',),
    **dict.fromkeys(('hurricane', 'typhoon', 'cyclone'), ('storm',)),
    **dict.fromkeys(('battle', 'war', 'siege'), ('military conflict',)),
}
NOUNS: dict[str, tuple[str, ...]] = {**THING_NOUNS, **PERSON_NOUNS}
_PLURALS = {'novelists': 'novelist', 'philosophers': 'philosopher', 'sociologists': 'sociologist',
            'psychologists': 'psychologist', 'theologians': 'theologian', 'physicists': 'physicist'}


def noun_pattern() -> str:
  """A regex alternation of the class nouns, longest first, each with an optional plural ending."""
  words = sorted(NOUNS, key=len, reverse=True)
  return '|'.join(re.escape(w).replace(r'\ ', r'\s+') + r'(?:s|es)?' for w in words)


def noun_of(word: str) -> str | None:
  """The `NOUNS` key of a (possibly plural, any case) noun, or None ('Novelists' -> 'novelist')."""
  w = ' '.join(word.lower().split())
  for cand in (w, _PLURALS.get(w, ''), w[:-1] if w.endswith('s') else '', w[:-2] if w.endswith('es') else ''):
    if cand in NOUNS:
      return cand
  return None


# Title words before a person's name -> descriptor phrases ('' = a person, no class).
TITLES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(('president', 'senator', 'governor', 'chancellor', 'premier', 'chairman', 'minister'),
                    ('political figure',)),
    **dict.fromkeys(('king', 'queen', 'emperor', 'empress', 'tsar', 'czar', 'sultan', 'shah', 'pharaoh', 'caliph',
                     'prince', 'princess', 'duke', 'duchess', 'emir', 'khan'),
                    ('political figure', 'historical figure')),
    **dict.fromkeys(('pope', 'saint', 'st', 'bishop', 'archbishop', 'cardinal', 'rabbi', 'imam', 'reverend',
                     'father'), ('religious figure',)),
    **dict.fromkeys(('general', 'admiral', 'marshal', 'colonel', 'captain', 'commander', 'lieutenant',
                     'major'), ('military leader',)),
    **dict.fromkeys(('sergeant', 'corporal', 'private'), ('military leader',)),
    **dict.fromkeys(('prime', 'sir', 'dame', 'lord', 'lady', 'dr', 'doctor', 'professor', 'prof', 'mr', 'mrs', 'ms',
                     'miss', 'mister', 'count', 'countess', 'baron', 'vice'), ()),
}
US_WORDS = frozenset(('us', 'u.s.', 'american', 'united states'))
# Capitalised words that open a sentence or a name-like run without being a name.
OPENERS = frozenset('''the a an this that these those his her its their our my in on at to of for by with from as
after before during while when where which who however although though but and or nor so yet then thus also
it he she they we i you there here one some many most several other both each all any every no not if since
because until unlike like between among under over about around near into upon according despite following
today later early late modern ancient medieval northern southern eastern western north south east west central
new old great greater little upper lower saint january february march april may june july august september
october november december monday tuesday wednesday thursday friday saturday sunday publisher genre genres author
country language series released media pages isbn followed preceded illustrator cover born died nationality
occupation spouse capital currency population area'''.split())
DEMONYMS = frozenset('''us u.s. uk american soviet british english french german russian italian spanish chinese
japanese indian greek roman persian iranian argentine argentinian peruvian mexican canadian australian swiss dutch
polish austrian swedish norwegian danish irish scottish welsh turkish egyptian arab arabic israeli jewish catholic
muslim islamic buddhist hindu african european asian latin andean creole afro cuban brazilian chilean portuguese
belgian hungarian czech korean vietnamese thai ottoman byzantine prussian bavarian venetian florentine flemish
nazi communist republican democratic retired famous socialist liberal conservative'''.split())
PARTICLES = frozenset('de da di del della van von der den du dos das la le y bin ibn al el af zu ter'.split())

# Narrow person class -> words of a sentence that class a person it names with no class noun of its own.
CUES: dict[str, re.Pattern] = {p: re.compile(rx, re.I) for p, rx in {
    'physicist': r'\bphysic|x-rays?\b|\brays\b|radiation|relativity|quantum|electromagnet|\bparticles?\b|\batoms?\b|'
                 r'\bnuclear\b',
    'astronomer': r'astronom|telescope|\bcomets?\b|\bplanets?\b|\bstars?\b|galax',
    'explorer': r'astronaut|cosmonaut|\bapollo\b|\blunar\b|\bmoon\b|spaceflight|spacecraft|\bcrew\b|expedition|'
                r'command module|teammate|\bspace\b|set foot|'
                r'explor|\bvoyage',
    'writer': r'\bnovel|\bpoe(?:m|t|try|ts)\b|literat|\bwrote\b|\bwriters?\b|\bauthors?\b|\bessays?\b|fiction',
    'musician': r'\bmusic|\bsongs?\b|\balbums?\b|compos|symphon|\boperas?\b|\bband\b|\bsang\b|singer|guitar|piano',
    'historian': r'historian|chronicle',
    'philosopher': r'philosoph',
    'artist': r'\bpaint|sculpt|\bartists?\b',
    'scientist': r'scien|discover|\btheory\b|experiment|research',
}.items()}
# Capitalised words of the names of things, never of a person's (a name holding one is no person by its shape).
THING_WORDS = frozenset('''centre center committee award administration treaty university institute museum company
corporation society association council party republic kingdom empire church cathedral bridge street road river lake
mountain mountains island islands sea ocean bay park province city county state prize act war battle festival day
station airport hotel school college library project program programme mission module orbiter prospector experiment
package rover telescope observatory agency service force army navy air games cup league club team stadium theatre
orchestra band records press times news journal magazine review union federation foundation group system network
house hall palace castle tower temple square avenue valley desert coast gulf strait canal dam port harbour
international national royal imperial general united northern southern eastern western lunar solar space
christmas easter award awards medal order cross trophy championship tournament series album song film show man
section works machine machines universitat universidad universite universita technische hochschule instituto
institut museo musee escuela colegio san santa santo sao port fort mount cape saint dynasty dynasties nueva nuevo
deportivo ciudad villa puerto rio sierra cerro isla lago bahia plaza calle'''.split())
# Phrases whose members are people (an article with one of them is a person's).
PERSON_PHRASES = frozenset(p for ps in list(PERSON_NOUNS.values()) + list(TITLES.values()) for p in ps) | frozenset(
    ('US president', 'British monarch', 'historical figure', 'celebrity', 'media figure', 'sportsperson',
     'computer scientist', 'military leader', 'religious figure', 'political figure'))
# Person classes narrower than the broad ones (`classes.BROAD_PERSON`): an article person with none of them gets
# its class from the sentence cues too.
NARROW_PERSON = frozenset(CUES) | frozenset(p for ps in PERSON_NOUNS.values() for p in ps) - frozenset(
    ('political figure', 'historical figure', 'religious figure', 'military leader', 'celebrity', 'media figure'))
# Words that end (or open) the name of a place: a name without an article with one is a place (`reader_context.places`).
LANDFORMS = frozenset('''falls lake lakes river island islands mountain mountains plateau bay valley canyon peninsula
desert sea gulf strait glacier volcano hills hill forest reef lagoon cape coast basin delta gorge'''.split())
PLACE_LAST = LANDFORMS | frozenset('''county province city town village district region park square street avenue
trail harbour harbor port'''.split())
PLACE_FIRST = frozenset('''lake mount cape isla lago rio sierra cerro'''.split())
