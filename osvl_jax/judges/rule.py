"""Rule-based judges: the offline default for r_acc and r_query (DESIGN.md §6).

`accuracy(response, answers)` — 1.0 when the response matches any gold alias, else 0.0. A match is any of:
  1. normalised exact match, or the normalised alias contained in the normalised response on word boundaries.
     Normalisation: dates in common formats -> ISO `yyyy mm dd` (see `_normalize_dates`), Unicode accents
     stripped, lowercase, dotted acronyms joined (`U.S.` -> `us`), `1,234` -> `1234`, punctuation -> space (the decimal point between digits is kept),
     articles (a, an, the) dropped unless they are the whole text (a gold `A` or `The` survives), whitespace
     collapsed; an answer made only of articles therefore matches only a response that is exactly it;
  2. numeric match when the alias is a number (optionally with a scale word — thousand/million/billion — and
     up to two trailing unit words or `%`, which are ignored): some number in the response (scale words
     applied) is within relative tolerance 1e-2 of it. Plain integers of at most four digits (years, counts)
     must match exactly, since 1e-2 would accept 1969 for 1950.
  3. multiple choice: a letter-only reply (`B`, `(B)`, `B.`, `**B**`, `Answer: B`, `The answer is B`,
     `Option B`; `choice_letter`) is judged by its letter alone: correct iff it is the gold letter — the item's
     (`gold_letter`, e.g. LiveVQA's `Ground_Truth`), else the option of the question that is a gold answer
     (`gold_choice`), else a gold answer that is itself a single letter. Without any gold letter the reply is
     matched as text (rules 1–2).
  None, or an empty response -> 0.0.

`query_quality(tool_calls, results, question)` — a heuristic in [0, 1] over the calls of the pre-fatal prefix
(the caller passes only those). It is the mean of three parts, each a fraction over calls:
  success     1 for a call without a tool-execution error, 0.5 for `no_result` (ran, but the query found
              nothing), 0 for an execution error;
  novelty     1 for a call that does not repeat an earlier call (same tool name and same normalised arguments);
  grounding   over text-query calls only (arguments `query` or `q`): 1 when the query shares at least one content
              word (>= 3 characters, not a stop word) with the question or with any earlier observation text.
              Omitted from the mean when there are no text queries.
  No tool calls at all -> 0.0 (an agent that never searched has issued no query to reward).

`accuracy_with_hints` reads a benchmark item's metadata into `accuracy`'s arguments (`base.Judge.accuracy`'s
`hints`). `RuleJudge` is both as a `base.Judge` (the judge registered as 'rule'); it has no process judge
(`process_quality` -> None).
"""

import json
import math
import re
import unicodedata
from collections.abc import Mapping
from typing import Any, Sequence

import ml_collections

from osvl_jax.judges import base
from tools import base as tools_base

# ----------------------------------------------------------------------------------------------------------------
# Normalisation
# ----------------------------------------------------------------------------------------------------------------

_MONTHS = {
    'january': 1, 'jan': 1, 'february': 2, 'feb': 2, 'march': 3, 'mar': 3, 'april': 4, 'apr': 4, 'may': 5,
    'june': 6, 'jun': 6, 'july': 7, 'jul': 7, 'august': 8, 'aug': 8, 'september': 9, 'sep': 9, 'sept': 9,
    'october': 10, 'oct': 10, 'november': 11, 'nov': 11, 'december': 12, 'dec': 12,
}
_MONTH_RE = '(' + '|'.join(sorted(_MONTHS, key=len, reverse=True)) + r')\.?'
_DAY_RE = r'(\d{1,2})(?:st|nd|rd|th)?'
_YEAR_RE = r'(\d{4})'

