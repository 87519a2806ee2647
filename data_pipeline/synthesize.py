"""Stage `synthesize`: the oracle expert, SFT trajectories with real tool calls (DESIGN.md §7.8).

The oracle is a policy engine (`OracleEngine`, an `osvl_jax.rollout.engine.Engine`) run by the one agent loop
(`osvl_jax.rollout.agent_loop.run_episodes`) against the real tool environment. It knows the path v0 -> ... -> vh
and walks it, deciding each next action from the observations in its context:

  step 0      image_search(img_1)                         -> must name v0 (its article title)
  hop i       text_search("{v(i-1)} {descriptor of vi}")  -> must name vi; if not, one refinement:
              text_search("{v(i-1)} {3 context words}")      words around vi's mention in v(i-1)'s text
  answer      text_search("{vh} {attribute phrase}")      -> must contain the answer; same refinement with the
                                                             words around the answer in vh's infobox
  last step   <response>{answer}</response>

Every assistant turn is `render_assistant_text(think, tool_call=...)` with a short templated think, emitted as
`tokenizer.encode(text) + [<|im_end|>]` (all gen_mask 1, no log-probs: the ids `append_assistant_text` would
write), every observation the real `ToolResult`. When a check fails the oracle gives up (a final response saying
so) and records why in `OracleEngine.outcomes`. A trajectory is kept only when the process check passes (each
search result actually contains the entity of the next hop, the final search the answer) and the final response
equals the answer; otherwise the reason is counted (`sft_rejects` in the stats). Refinement queries use the
oracle's knowledge of the text around the next entity (its name is never in the query), the way an expert who
has read the article would narrow a search; they make the trajectories longer, as the paper's (6.3 tool turns on
average).
"""

import dataclasses
import re
import time
from collections.abc import Mapping, Sequence

import numpy as np

from data_pipeline import entities
from osvl_jax import trajectory as traj_lib
from osvl_jax.data import pipeline as pipeline_data
from osvl_jax.rollout import agent_loop
from osvl_jax.rollout import engine as engine_lib

# Attribute -> words the expert uses to search for it and to say it.
ATTRIBUTE_PHRASES: dict[str, str] = {
    'capital': 'capital',
    'currency': 'currency',
    'author': 'author',
    'largest_city': 'largest city',
    'constellation': 'constellation',
    'country': 'country',
    'born': 'birth year',
    'died': 'year of death',
    'founded': 'founding year',
    'calling_code': 'calling code',
    'tld': 'internet domain',
}
# Search words for the attribute (the infobox key words the snippet window should land on).
ATTRIBUTE_QUERY: dict[str, str] = {
    'capital': 'capital', 'currency': 'currency', 'author': 'author', 'largest_city': 'largest city',
    'constellation': 'constellation', 'country': 'country', 'born': 'born', 'died': 'died',
    'founded': 'founded', 'calling_code': 'calling code', 'tld': 'internet TLD',
}
_QUERY_STOPWORDS = frozenset((
    'that this with from were which their there these those have been also into about after before other '
    'than when where while would could should such them they more most some many only over under between '
    'during through first since among being against what article wikipedia'
).split())


def contains_name(text: str, title: str) -> bool:
  """Whether `text` names `title` (an alias as whole words, folded) or contains the raw title (`Taj_Mahal`)."""
  if title in text:
    return True
  hay = ' '.join(entities.fold(text).split())
  return any(re.search(r'(?<!\w)' + re.escape(entities.fold(n)) + r'(?!\w)', hay) for n in entities.aliases(title))


def contains_answer(text: str, answers: list[str]) -> bool:
  hay = ' '.join(entities.fold(text).split())
  return any(a and re.search(r'(?<!\w)' + re.escape(entities.fold(a)) + r'(?!\w)', hay) for a in answers)


