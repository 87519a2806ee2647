"""The LLM steps of stages `qa` and `rewrite` (DESIGN.md §7.3-7.4; paper Sec. 3, Eq. 6): the canonical question
written by an LLM, and the unique-referent judge of invariant (ii).

`canonical_questions`  For every accepted record, the LLM (prompt `canonical_question_v1`) writes one fluent
    question that names every path node and asks for the answer attribute of vh. The reply is checked in code
    (`check_question`): a `<question>` span, one question (exactly one `?`, at its end), every path node named
    (one of its aliases, by `entities.names_in_text`), the answer and its aliases absent. A
    failed request or a reply that fails a check keeps the template question (the offline default,
    `qa.canonical_question`) and counts the reason `llm_question: <why>`.
`unique_referent`  Eq. 6 (ii): the judge (prompt `unique_referent_v1`) sees ONLY the rewritten question and replies
    `{"verdict": "yes" | "no", "reason": ...}` (`parse_verdict`, the verdict read by the house parser
    `osvl_jax.judges.llm.parse_binary`). "no" rejects the item `unique_referent: ambiguous (<reason>)`; a reply
    without a verdict `unique_referent: unparseable judge reply`; a failed request `unique_referent: judge error
    (<error>)` (an item the judge was not asked about cannot be certified unique, as in `filter.py`).
`obfuscate_answers`  Eq. 6's occasional answer obfuscation (no LLM): a seeded `obfuscate_fraction` of the
    accepted year questions ask for a derived form, the decade ("What is the birth year of X?" -> "In which decade
    was X born?", answer `1889` -> `1880s`), recorded in `answer_form`.
The two LLM steps send every request concurrently through `llm.AsyncChatClient` (its concurrency limit, retries,
request and token budgets); nothing raises per item. Offline (`base_url = ''`) or `enabled = False`, nothing is
asked: the template questions are kept and no item is judged, counted as `skipped`.
"""

import asyncio
import json
import re

import ml_collections
import numpy as np

from data_pipeline import entities
from data_pipeline import filter as filter_lib
from data_pipeline import llm

_THINK = re.compile(r'<think>.*?(</think>|$)', re.S | re.I)
_QUESTION = re.compile(r'<question>(.*?)</question>', re.S | re.I)
_FENCE = re.compile(r'^```(?:json)?\s*|\s*```$')


def default_config() -> ml_collections.ConfigDict:
  """`data.llm_questions`: `llm.default_config()` (endpoint, concurrency, retries, request / token budgets) plus:

    enabled: ask the LLM (False = template questions, nothing judged).
    canonical_prompt: versioned prompt of the question writer (`osvl_jax/judges/prompts`).
    judge_prompt: versioned prompt of the unique-referent judge.
    judge_field: the record field the judge reads (the rewritten question).
    max_question_chars: longest accepted LLM question, characters.
    obfuscate_fraction: share of the accepted year questions asked for the decade instead (0 = never).
  """
  c = llm.default_config()
  c.max_tokens = 160
  c.enabled = True
  c.canonical_prompt = 'canonical_question_v1'
  c.judge_prompt = 'unique_referent_v1'
  c.judge_field = 'question'
  c.max_question_chars = 400
  c.obfuscate_fraction = 0.0
  return c


def check_config(config: ml_collections.ConfigDict, prefix: str = 'data.llm_questions') -> None:
  """Raises ValueError naming the field: the endpoint fields as `filter.check_config`, an unknown prompt, an empty
  judge_field, max_question_chars < 20, obfuscate_fraction outside [0, 1]."""
  from osvl_jax.judges import prompts  # pylint: disable=import-outside-toplevel
  filter_lib.check_config(config, prefix)
  for field in ('canonical_prompt', 'judge_prompt'):
    try:
      prompts.resolve(config[field])
    except ValueError as e:
      raise ValueError(f'{prefix}.{field}={config[field]!r}: {e}') from e
  if not isinstance(config.judge_field, str) or not config.judge_field:
    raise ValueError(f'{prefix}.judge_field={config.judge_field!r}: expected a record field name')
  if isinstance(config.max_question_chars, bool) or not isinstance(config.max_question_chars, int) or (
      config.max_question_chars < 20):
    raise ValueError(f'{prefix}.max_question_chars={config.max_question_chars!r}: expected an int >= 20')
  f = config.obfuscate_fraction
  if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= 1:
    raise ValueError(f'{prefix}.obfuscate_fraction={f!r}: expected a fraction in [0, 1]')


def names_node(question: str, title: str, aliases=entities.aliases) -> bool:
  """Whether `question` names the article `title`: one of `aliases(title)` occurs in it by the house name matcher
  `entities.names_in_text` (up to case, diacritics, punctuation and spacing; whole tokens), the rule of the
  leak check `rewrite.find_leaks`. `aliases`: title -> names (`entities.aliases`, or a graph's redirect-aware
  `aliases`)."""
  return bool(entities.names_in_text(question, aliases(title)))