_DATE_PATTERNS = [
    # 2001-03-05, 2001/03/05, 2001.03.05
    (re.compile(r'\b(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})\b'), lambda m: (m[1], m[2], m[3])),
    # 5 March 2001, 5th of March, 2001
    (re.compile(rf'\b{_DAY_RE}\s+(?:of\s+)?{_MONTH_RE},?\s+{_YEAR_RE}\b'),
     lambda m: (m[3], _MONTHS[m[2]], m[1])),
    # March 5, 2001, Mar. 5th 2001
    (re.compile(rf'\b{_MONTH_RE}\s+{_DAY_RE},?\s+{_YEAR_RE}\b'), lambda m: (m[3], _MONTHS[m[1]], m[2])),
    # 05.03.2001 (day first)
    (re.compile(r'\b(\d{1,2})\.(\d{1,2})\.(\d{4})\b'), lambda m: (m[3], m[2], m[1])),
    # 03/05/2001: month first (US) unless the first field cannot be a month
    (re.compile(r'\b(\d{1,2})/(\d{1,2})/(\d{4})\b'),
     lambda m: (m[3], m[1], m[2]) if int(m[1]) <= 12 else (m[3], m[2], m[1])),
    # March 2001
    (re.compile(rf'\b{_MONTH_RE},?\s+{_YEAR_RE}\b'), lambda m: (m[2], _MONTHS[m[1]], None)),
]

_ACRONYM_RE = re.compile(r'\b(?:[a-z]\.){2,}(?![a-z])')
_ARTICLES = {'a', 'an', 'the'}
_STOP_WORDS = _ARTICLES | {
    'and', 'are', 'was', 'were', 'for', 'from', 'with', 'what', 'which', 'who', 'whom', 'whose', 'when', 'where',
    'why', 'how', 'this', 'that', 'these', 'those', 'image', 'picture', 'photo', 'shown', 'does', 'did', 'has',
    'have', 'had', 'its', 'his', 'her', 'their', 'into', 'onto', 'about', 'there', 'than', 'then', 'been', 'being',
    'not', 'but', 'can', 'could', 'would', 'should', 'also', 'any', 'all', 'one', 'you', 'your',
}


def _strip_accents(text: str) -> str:
  return ''.join(c for c in unicodedata.normalize('NFKD', text) if not unicodedata.combining(c))


def _normalize_dates(text: str) -> str:
  """Rewrite dates in common formats (see `_DATE_PATTERNS`) as ISO `yyyy-mm-dd` (or `yyyy-mm`)."""
  def iso(groups):
    year, month, day = groups
    month = int(month)
    if not 1 <= month <= 12 or (day is not None and not 1 <= int(day) <= 31):
      return None
    return f'{int(year):04d}-{month:02d}' + ('' if day is None else f'-{int(day):02d}')

  for pattern, fields in _DATE_PATTERNS:
    def sub(m, fields=fields):
      out = iso(fields(m))
      return m[0] if out is None else f' {out} '
    text = pattern.sub(sub, text)
  return text


def normalize(text: str) -> str:
  """Normalised form for exact/containment matching (module docstring, rule 1)."""
  text = _normalize_dates(_strip_accents(text).lower())
  text = _ACRONYM_RE.sub(lambda m: m[0].replace('.', ''), text)  # u.s.a. -> usa
  text = re.sub(r'(?<=\d),(?=\d{3}\b)', '', text)  # 1,234 -> 1234
  text = re.sub(r'(?<=\d)\.(?=\d)', '\0', text)  # protect the decimal point
  text = re.sub(r'[^\w\0]+|_', ' ', text).replace('\0', '.')
  words = text.split()
  return ' '.join([w for w in words if w not in _ARTICLES] or words)


# ----------------------------------------------------------------------------------------------------------------
# Multiple choice
# ----------------------------------------------------------------------------------------------------------------

_LETTER_REPLY_RE = re.compile(
    r'(?:(?:the\s+)?(?:correct\s+|final\s+)?(?:answer|option|choice)\s*(?:is\s*)?[:\-]?\s*)?'
    r'[(\[]?\s*([a-z])\s*[)\]]?\s*[.:)]?', re.IGNORECASE)
_OPTION_LINE_RE = re.compile(r'^\s*\(?([A-Z])[.)]\s+(\S.*?)\s*$', re.MULTILINE)
_LETTER_ALIAS_RE = re.compile(r'\(?([A-Za-z])\)?\.?')


def choice_letter(response: str | None) -> str | None:
  """The option letter (upper case) of a letter-only reply ('B', '(B)', 'B.', '**B**', 'Answer: B', 'The answer is
  B', 'Option B'), else None (a reply with more text, e.g. 'B. Pebble Beach' or 'a cat', is not letter-only)."""
  if not response:
    return None
  m = _LETTER_REPLY_RE.fullmatch(response.strip().strip('*_`"\'').strip())
  return m[1].upper() if m else None