def context_words(text: str, target_names: list[str], exclude: list[str], k: int = 3, radius: int = 60) -> list[str]:
  """Up to `k` content words within `radius` characters of the first mention of a target name.

  Args:
    text: article text.
    target_names: surface forms to locate (the next entity's aliases, or the answer).
    exclude: names whose words must not appear in the result (the target, the source article).
    k: number of words.
    radius: characters each side of the mention.
  Returns:
    Folded words (>= 4 letters, no stopwords, no excluded words), longest first; [] when no mention is found.
  """
  hay = ' '.join(entities.fold(text).split())
  m = None
  for n in target_names:
    m = re.search(r'(?<!\w)' + re.escape(entities.fold(n)) + r'(?!\w)', hay)
    if m:
      break
  if m is None:
    return []
  bad = {w for n in list(target_names) + list(exclude) for w in re.findall(r'[^\W_]+', entities.fold(n))}
  words = re.findall(r'[^\W\d_]{4,}', hay[max(0, m.start() - radius):m.end() + radius])
  words = [w for w in dict.fromkeys(words) if w not in bad and w not in _QUERY_STOPWORDS]
  return sorted(words, key=len, reverse=True)[:k]


load_image = pipeline_data.load_image
GIVE_UP_RESPONSE = 'I could not find the answer.'


@dataclasses.dataclass(frozen=True)
class Action:
  """One oracle turn: `think` and exactly one of `tool_call` ({"name", "arguments"}) or `response`."""
  think: str
  tool_call: dict | None = None
  response: str | None = None

  def text(self) -> str:
    """The assistant text (`render_assistant_text`; parse_action of it is format_ok)."""
    return traj_lib.render_assistant_text(self.think, tool_call=self.tool_call, response=self.response)


def oracle_plan(item: Mapping, graph, top_k: int = 5):
  """The oracle's policy on one item, as a generator: yields `Action`s, is sent each tool call's observation.

  Args:
    item: a grounded item (path, descriptors, answers, answer_attribute).
    graph: `paths.Graph` (article texts for refinement words).
    top_k: text_search hits per call.
  Yields:
    Action; after a tool-call action, `send(observation text)` resumes it with what the tool returned.
  Returns:
    (StopIteration.value) 'ok' after the final response, else why it gave up (`image_search: ...`,
    `hop i: ...`, `answer: ...`); it yields no response then.
  """
  path, descs, answers = item['path'], item['descriptors'], list(item['answers'])
  names = [entities.display(t) for t in path]

  def search(think, query):
    return Action(think, tool_call={'name': 'text_search', 'arguments': {'query': query, 'top_k': top_k}})

  obs = yield Action('First identify the image.', tool_call={'name': 'image_search', 'arguments': {'image': 'img_1'}})
  if not contains_name(obs, path[0]):
    return f'image_search: {path[0]} not identified'

  known = f'The image shows {names[0]}.'
  for i in range(1, len(path)):
    prev, d = names[i - 1], descs[i - 1]
    obs = yield search(f'{known} Next: the {d} in the {prev} article.', f'{prev} {d}')
    if not contains_name(obs, path[i]):
      words = context_words(graph.text(path[i - 1]), entities.aliases(path[i]), [prev])
      if not words:
        return f'hop {i}: {path[i]} not mentioned in {path[i - 1]}'
      obs = yield search('Not found; narrowing the search.', f'{prev} {" ".join(words)}')
      if not contains_name(obs, path[i]):
        return f'hop {i}: {path[i]} not in the search results'
    known = f'Found {names[i]}.'

  attr = item['answer_attribute']
  phrase = ATTRIBUTE_PHRASES[attr]
  obs = yield search(f'{known} Now: the {phrase} of {names[-1]}.', f'{names[-1]} {ATTRIBUTE_QUERY[attr]}')
  if not contains_answer(obs, answers):
    words = context_words(graph.text(path[-1]), answers[:1], [names[-1]] + answers)
    if not words:
      return 'answer: not found in the article text'
    obs = yield search('Not found; adding infobox terms.', f'{names[-1]} {ATTRIBUTE_QUERY[attr]} {" ".join(words)}')
    if not contains_answer(obs, answers):
      return 'answer: not in the search results'
  yield Action(f'The {phrase} of {names[-1]} is {answers[0]}.', response=answers[0])
  return 'ok'


def max_oracle_steps(item: Mapping) -> int:
  """Most steps `oracle_plan` takes: image_search, 2 searches per hop, 2 for the answer, the response."""
  return 2 * len(item['path']) + 2