def check_question(reply: str | None, path: list[str], answers: list[str], max_chars: int = 400,
                   aliases=entities.aliases) -> tuple[str | None, str | None]:
  """(question, None) when an LLM reply is an acceptable canonical question, else (None, why).

  Args:
    reply: the reply text (None: no reply).
    path: titles v0..vh, e.g. ['Taj_Mahal', 'Luftwaffe', 'Adolf_Hitler'].
    answers: the answer and its aliases.
    max_chars: longest accepted question, characters.
    aliases: title -> names, for `names_node`.
  Returns:
    The question is the last `<question>` span (`<think>` dropped, spaces collapsed). Reasons: 'no reply', 'no
    <question> tag', 'unclosed <question> tag', 'empty question', 'not one question (...)' (not exactly one `?`,
    at the end), 'too long (n chars)', 'misses a path node (<title>)', 'contains the answer (<alias>)'.
  """
  if reply is None:
    return None, 'no reply'
  text = _THINK.sub('', reply)
  spans = _QUESTION.findall(text)
  if not spans:
    return None, 'unclosed <question> tag' if re.search(r'<question>', text, re.I) else 'no <question> tag'
  question = ' '.join(spans[-1].split())
  if not question:
    return None, 'empty question'
  if question.count('?') != 1 or not question.endswith('?'):
    return None, f'not one question ({question.count("?")} question marks, ends with {question[-1]!r})'
  if len(question) > max_chars:
    return None, f'too long ({len(question)} chars)'
  missing = [t for t in path if not names_node(question, t, aliases)]
  if missing:
    return None, f'misses a path node ({missing[0]})'
  leaks = entities.names_in_text(question, [a for a in answers if a])
  if leaks:
    return None, f'contains the answer ({leaks[0]!r})'
  return question, None


def parse_verdict(reply: str | None) -> tuple[bool | None, str]:
  """(unique, reason) from a unique-referent judge reply; (None, why) when it holds no verdict.

  The reply is `{"verdict": "yes" | "no", "reason": "..."}` (a ```json fence and `<think>` blocks allowed); the
  verdict is read by `osvl_jax.judges.llm.parse_binary` (its JSON `verdict` field, or a reply that is only
  `yes` / `no`); the reason is the JSON `reason` field ('' when absent).
  """
  from osvl_jax.judges import llm as judge_llm  # pylint: disable=import-outside-toplevel
  if reply is None:
    return None, 'no reply'
  text = json_text(reply)
  try:
    verdict = judge_llm.parse_binary(text)
  except judge_llm.JudgeParseError as e:
    return None, str(e)
  try:
    data = json.loads(text)
  except json.JSONDecodeError:
    data = None
  reason = str(data.get('reason', '')) if isinstance(data, dict) else ''
  return verdict >= 1.0, ' '.join(reason.split())[:200]


def json_text(reply: str) -> str:
  """A reply's text with its `<think>` blocks and a ```json fence removed: the JSON it holds, if any."""
  return _FENCE.sub('', _THINK.sub('', reply).strip())


def count_reason(counts: dict, key: str, reason: str) -> None:
  """counts[key][kind] += 1, the kind being `reason` up to its ' (<detail>)'."""
  kind = reason.split(' (')[0]
  counts[key][kind] = counts[key].get(kind, 0) + 1


def _start(records: list[dict], config, client, field: str, fill: str) -> tuple[list[dict], list[int], dict]:
  """Copies of the records with `field` = `fill`, the indices of the accepted ones, and the common counts; the
  counts say 'skipped' ('no endpoint' / 'disabled' -> n) when nothing is to be asked."""
  out = [dict(r, **{field: fill}) for r in records]
  todo = [i for i, r in enumerate(out) if not r.get('rejected')]
  counts = {'in': len(out), 'accepted_in': len(todo), 'skipped_rejected': len(out) - len(todo),
            'endpoint': config.base_url if client is None else 'test double', 'skipped': {}, 'llm': {}}
  if not config.enabled or (client is None and not config.base_url):
    counts['skipped'] = {'disabled' if not config.enabled else 'no endpoint': len(todo)}
  return out, todo, counts


async def _ask_all(client, prompts_by_index: dict[int, str]) -> dict:
  """Index -> `llm.Reply` for every prompt, sent concurrently (the client bounds the concurrency)."""
  async def one(i):
    return i, await client.chat([{'role': 'user', 'content': prompts_by_index[i]}])
  try:
    return dict(await asyncio.gather(*(one(i) for i in prompts_by_index)))
  finally:
    await client.aclose()


