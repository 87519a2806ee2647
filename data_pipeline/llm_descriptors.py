"""The LLM steps of stage `rewrite` that choose each hop's descriptor (DESIGN.md §7.4; paper Sec. 3, Eq. 6,
PAPER.md "fuzzy rewriting ... accepted only if the answer is unchanged, the descriptor picks out exactly one
entity, and no name or alias of any path node remains"): an LLM proposes descriptors, the code checks them, and
an LLM judge checks the unique referent at every rewrite step.

`choose_descriptors` runs before `rewrite.rewrite`, on the records of `qa` (each hop's descriptor d is the code's,
verified by `WikiGraph.referent_check` in `paths`):

Proposal  For each hop v(i-1) -> vi of an accepted record the LLM (prompt `descriptor_proposal_v1`) sees vi's
    title, its class d and the lead of its article (`lead_chars`), and replies a JSON list of up to
    `max_candidates` descriptors more specific than d (`parse_candidates`; a reply that is no JSON list of strings
    counts `llm_descriptor: malformed reply`, a failed request `llm_descriptor: request failed`: the hop keeps
    the code's d; [] counts `llm_descriptor: none proposed`, a list whose every candidate fails the checks
    `llm_descriptor: no candidate passed`).
Checks in code (`check_candidate`, the first failure counted by reason, the candidate dropped):
    * (iii) non-leakage: `rewrite.find_leaks` on the phrase against every path node (its aliases, redirects and
      distinctive words, v0 included: `ground` checks the whole path) and the answer -> 'leak';
    * readability: letters, digits, spaces, hyphens and apostrophes only -> 'bad characters'; no 'X or Y' ->
      "'X or Y'"; no relative word (who / whom / that / which / whose / where / when) -> 'relative clause'; at
      most `max_extra_words` words before the class -> 'too long'; the hop's reference built with it passes
      `relations.reading_error` -> 'unreadable';
    * the rule that maps a free-text phrase to a class: the phrase (a leading 'the' / 'a' / 'an' dropped) must END
      WITH the hop's class phrase d (whole words, up to case and accents) and add at least one word before it
      ('communist Caribbean country' for d = 'Caribbean country') -> else 'not more specific'. Such a phrase
      names a subset of d's class, so whatever makes d pick vi out holds for it too: d's competitor count is
      applied unchanged (`WikiGraph.referent_check(v(i-1), vi)` must still give d and the hop's relation ->
      else 'class not verified'): vi is the only entity of d's class v(i-1)'s text names (`mentions.py`) and
      links to, or under `relations.MOST_OFTEN` it dominates the text's mentions of the class; a subset of the
      class keeps both. A head noun that is only evidence for the class ('mausoleum' for 'building',
      `classes.CLASSES`) is NOT accepted: some evidence words are broader than their class ('gas' is evidence
      of 'chemical element', but "the toxic gas" fits carbon monoxide, which the element count never sees);
    * a repeat of an earlier candidate of the hop -> 'duplicate'.
    Whether the added words are true of vi is what the model read in the article; the step judge reads the
    result.
Per-step referent judge  Farthest to nearest (i = h, ..., 1, the order of `rewrite.fuzzy_rewrite`), the hop's
    candidates are tried in order, the passing LLM ones first, then the code's d: the judge (prompt
    `unique_referent_step_v1`) sees the partially rewritten question (`rewrite_trace` after step i, hops > i
    already chosen, v0..v(i-1) still named) and the reference just introduced, and replies
    `{"verdict": "yes" | "no", "reason": ...}` (`llm_questions.parse_verdict`). "yes" fixes the hop's
    descriptor; "no" tries the next candidate; none left -> the item is rejected `unique_referent_step:
    ambiguous (hop i: <reason>)`. A reply without a verdict rejects it `unique_referent_step: unparseable judge
    reply`, a failed request `unique_referent_step: judge error (<error>)` (an item the judge was not asked about
    cannot be certified, as `llm_questions.unique_referent`).
The requests go through one `llm.AsyncChatClient` (its concurrency limit, retries, budgets): all proposals at
once, then every record's steps (in order within a record, records concurrently). Nothing raises per item.

Offline (`base_url = ''`), `enabled = False` or `data.rewrite = False`, nothing is asked and the records come back
unchanged (a build without an endpoint is the build without this module, record for record), counted as
`skipped`. After an online run each record also has `descriptor_sources` ([h] 'llm' | 'code'; [] when not asked)
and `descriptor_checks` (JSON text, per hop {'code', 'proposed', 'refused' [[phrase, why]], 'error', 'judged'
[[phrase, 'yes' | 'no', reason]]}; '' when not asked).
"""