def _user_question(ids: np.ndarray, tokenizer) -> str:
  """The question of a rendered prompt: '<|im_start|>user\\n{question}[\\nimg_1: <|vision_start|>…]<|im_end|>'."""
  starts = np.flatnonzero(ids == traj_lib.IM_START_ID)
  if len(starts) < 2:
    raise ValueError('context has no user turn')
  begin = int(starts[1]) + 1
  ends = np.flatnonzero(np.isin(ids[begin:], (traj_lib.VISION_START_ID, traj_lib.IM_END_ID)))
  text = tokenizer.decode(ids[begin:begin + int(ends[0])].tolist(), skip_special_tokens=False)
  return re.sub(r'\nimg_1: $', '', text.removeprefix('user\n'))


def observations(ids: np.ndarray, tokenizer) -> list[str]:
  """The text of every `<tool_response>` turn in a context, in order (image spans and their names left out).

  Args:
    ids: int32 [T], a rendered trajectory (`TrajectoryBuilder` format: system turn, user turn, then assistant
      turns and observations '<tool_response>\\n{text}[\\nimg_k: <|vision_start|>…<|vision_end|>]*\\n
      </tool_response>').
    tokenizer: the Qwen tokenizer.
  Returns:
    the observation texts as the builder rendered them (a failed call with no text reads 'Error: <kind>').
  """
  starts = np.flatnonzero(ids == traj_lib.IM_START_ID)
  first_turn = int(starts[2]) if len(starts) > 2 else len(ids)  # after system + user (the schemas name the tags)
  out = []
  for start in first_turn + np.flatnonzero(ids[first_turn:] == traj_lib.TOOL_RESPONSE_ID):
    body = ids[start + 1:]
    stop = np.flatnonzero(np.isin(body, (traj_lib.TOOL_RESPONSE_END_ID, traj_lib.VISION_START_ID)))
    image = body[stop[0]] == traj_lib.VISION_START_ID
    text = tokenizer.decode(body[:int(stop[0])].tolist(), skip_special_tokens=False).removeprefix('\n')
    out.append(re.sub(r'\nimg_\d+: $', '', text) if image else text.removesuffix('\n'))
  return out


class OracleEngine(engine_lib.TextEngine):
  """The oracle expert as a policy engine: for each context, the next action of `oracle_plan`.

  Stateless like `ScriptedEngine` (it serves any number of episodes batched in any order): it finds the item by
  the question in the context's user turn, reads the observations in the context (`observations`), replays
  `oracle_plan` over them and emits the next action's text (`TextEngine`: `tokenizer.encode(text) +
  [<|im_end|>]`, no log-probs). When the plan gives up it emits a final response `GIVE_UP_RESPONSE`.

  Attributes:
    outcomes: prompt_id -> 'ok' (the answer was given) or why the oracle gave up, set at each episode's last turn.
  """

  def __init__(self, items: Sequence[Mapping], graph, tokenizer, top_k: int = 5):
    """Args:
      items: grounded items (prompt_id, question, path, descriptors, answers, answer_attribute); their questions
        must differ (the item of a context is found by its question).
      graph: `paths.Graph`.
      tokenizer: the Qwen tokenizer (`trajectory.load_tokenizer()`).
      top_k: text_search hits per call.
    Raises:
      ValueError: two items with the same question.
    """
    super().__init__(tokenizer, with_logprobs=False)
    self.items = {}
    for item in items:
      if item['question'] in self.items:
        raise ValueError(f"items {self.items[item['question']]['prompt_id']!r} and {item['prompt_id']!r} have the "
                         'same question; give them to different OracleEngines')
      self.items[item['question']] = item
    self.graph, self.top_k = graph, top_k
    self.outcomes: dict[str, str] = {}

  def turn_text(self, step: int, context: engine_lib.Context) -> str:
    question = _user_question(context.prompt_ids, self.tokenizer)
    item = self.items.get(question)
    if item is None:
      raise ValueError(f'OracleEngine has no item with the question {question!r}')
    seen = observations(context.prompt_ids, self.tokenizer)
    if len(seen) != step:
      raise ValueError(f"prompt_id={item['prompt_id']!r}: {len(seen)} observations before step {step}")
    plan = oracle_plan(item, self.graph, self.top_k)
    try:
      action = next(plan)
      for obs in seen:
        if action.response is not None:
          raise ValueError(f"prompt_id={item['prompt_id']!r}: asked for step {step} after the response")
        action = plan.send(obs)
    except StopIteration as stop:
      self.outcomes[item['prompt_id']] = stop.value
      return traj_lib.render_assistant_text(f'Giving up: {stop.value}.', response=GIVE_UP_RESPONSE)
    if action.response is not None:
      self.outcomes[item['prompt_id']] = 'ok'
    text = action.text()
    if not traj_lib.parse_action(text).format_ok:
      raise AssertionError(f'oracle turn is not format_ok: {text!r}')
    return text