def _require(rec: dict, fields: tuple[str, ...], stage: str) -> None:
  missing = [f for f in fields if f not in rec]
  if missing:
    raise ValueError(f'{stage}: record {rec.get("prompt_id", "?")!r} has no field(s) {missing}')


def canonical_prompt(rec: dict, template: str) -> str:
  """The question writer's prompt for one record: the chain v0..vh, each node with its descriptor and the hop's
  relation when present ('2. Ustad Ahmad Lahauri (an architect; Taj Mahal designed by Ustad Ahmad Lahauri)'), the
  attribute question about vh, the template question."""
  names = [entities.display(t) for t in rec['path']]
  descriptors = list(rec.get('descriptors') or [])
  relations = list(rec.get('relations') or [])
  lines = []
  for k, name in enumerate(names):
    d = descriptors[k - 1] if 0 < k <= len(descriptors) else ''
    notes = [('an ' if d[:1].lower() in 'aeiou' else 'a ') + d] if d else []
    if 0 < k <= len(relations) and relations[k - 1]:
      notes.append(f'{names[k - 1]} {relations[k - 1]} {name}')   # 'v(i-1) <relation> vi', `relations.py`
    lines.append(f'{k + 1}. {name}' + (f' ({"; ".join(notes)})' if notes else ''))
  ask = entities.ATTRIBUTE_BY_NAME[rec['answer_attribute']].question.format(names[-1])
  return template.format(chain='\n'.join(lines), ask=ask[:1].upper() + ask[1:], template=rec['canonical_question'])


def canonical_questions(records: list[dict], config: ml_collections.ConfigDict, client=None,
                        aliases=entities.aliases) -> tuple[list[dict], dict]:
  """Replaces the template canonical question of each accepted record by the LLM's, when it passes the checks.

  Args:
    records: output of `qa.add_qa`: path [titles], answer_attribute, answers, canonical_question (the
      template one), rejected; descriptors / relations per hop when present.
    config: `default_config()` fields.
    client: the chat client (None: `llm.AsyncChatClient(config)`; a test double with its async interface).
    aliases: title -> names a question may name it by (`entities.aliases`; the stage passes the graph's
      redirect-aware `aliases`).
  Returns:
    (records with `canonical_question` and `canonical_question_source` ('llm', 'template: <why>', '' when
    rejected), counts {'in', 'accepted_in', 'skipped_rejected', 'endpoint', 'skipped', 'llm_written',
    'fallback' ('llm_question: <why>' kind -> n), 'llm' (the client's stats)}).
  Raises:
    ValueError: an accepted record lacks one of the fields above (naming it and the record).
  """
  from osvl_jax.judges import prompts  # pylint: disable=import-outside-toplevel
  out, todo, counts = _start(records, config, client, 'canonical_question_source', '')
  counts.update(llm_written=0, fallback={})
  for i in todo:
    _require(out[i], ('path', 'answer_attribute', 'answers', 'canonical_question'), 'canonical_questions')
  if counts['skipped']:
    for i in todo:
      out[i]['canonical_question_source'] = f'template: {next(iter(counts["skipped"]))}'
    return out, counts
  template = prompts.load(config.canonical_prompt)
  client = client if client is not None else llm.AsyncChatClient(config)
  replies = asyncio.run(_ask_all(client, {i: canonical_prompt(out[i], template) for i in todo}))
  for i in todo:
    rec, reply = out[i], replies[i]
    if reply.error is not None:
      why = f'llm_question: request failed ({reply.error})'
    else:
      question, why = check_question(reply.text, rec['path'], rec['answers'], config.max_question_chars, aliases)
      if question is not None:
        rec.update(canonical_question=question, canonical_question_source='llm')
        counts['llm_written'] += 1
        continue
      why = f'llm_question: {why}'
    rec['canonical_question_source'] = f'template: {why}'
    count_reason(counts, 'fallback', why)
  counts['llm'] = client.stats()
  return out, counts