def choices(question: str) -> dict[str, str]:
  """{letter: option text} of the options listed in a question, one per line ('A. text' or 'A) text'); {} when
  fewer than two."""
  found = dict(_OPTION_LINE_RE.findall(question or ''))
  return found if len(found) >= 2 else {}


def gold_choice(question: str, answers: Sequence[str]) -> str | None:
  """The letter of the option of `question` that is a gold answer, else None: the one option whose normalised
  text equals a gold answer; when none does, the one option that contains a gold answer on word boundaries
  ('To honor the culinary legacy' for 'honor the culinary legacy'). Several candidates: None (ambiguous)."""
  gold = {normalize(a) for a in answers} - {''}
  options = {k: normalize(text) for k, text in choices(question).items()}
  letters = [k for k, text in options.items() if text in gold]
  if not letters:
    letters = [k for k, text in options.items() if any(f' {g} ' in f' {text} ' for g in gold)]
  return letters[0] if len(letters) == 1 else None


# ----------------------------------------------------------------------------------------------------------------
# Numbers
# ----------------------------------------------------------------------------------------------------------------

_SCALES = {'thousand': 1e3, 'million': 1e6, 'billion': 1e9, 'trillion': 1e12}
_NUMBER_RE = re.compile(r'(?<![\w.])([-+]?\d+(?:\.\d+)?)(?:\s*(thousand|million|billion|trillion))?')
_NUMERIC_ALIAS_RE = re.compile(
    r'^\s*([-+]?\d+(?:\.\d+)?)(?:\s*(thousand|million|billion|trillion))?(?:\s*(?:%|[a-z]+)){0,2}\s*$')


def _numbers(text: str) -> list[float]:
  text = re.sub(r'(?<=\d),(?=\d{3}\b)', '', _strip_accents(text).lower())
  return [float(m[1]) * _SCALES.get(m[2] or '', 1.0) for m in _NUMBER_RE.finditer(text)]


def _numeric_alias(alias: str) -> tuple[float, bool] | None:
  """(value, exact) when the alias is a number (module docstring, rule 2), else None."""
  raw = _strip_accents(alias).lower().strip()
  grouped = bool(re.search(r'\d,\d{3}\b', raw))
  m = _NUMERIC_ALIAS_RE.match(re.sub(r'(?<=\d),(?=\d{3}\b)', '', raw))
  if m is None:
    return None
  value = float(m[1]) * _SCALES.get(m[2] or '', 1.0)
  digits = m[1].lstrip('+-')
  exact = '.' not in digits and m[2] is None and not grouped and len(digits) <= 4
  return value, exact


def _numbers_match(gold: float, candidate: float, exact: bool, rel_tol: float) -> bool:
  if exact:
    return gold == candidate
  return math.isclose(gold, candidate, rel_tol=rel_tol, abs_tol=0.0)


def accuracy(response: str | None, answers: Sequence[str], rel_tol: float = 1e-2,
             ranges: Sequence[Sequence[float]] = (), gold_letter: str | None = None) -> float:
  """r_acc ∈ {0.0, 1.0}: does `response` match any alias in `answers`? (rules in the module docstring).

  Args:
    response: the final answer text (inside <response>), or None when the rollout gave none.
    answers: gold answer and its aliases.
    rel_tol: relative tolerance for numeric answers (InfoSeek-style evaluation uses 0.1).
    ranges: [lo, hi] intervals (inclusive) of accepted numeric answers, e.g. InfoSeek's `answer_eval` ranges:
      any number in the response (scale words applied) inside one of them matches.
    gold_letter: the correct option of a multiple-choice item (rule 3), or None.
  """
  if response is None or not response.strip():
    return 0.0
  letter = choice_letter(response)
  if letter is not None:
    golds = {gold_letter.strip().upper()} if gold_letter else {
        m[1].upper() for m in map(_LETTER_ALIAS_RE.fullmatch, (a.strip() for a in answers)) if m}
    if golds:
      return float(letter in golds)
  norm_response = normalize(response)
  padded = f' {norm_response} '
  response_numbers = None
  if ranges:
    response_numbers = _numbers(response)
    if any(lo <= x <= hi for lo, hi in ranges for x in response_numbers):
      return 1.0
  for alias in answers:
    norm_alias = normalize(alias)
    if norm_alias and (norm_alias == norm_response or f' {norm_alias} ' in padded):
      return 1.0
    numeric = _numeric_alias(alias)
    if numeric is not None:
      if response_numbers is None:
        response_numbers = _numbers(response)
      value, exact = numeric
      if any(_numbers_match(value, x, exact, rel_tol) for x in response_numbers):
        return 1.0
  return 0.0