def oracle_trajectory(item: Mapping, image: np.ndarray, env, make_builder, graph, tokenizer, top_k: int = 5):
  """Runs the oracle on one item through `agent_loop.run_episodes`.

  Args:
    item: a grounded item (question, path, descriptors, answers, answer_attribute, prompt_id).
    image: the item's image, uint8 [H, W, 3].
    env: `ToolEnv` (anything with `call(name, arguments, images) -> ToolResult`).
    make_builder: `() -> TrajectoryBuilder`.
    graph: `paths.Graph` (article texts for refinement words).
    tokenizer: the Qwen tokenizer.
    top_k: text_search hits per call.
  Returns:
    (Trajectory or None, reason): the trajectory when the process check and the answer pass, else None and the
    reason (`image_search: ...`, `hop i: ...`, `answer: ...`, `final response ...`).
  """
  engine = OracleEngine([item], graph, tokenizer, top_k)
  prompt = agent_loop.Item(prompt_id=item['prompt_id'], question=item['question'], image=image,
                           answers=list(item['answers']))
  steps = max_oracle_steps(item)
  # The oracle decides itself when to give up: the loop's fatal cascade is longer than any episode.
  (traj,) = agent_loop.run_episodes(engine, env, make_builder, [prompt], num_generations=1, max_turns=steps,
                                    fatal_k=steps + 1)
  reason = engine.outcomes.get(item['prompt_id'], f'stopped: {traj.stop_reason}')
  if reason != 'ok':
    return None, reason
  answer = item['answers'][0]
  if traj.final_response != answer:
    return None, f'final response {traj.final_response!r} != answer {answer!r}'
  return traj, 'ok'


def synthesize(items: list[dict], graph, data_dir, tool_config=None, top_k: int = 5, processor=None,
               progress=None):
  """Oracle trajectories for the accepted items (one `run_episodes` call per item, in order).

  Args:
    items: grounded item records (rejected ones are skipped).
    graph: `paths.Graph`.
    data_dir: shared data folder (images are read from `data_dir / item['image_path']`).
    tool_config: partial `tools.env.default_config()` overrides.
    top_k: text_search hits per call.
    processor: `trajectory.ImageProcessor` for the input image (default: Qwen3-VL's pixel budget).
    progress: optional callable wrapping the iterable (tqdm).
  Returns:
    (records: list of `Trajectory.to_record()` dicts, counts {'in', 'kept', 'rejected', 'reasons': {..},
    'tool_calls', 'mean_tool_calls', 'seconds'}).
  """
  from tools import env as env_lib
  env = env_lib.ToolEnv(tool_config)
  tokenizer = traj_lib.load_tokenizer(data_dir)
  processor = processor or traj_lib.ImageProcessor()
  schemas = env.schemas()
  make_builder = lambda: traj_lib.TrajectoryBuilder(tokenizer, processor, schemas)
  todo = [it for it in items if not it.get('rejected')]
  out, reasons, calls = [], {}, 0
  t0 = time.perf_counter()
  for item in (progress(todo) if progress else todo):
    traj, reason = oracle_trajectory(item, load_image(data_dir, item['image_path']), env, make_builder, graph,
                                     tokenizer, top_k)
    if traj is None:
      key = reason.split(':')[0] if not reason.startswith('hop') else 'hop'
      reasons[key] = reasons.get(key, 0) + 1
      continue
    problems = traj_lib.check_trajectory(traj)
    if problems:
      reasons['check_trajectory'] = reasons.get('check_trajectory', 0) + 1
      continue
    calls += len(traj.steps) - 1
    out.append(traj.to_record())
  counts = {'in': len(todo), 'kept': len(out), 'rejected': len(todo) - len(out), 'reasons': reasons,
            'tool_calls': calls, 'mean_tool_calls': calls / max(len(out), 1),
            'seconds': round(time.perf_counter() - t0, 2)}
  return out, counts
