"""Stage `filter`: staged difficulty filtering against a policy model (DESIGN.md §7.6; paper Sec. 3: "Filter A
drops items a frozen Qwen3-VL-32B answers without tools, Filter B drops items it answers with one image search").

For every accepted item, with the policy behind an OpenAI-compatible endpoint (`data_pipeline.llm`):
  Filter A  the question + the anchor image, no tools (`PROMPT_A`); a reply the accuracy judge (`osvl_jax.judges`,
            the rule judge by default) scores 1 -> rejected `filter_a_solved`.
  Filter B  (items that pass A) the same plus the text of ONE real `image_search` call on the anchor image
            (`tools.env.ToolEnv`, its top hit; `PROMPT_B`) -> rejected `filter_b_solved` when solved.
A failed request (after the client's retries) or a reply with no parseable answer rejects the item with the
reason (`filter_a_error: connection: ...`, `filter_b_unparseable: ...`): an item the policy was not asked about
cannot be certified as hard. Nothing raises per item. Rejected items are kept with the reason; each record
gets `filter_trace` (JSON text: the filters' parsed answers, judge scores and errors).

Offline default (`base_url = ''`): every accepted item passes, counted as `skipped: no endpoint`. `enabled=False`
(the Table 3a "no filtering" ablation) passes everything, counted as `disabled`.
"""

import asyncio
import json
import os
import pathlib
import re

import ml_collections

from data_pipeline import llm

PROMPT_A = ('Answer the question about the image. Reply with the final answer only, as short as possible, inside '
            '<answer></answer>.\n\nQuestion: {question}')
PROMPT_B = ('An image search for the image returned:\n{search}\n\nAnswer the question about the image. Reply with '
            'the final answer only, as short as possible, inside <answer></answer>.\n\nQuestion: {question}')
_ANSWER = re.compile(r'<answer>(.*?)</answer>', re.S)
_THINK = re.compile(r'<think>.*?(</think>|$)', re.S)


def default_config() -> ml_collections.ConfigDict:
  """`data.filter`: `llm.default_config()` (the policy endpoint and limits) plus:

    enabled: run the filters (False = the Table 3a "no filtering" ablation).
    filter_b: run Filter B on the items that pass Filter A.
    judge: the accuracy judge (`osvl_jax.judges.registry.default_config()`, name 'rule' or 'llm').
  """
  from osvl_jax.judges import registry  # pylint: disable=import-outside-toplevel
  c = llm.default_config()
  c.enabled = True
  c.filter_b = True
  c.judge = registry.default_config()
  return c