import asyncio
import json
import re

import ml_collections

from data_pipeline import entities
from data_pipeline import filter as filter_lib
from data_pipeline import llm
from data_pipeline import llm_questions
from data_pipeline import relations
from data_pipeline import rewrite

_DETERMINER = re.compile(r'^(?:the|a|an)\s+', re.I)
_CHARACTERS = re.compile(r"[^\W_]|[\s'’-]")
_RELATIVE = frozenset('who whom that which whose where when'.split())


def default_config() -> ml_collections.ConfigDict:
  """`data.llm_descriptors`: `llm.default_config()` (endpoint, concurrency, retries, request / token budgets) plus:

    enabled: ask the LLM (False = the code's descriptors, nothing judged).
    proposal_prompt: versioned prompt of the descriptor proposal (`osvl_jax/judges/prompts`).
    judge_prompt: versioned prompt of the per-step unique-referent judge.
    max_candidates: descriptors read from a proposal reply at most (the rest ignored).
    max_extra_words: words a descriptor may add before its class phrase.
    lead_chars: characters of the article's start shown with the title.
  """
  c = llm.default_config()
  c.max_tokens = 160
  c.enabled = True
  c.proposal_prompt = 'descriptor_proposal_v1'
  c.judge_prompt = 'unique_referent_step_v1'
  c.max_candidates = 3
  c.max_extra_words = 3
  c.lead_chars = 1500
  return c