def accuracy_with_hints(question: str, response: str | None, answers: Sequence[str],
                        hints: Mapping[str, Any] | None = None) -> float:
  """`accuracy` with a benchmark item's metadata (`base.Judge.accuracy`'s `hints`): rel_tol from
  `numeric_tolerance` (default 1e-2), ranges from `numeric_ranges`, the gold letter from `gold_letter`, else the
  option of `question` that is a gold answer (`gold_choice`). Other keys are ignored."""
  hints = hints or {}
  return accuracy(response, answers, rel_tol=float(hints.get('numeric_tolerance', 1e-2)),
                  ranges=hints.get('numeric_ranges') or (),
                  gold_letter=hints.get('gold_letter') or gold_choice(question, answers))


# ----------------------------------------------------------------------------------------------------------------
# Query quality
# ----------------------------------------------------------------------------------------------------------------

_QUERY_KEYS = ('query', 'q')


def content_words(text: str) -> set[str]:
  """Lowercased, accent-stripped words of >= 3 characters that are not stop words."""
  return {w for w in normalize(text).split() if len(w) >= 3 and w not in _STOP_WORDS}


def _canonical_arguments(arguments: Any) -> str:
  if isinstance(arguments, dict):
    arguments = {k: normalize(v) if isinstance(v, str) else v for k, v in arguments.items()}
  try:
    return json.dumps(arguments, sort_keys=True, default=str)
  except (TypeError, ValueError):
    return repr(arguments)


def _text_query(arguments: Any) -> str | None:
  if isinstance(arguments, dict):
    for key in _QUERY_KEYS:
      if isinstance(arguments.get(key), str):
        return arguments[key]
  return None


def query_quality(tool_calls: Sequence[tuple[str, Any]], results: Sequence[tools_base.ToolResult | None],
                  question: str) -> float:
  """Heuristic r_query in [0, 1] over the pre-fatal tool calls (definition in the module docstring).

  Args:
    tool_calls: (tool name, arguments dict) of each tool-call step before f_i, in order.
    results: the ToolResult of each call (same length); None counts as an execution error.
    question: the user question.
  """
  if len(tool_calls) != len(results):
    raise ValueError(f'{len(tool_calls)} tool calls but {len(results)} results')
  if not tool_calls:
    return 0.0
  success, novel, grounded = [], [], []
  seen_calls: set[tuple[str, str]] = set()
  known_words = content_words(question)
  for (name, arguments), result in zip(tool_calls, results):
    if result is None or result.is_execution_error:
      success.append(0.0)
    elif result.error_kind == 'no_result':
      success.append(0.5)
    else:
      success.append(1.0)
    key = (str(name), _canonical_arguments(arguments))
    novel.append(0.0 if key in seen_calls else 1.0)
    seen_calls.add(key)
    query = _text_query(arguments)
    if query is not None:
      grounded.append(1.0 if content_words(query) & known_words else 0.0)
    if result is not None and result.text:
      known_words |= content_words(result.text)
  parts = [sum(success) / len(success), sum(novel) / len(novel)]
  if grounded:
    parts.append(sum(grounded) / len(grounded))
  return sum(parts) / len(parts)


class RuleJudge(base.Judge):
  """The offline rule judge: `accuracy` and `query_quality` above as a `base.Judge` (registered as 'rule'). It has
  no process judge (`process_quality`: None) and no prompts or settings (`describe`: the base's)."""
  name = 'rule'

  def __init__(self, config: ml_collections.ConfigDict | None = None):
    super().__init__()
    del config

  def accuracy(self, question, response, answers, *, hints=None):
    """`accuracy_with_hints` above: a benchmark item's `hints` give its numeric tolerance, ranges, gold letter."""
    self._count('calls')
    return base.Verdict(accuracy_with_hints(question, response, answers, hints))

  def query_quality(self, question, tool_calls, results, *, answers=(), response=None):
    """`query_quality` above; `answers` and `response` are not used (a heuristic of the calls alone)."""
    del answers, response
    self._count('calls')
    return base.Verdict(query_quality(tool_calls, results, question))