def check_config(config: ml_collections.ConfigDict, prefix: str = 'data.filter') -> None:
  """Raises ValueError naming the field: a base_url without a model or not http(s), max_concurrency < 1,
  negative max_retries / max_requests / max_total_tokens, max_tokens < 1."""
  if config.base_url and not re.match(r'https?://', config.base_url):
    raise ValueError(f'{prefix}.base_url={config.base_url!r}: expected an http(s) URL ending in /v1, or ""')
  if config.base_url and not config.model:
    raise ValueError(f'{prefix}.model is empty but {prefix}.base_url={config.base_url!r} is set')
  for field, low in (('max_concurrency', 1), ('max_tokens', 1), ('max_retries', 0), ('max_requests', 0),
                     ('max_total_tokens', 0)):
    value = config[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise ValueError(f'{prefix}.{field}={value!r}: expected an int >= {low}')


def parse_answer(text: str | None) -> tuple[str | None, str | None]:
  """(answer, None) from a policy reply, or (None, why) when it holds none.

  The answer is the last `<answer>...</answer>` span, else the whole reply (a model that ignores the format still
  answers); `<think>` blocks are dropped first. Unparseable: no text, an `<answer>` tag left open, or an empty
  answer.
  """
  if text is None:
    return None, 'no reply'
  text = _THINK.sub('', text)
  spans = _ANSWER.findall(text)
  if spans:
    answer = spans[-1].strip()
  elif '<answer>' in text:
    return None, 'unclosed <answer> tag'
  else:
    answer = text.strip()
  return (answer, None) if answer else (None, 'empty answer')


def _messages(prompt: str, image) -> list[dict]:
  return [{'role': 'user', 'content': [llm.image_part(image), {'type': 'text', 'text': prompt}]}]


async def _ask(client, judge, rec: dict, prompt: str, image, name: str, trace: dict) -> str | None:
  """One filter on one item: the rejection reason (`<name>_solved`, `<name>_error: ...`, `<name>_unparseable:
  ...`) or None (not solved)."""
  reply = await client.chat(_messages(prompt, image))
  if reply.error is not None:
    trace[name] = {'error': reply.error}
    return f'{name}_error: {reply.error}'
  answer, why = parse_answer(reply.text)
  if answer is None:
    trace[name] = {'error': why, 'reply': reply.text[:200]}
    return f'{name}_unparseable: {why}'
  verdict = await asyncio.to_thread(judge.accuracy, rec['question'], answer, list(rec['answers']))
  trace[name] = {'answer': answer[:200], 'score': verdict.score}
  return f'{name}_solved' if verdict.score >= 1 else None


async def _filter_all(records, todo, client, judge, images, searches, filter_b: bool) -> list:
  async def one(i):
    rec, trace = records[i], {}
    reason = await _ask(client, judge, rec, PROMPT_A.format(question=rec['question']), images[i], 'filter_a', trace)
    if reason is None and filter_b:
      found, search = searches[i]
      if not found:  # no hit to give the policy: it was not asked, the item cannot be certified as hard
        return f'filter_b_error: image_search {search}', trace
      prompt = PROMPT_B.format(search=search, question=rec['question'])
      reason = await _ask(client, judge, rec, prompt, images[i], 'filter_b', trace)
    return reason, trace
  try:
    return await asyncio.gather(*(one(i) for i in todo))
  finally:
    await client.aclose()


def _image_search(todo, records, images, tools_config: dict) -> tuple[dict, dict]:
  """Per item, (True, the text of one `image_search` call: `ToolEnv`, top hit) or (False, the error kind when the
  call failed or found nothing), and counts by outcome."""
  from tools import env as env_lib  # pylint: disable=import-outside-toplevel
  env = env_lib.ToolEnv(dict(tools_config, enabled=('image_search',)))
  texts, counts = {}, {'ok': 0, 'no_result': 0, 'error': 0}
  for i in todo:
    result = env.call('image_search', {'image': 'img_1'}, [images[i]])
    found = result.ok and result.error_kind is None
    texts[i] = (True, result.text) if found else (False, result.error_kind or 'error')
    counts['ok' if result.ok and result.error_kind is None else result.error_kind if result.ok else 'error'] += 1
  return texts, counts


def run_filters(records: list[dict], config: ml_collections.ConfigDict, data_dir: str | os.PathLike,
                tools_config: dict | None = None, client=None) -> tuple[list[dict], dict]:
  """Runs Filters A and B over the accepted records (see the module docstring).

  Args:
    records: output of `ground.ground`: dicts with question, answers, image_path (relative to `data_dir`),
      rejected.
    config: `default_config()` fields.
    data_dir: the shared data folder.
    tools_config: partial `tools.env.default_config()` for the image_search call (the build's `data.tools`).
    client: the chat client (None: `llm.AsyncChatClient(config)`; a test double with the same async interface).
  Returns:
    (records with `filter_trace` and the rejections, counts {'in', 'accepted_in', 'skipped_rejected',
    'enabled', 'endpoint', 'skipped' ('no endpoint' / 'disabled' -> n), 'checked', 'passed', 'rejected'
    (reason kind -> n), 'image_search' (outcome -> n), 'llm' (the client's stats)}).
  """
  from osvl_jax.data import pipeline as pipeline_data  # pylint: disable=import-outside-toplevel
  from osvl_jax.judges import registry  # pylint: disable=import-outside-toplevel
  out = [dict(r, filter_trace='') for r in records]
  todo = [i for i, r in enumerate(out) if not r['rejected']]
  counts = {'in': len(out), 'accepted_in': len(todo), 'skipped_rejected': len(out) - len(todo),
            'enabled': bool(config.enabled), 'endpoint': config.base_url if client is None else 'test double',
            'skipped': {}, 'checked': 0, 'passed': 0, 'rejected': {}, 'image_search': {}, 'llm': {}}
  if not config.enabled or (client is None and not config.base_url):
    counts['skipped'] = {'disabled' if not config.enabled else 'no endpoint': len(todo)}
    counts['passed'] = len(todo)
    return out, counts
  images = {i: pipeline_data.load_image(pathlib.Path(data_dir), out[i]['image_path']) for i in todo}
  searches, counts['image_search'] = (_image_search(todo, out, images, tools_config or {}) if config.filter_b
                                      else ({}, {}))
  client = client if client is not None else llm.AsyncChatClient(config)
  judge = registry.get_judge(config.judge)
  results = asyncio.run(_filter_all(out, todo, client, judge, images, searches, config.filter_b))
  for i, (reason, trace) in zip(todo, results):
    out[i]['filter_trace'] = json.dumps(trace, sort_keys=True)
    counts['checked'] += 1
    if reason is None:
      counts['passed'] += 1
      continue
    out[i]['rejected'] = reason
    kind = reason.split(':')[0]
    counts['rejected'][kind] = counts['rejected'].get(kind, 0) + 1
  counts['llm'] = client.stats()
  return out, counts