def unique_referent(records: list[dict], config: ml_collections.ConfigDict,
                    client=None) -> tuple[list[dict], dict]:
  """Eq. 6 (ii): asks the judge, given only the question, whether it has exactly one referent; rejects the rest.

  Args:
    records: records with `config.judge_field` (the rewritten question) and rejected.
    config: `default_config()` fields.
    client: the chat client (None: `llm.AsyncChatClient(config)`; a test double with its async interface).
  Returns:
    (records with `referent_verdict` (JSON text {'verdict', 'reason'} or {'error', 'reply'}; '' when not
    judged) and the rejections, counts {'in', 'accepted_in', 'skipped_rejected', 'endpoint', 'skipped',
    'judged', 'unique', 'rejected' ('unique_referent: <kind>' -> n), 'llm'}).
  Raises:
    ValueError: an accepted record lacks `config.judge_field` or has an empty one (naming the record).
  """
  from osvl_jax.judges import prompts  # pylint: disable=import-outside-toplevel
  out, todo, counts = _start(records, config, client, 'referent_verdict', '')
  counts.update(judged=0, unique=0, rejected={})
  for i in todo:
    _require(out[i], (config.judge_field,), 'unique_referent')
    if not str(out[i][config.judge_field]).strip():
      raise ValueError(f'unique_referent: record {out[i].get("prompt_id", "?")!r} has an empty '
                       f'{config.judge_field!r}')
  if counts['skipped']:
    return out, counts
  template = prompts.load(config.judge_prompt)
  client = client if client is not None else llm.AsyncChatClient(config)
  replies = asyncio.run(_ask_all(client, {i: template.format(question=out[i][config.judge_field]) for i in todo}))
  for i in todo:
    rec, reply = out[i], replies[i]
    counts['judged'] += 1
    if reply.error is not None:
      rec['referent_verdict'] = json.dumps({'error': reply.error})
      rec['rejected'] = f'unique_referent: judge error ({reply.error})'
    else:
      unique, reason = parse_verdict(reply.text)
      if unique is None:
        rec['referent_verdict'] = json.dumps({'error': reason, 'reply': reply.text[:200]})
        rec['rejected'] = 'unique_referent: unparseable judge reply'
      else:
        rec['referent_verdict'] = json.dumps({'verdict': 'yes' if unique else 'no', 'reason': reason})
        if unique:
          counts['unique'] += 1
          continue
        rec['rejected'] = f'unique_referent: ambiguous ({reason or "no reason given"})'
    count_reason(counts, 'rejected', rec['rejected'])
  counts['llm'] = client.stats()
  return out, counts


# Attribute -> the question asking for the decade of its year; '{}' = the reference to vh.
DECADE_QUESTIONS = {'born': 'in which decade was {} born?', 'died': 'in which decade did {} die?',
                    'founded': 'in which decade was {} founded?'}


def decade(year: str) -> str | None:
  """'1889' -> '1880s', '987' -> '980s'; None for anything else (BC years, non-years)."""
  return f'{year[:-1]}0s' if re.fullmatch(r'[1-9]\d{2,3}', year) else None


def decade_question(question: str, attribute: str) -> str | None:
  """The decade form of an attribute question ('What is the birth year of X?' -> 'In which decade was X born?'),
  or None when `question` is not `entities.ATTRIBUTE_BY_NAME[attribute].question` about some X."""
  head, tail = entities.ATTRIBUTE_BY_NAME[attribute].question.split('{}')
  if attribute not in DECADE_QUESTIONS or not question.lower().startswith(head) or not question.endswith(tail):
    return None
  out = DECADE_QUESTIONS[attribute].format(question[len(head):len(question) - len(tail)])
  return out[:1].upper() + out[1:]


def obfuscate_answers(records: list[dict], fraction: float, seed: int) -> tuple[list[dict], dict]:
  """Eq. 6's occasional answer obfuscation: a seeded share of the accepted year questions ask for the decade.

  Args:
    records: output of `rewrite.rewrite` (question_template, question, answer_attribute, answers, rejected).
    fraction: probability that an obfuscatable record is obfuscated, in [0, 1].
    seed: record i draws from `default_rng([seed, 6, i])` (the same records on every run).
  Returns:
    (records with `answer_form` ('' or 'decade') and, when obfuscated, the decade question_template / question
    (appended to rewrite_trace), answers [decade, 'the ' + decade] and `original_answers`; counts {'in',
    'obfuscated', 'not_obfuscatable' (accepted, not a plain AD year question), 'kept'}).
  Raises:
    ValueError: fraction outside [0, 1].
  """
  if not 0 <= fraction <= 1:
    raise ValueError(f'fraction={fraction!r}: expected a fraction in [0, 1]')
  out, counts = [], {'in': len(records), 'obfuscated': 0, 'not_obfuscatable': 0, 'kept': 0}
  for i, rec in enumerate(records):
    rec = dict(rec, answer_form='', original_answers=list(rec.get('answers') or []))
    out.append(rec)
    if rec.get('rejected'):
      continue
    draw = np.random.default_rng([seed, 6, i]).random()
    attribute, answers = rec['answer_attribute'], rec['answers']
    form = decade(answers[0]) if attribute in DECADE_QUESTIONS and answers else None
    new = [decade_question(rec[f], attribute) for f in ('question_template', 'question')] if form else [None]
    if None in new:
      counts['not_obfuscatable'] += 1
      continue
    if draw >= fraction:
      counts['kept'] += 1
      continue
    rec.update(question_template=new[0], question=new[1], answers=[form, f'the {form}'], answer_form='decade',
               rewrite_trace=list(rec.get('rewrite_trace') or []) + [new[1]])
    counts['obfuscated'] += 1
  return out, counts