def check_config(config: ml_collections.ConfigDict, prefix: str = 'data.llm_descriptors') -> None:
  """Raises ValueError naming the field: the endpoint fields as `filter.check_config`, enabled not a bool, an
  unknown prompt, max_candidates / max_extra_words not ints >= 1, lead_chars not an int >= 200."""
  from osvl_jax.judges import prompts  # pylint: disable=import-outside-toplevel
  filter_lib.check_config(config, prefix)
  if not isinstance(config.enabled, bool):
    raise ValueError(f'{prefix}.enabled={config.enabled!r}: expected True or False')
  for field in ('proposal_prompt', 'judge_prompt'):
    try:
      prompts.resolve(config[field])
    except ValueError as e:
      raise ValueError(f'{prefix}.{field}={config[field]!r}: {e}') from e
  for field, low in (('max_candidates', 1), ('max_extra_words', 1), ('lead_chars', 200)):
    value = config[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise ValueError(f'{prefix}.{field}={value!r}: expected an int >= {low}')


def parse_candidates(reply: str | None, max_candidates: int) -> tuple[list[str] | None, str]:
  """(candidates, '') from a proposal reply, or (None, why) when it is malformed.

  The reply must be one JSON list of strings (a ```json fence and `<think>` blocks allowed; [] = no candidate);
  the first `max_candidates` are kept, spaces collapsed, empty strings dropped. Reasons: 'no reply', 'not JSON',
  'not a list of strings'.
  """
  if reply is None:
    return None, 'no reply'
  text = llm_questions.json_text(reply)
  try:
    data = json.loads(text)
  except json.JSONDecodeError:
    return None, 'not JSON'
  if not isinstance(data, list) or not all(isinstance(d, str) for d in data):
    return None, 'not a list of strings'
  return [' '.join(d.split()) for d in data if d.strip()][:max_candidates], ''


def check_candidate(phrase: str, hop: int, rec: dict, graph, persons: list[bool],
                    max_extra_words: int) -> tuple[str | None, str]:
  """(descriptor, '') when an LLM phrase may stand for the hop's class phrase, else (None, why) (module docstring).

  Args:
    phrase: the proposed descriptor, e.g. 'the communist Caribbean country'.
    hop: i in 1..h (the hop v(i-1) -> vi).
    rec: the record: path [titles v0..vh], descriptors [h] (the code's), relations [h], answers.
    graph: the `wiki_graph.WikiGraph`.
    persons: [h] whether vi is a person.
    max_extra_words: words the phrase may add before the class phrase.
  Returns:
    The descriptor is the phrase without its leading determiner ('communist Caribbean country'). Reasons
    ('<kind> (<detail>)'): 'leak', 'bad characters', "'X or Y'", 'relative clause', 'not more specific',
    'too long', 'unreadable', 'class not verified'.
  """
  path, d, rel = rec['path'], rec['descriptors'][hop - 1], rec['relations'][hop - 1]
  phrase = _DETERMINER.sub('', ' '.join(phrase.split()))
  leaks = rewrite.find_leaks(phrase, path, graph, rec['answers'])
  if leaks:
    return None, f'leak ({leaks[0]})'
  bad = sorted({c for c in phrase if not _CHARACTERS.fullmatch(c)})
  if bad:
    return None, f'bad characters ({"".join(bad)!r})'
  words = entities.name_tokens(phrase)
  if 'or' in words:
    return None, f"'X or Y' ({phrase!r})"
  if _RELATIVE & (set(words) - set(entities.name_tokens(d))):
    return None, f'relative clause ({phrase!r})'
  head = entities.name_tokens(d)
  if class_of(phrase, [d]) is None or len(words) == len(head):
    return None, f'not more specific ({phrase!r} does not end with more words before {d!r})'
  if len(words) - len(head) > max_extra_words:
    return None, f'too long ({len(words) - len(head)} words before {d!r}, at most {max_extra_words})'
  why = rewrite.reading_error([phrase], [rel], [persons[hop - 1]])
  if why:
    return None, f'unreadable ({why})'
  if graph.referent_check(path[hop - 1], path[hop])[:2] != (d, rel):
    return None, f'class not verified ({d!r} does not pick {path[hop]} out)'
  return phrase, ''


def class_of(phrase: str, class_phrases) -> str | None:
  """The longest of `class_phrases` that `phrase` ends with (whole words, up to case and accents, the phrase itself
  included), or None: the class an accepted descriptor is counted in ('communist Caribbean country' ->
  'Caribbean country' of ('Latin American country', 'Caribbean country', 'country')).

  Args:
    phrase: a descriptor, e.g. 'communist Caribbean country'.
    class_phrases: class phrases, e.g. `WikiGraph.descriptors(title)`.
  """
  words = entities.name_tokens(phrase)
  ends = [c for c in class_phrases if (head := entities.name_tokens(c)) and words[-len(head):] == head]
  return max(ends, key=lambda c: len(entities.name_tokens(c)), default=None)


def proposal_prompt(template: str, graph, title: str, descriptor: str, config) -> str:
  """The proposal prompt of one hop: vi's display name, its class phrase, the lead of its article."""
  lead = ' '.join(graph.text(title)[:int(config.lead_chars)].split())
  return template.format(title=entities.display(title), descriptor=descriptor, lead=lead,
                         max_candidates=int(config.max_candidates), max_extra_words=int(config.max_extra_words))


def _hop_candidates(reply: llm.Reply, hop: int, rec: dict, graph, persons: list[bool], config,
                    counts: dict) -> tuple[list[str], dict]:
  """(the LLM descriptors of one hop that pass `check_candidate`, in the reply's order; the hop's check record
  {'code', 'proposed', 'refused', 'error', 'judged'}), each refusal and fallback counted in `counts`."""
  check = {'code': rec['descriptors'][hop - 1], 'proposed': [], 'refused': [], 'error': '', 'judged': []}
  found = []
  if reply.error is not None:
    check['error'] = f'llm_descriptor: request failed ({reply.error})'
  else:
    proposed, why = parse_candidates(reply.text, int(config.max_candidates))
    check['proposed'] = proposed or []
    for phrase in check['proposed']:
      got, why_not = check_candidate(phrase, hop, rec, graph, persons, int(config.max_extra_words))
      if got is not None and got.lower() in (f.lower() for f in found):
        got, why_not = None, f'duplicate ({got!r})'
      if got is None:
        check['refused'].append([phrase, why_not])
        llm_questions.count_reason(counts, 'refused', f'llm_descriptor: {why_not}')
      else:
        found.append(got)
    check['error'] = ('llm_descriptor: malformed reply (' + why + ')' if proposed is None
                      else 'llm_descriptor: none proposed' if not proposed
                      else 'llm_descriptor: no candidate passed' if not found else '')
  if check['error']:
    llm_questions.count_reason(counts, 'fallback', check['error'])
  counts['proposed'] += len(check['proposed'])
  counts['passed'] += len(found)
  return found, check


async def _judge_record(client, template: str, rec: dict, candidates: list[list[str]], persons: list[bool],
                        checks: list[dict]) -> tuple[list[str] | None, str]:
  """(chosen descriptors [h], '') after the per-step judge said 'yes' at every step, else (None, rejection)."""
  path, h = rec['path'], len(rec['path']) - 1
  chosen = list(rec['descriptors'])
  for i in range(h, 0, -1):
    reason = ''
    for cand in candidates[i - 1]:
      chosen[i - 1] = cand
      _, trace = rewrite.fuzzy_rewrite(path, chosen, rec['answer_attribute'], rec['relations'], persons)
      phrase = relations.reference(rec['relations'][i - 1], cand, entities.display(path[i - 1]), persons[i - 1])
      reply = await client.chat([{'role': 'user', 'content': template.format(question=trace[h - i + 1],
                                                                              phrase=phrase)}])
      if reply.error is not None:
        return None, f'unique_referent_step: judge error ({reply.error})'
      unique, reason = llm_questions.parse_verdict(reply.text)
      if unique is None:
        return None, 'unique_referent_step: unparseable judge reply'
      checks[i - 1]['judged'].append([cand, 'yes' if unique else 'no', reason])
      if unique:
        break
    else:
      return None, f'unique_referent_step: ambiguous (hop {i}: {reason or "no reason given"})'
  return chosen, ''


def choose_descriptors(records: list[dict], graph, config: ml_collections.ConfigDict, rewrite_enabled: bool = True,
                       client=None) -> tuple[list[dict], dict]:
  """Each accepted record's descriptors proposed by the LLM, checked in code and judged per step (module docstring).

  Args:
    records: output of `qa.add_qa` (path, descriptors, relations, answer_attribute, answers, rejected).
    graph: the `wiki_graph.WikiGraph`.
    config: `default_config()` fields.
    rewrite_enabled: `data.rewrite` (False: no descriptor reaches the question; nothing asked).
    client: the chat client (None: `llm.AsyncChatClient(config)`; a test double with its async interface).
  Returns:
    (records: unchanged when nothing is asked; else with the chosen `descriptors`, `descriptor_sources`,
    `descriptor_checks` and the rejections; counts {'in', 'accepted_in', 'skipped_rejected', 'endpoint',
    'skipped' ('no endpoint' / 'disabled' / 'rewrite disabled' -> n), 'hops', 'proposed' (candidates read),
    'passed' (candidates that passed the checks), 'refused' ('llm_descriptor: <kind>' -> candidates),
    'fallback' ('llm_descriptor: malformed reply' / 'request failed' / 'none proposed' / 'no candidate passed' ->
    hops left with the code's descriptor only), 'judged_steps' (verdicts read), 'used' ({'llm', 'code'} -> hops of
    the accepted items), 'rejected' ('unique_referent_step: <kind>' -> n), 'llm' (the client's stats)}).
  """
  from osvl_jax.judges import prompts  # pylint: disable=import-outside-toplevel
  todo = [i for i, r in enumerate(records) if not r.get('rejected')]
  counts = {'in': len(records), 'accepted_in': len(todo), 'skipped_rejected': len(records) - len(todo),
            'endpoint': config.base_url if client is None else 'test double', 'skipped': {}}
  off = ('disabled' if not config.enabled else 'no endpoint' if client is None and not config.base_url
         else 'rewrite disabled' if not rewrite_enabled else '')
  if off:
    counts['skipped'] = {off: len(todo)}
    return records, counts
  out = [dict(r, descriptor_sources=[], descriptor_checks='') for r in records]
  hops = [(i, k) for i in todo for k in range(1, len(out[i]['path']))]
  counts.update(hops=len(hops), proposed=0, passed=0, refused={}, fallback={}, judged_steps=0,
                used={'llm': 0, 'code': 0}, rejected={})
  persons = {i: [graph.domain(t) == 'Person' for t in out[i]['path'][1:]] for i in todo}
  proposal = prompts.load(config.proposal_prompt)
  judge = prompts.load(config.judge_prompt)
  client = client if client is not None else llm.AsyncChatClient(config)

  async def run():
    async def ask(content):
      return await client.chat([{'role': 'user', 'content': content}])
    try:
      replies = await asyncio.gather(*(ask(proposal_prompt(proposal, graph, out[i]['path'][k],
                                                           out[i]['descriptors'][k - 1], config)) for i, k in hops))
      candidates, checks = {}, {}
      for (i, k), reply in zip(hops, replies):
        found, check = _hop_candidates(reply, k, out[i], graph, persons[i], config, counts)
        candidates.setdefault(i, []).append(found + [check['code']])
        checks.setdefault(i, []).append(check)
      judged = await asyncio.gather(*(_judge_record(client, judge, out[i], candidates[i], persons[i], checks[i])
                                      for i in todo))
      return checks, judged
    finally:
      await client.aclose()

  checks, judged = asyncio.run(run())
  for i, (chosen, why) in zip(todo, judged):
    rec = out[i]
    counts['judged_steps'] += sum(len(c['judged']) for c in checks[i])
    rec['descriptor_checks'] = json.dumps(checks[i])
    if chosen is None:
      rec['rejected'] = why
      llm_questions.count_reason(counts, 'rejected', why)
      continue
    rec['descriptor_sources'] = ['code' if d == c['code'] else 'llm' for d, c in zip(chosen, checks[i])]
    rec['descriptors'] = chosen
    for source in rec['descriptor_sources']:
      counts['used'][source] += 1
  counts['llm'] = client.stats()
  return out, counts
