"""Stage `synthesize`: the oracle expert, SFT trajectories with real tool calls (DESIGN.md §7.8).

The oracle is a policy engine (`OracleEngine`, an `osvl_jax.rollout.engine.Engine`) run by the one agent loop
(`osvl_jax.rollout.agent_loop.run_episodes`) against the real tool environment. It knows the path v0 -> ... -> vh
and walks it, deciding each next action from the observations in its context:

  repair      (a degraded item) {repair_tool}(img_1)      -> the repaired image, img_2 (`degrade.py`)
  step 0      image_search(img_2, else img_1)             -> must name v0 (its article title)
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
equals the answer, then passes the two-stage rejection every expert's trajectories go through (`experts.py`:
answer judge, process-quality judge); otherwise the reason is counted (the `sft` stage's `reasons`). A degraded
item (`degrade.py`) is first repaired with its paired tool, and the image search looks up the repaired image.
`synthesize` runs the expert of `data.synthesize.expert`: this oracle, or a model (`experts.py`). Refinement
queries use the oracle's knowledge of the text around the next entity (its name is never in the query), the way an
expert who has read the article would narrow a search; they make the trajectories longer, as the paper's (6.3 tool
turns on average). The repair step only calls a tool the environment offers (`tools.enabled`).
"""

import dataclasses
import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import ml_collections
import numpy as np

from data_pipeline import degrade as degrade_lib
from data_pipeline import entities
from data_pipeline import experts
from osvl_jax import trajectory as traj_lib
from osvl_jax.data import pipeline as pipeline_data
from osvl_jax.rollout import agent_loop, factory
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


def context_words(text: str, target_names: list[str], exclude: list[str], k: int = 10, radius: int = 120) -> list[str]:
  """Up to `k` content words within `radius` characters of the first mention of a target name, nearest first.

  The oracle's narrowing query: these words pull the search snippet to the passage that mentions the target. On
  the Wikispeedia build (56 accepted items) nearest-first k = 10, radius 120 lets the oracle finish 53 items;
  the earlier longest-first k = 3, radius 60 finished 30 (snippets of other passages won).

  Args:
    text: article text.
    target_names: surface forms to locate (the next entity's aliases, or the answer).
    exclude: names whose words must not appear in the result (the target, the source article).
    k: number of words.
    radius: characters each side of the mention.
  Returns:
    Folded words (>= 4 letters, no stopwords, no excluded words, each once), by distance of their start from the
    mention's start; [] when no mention is found.
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
  lo = max(0, m.start() - radius)
  near = {}
  for w in re.finditer(r'[^\W\d_]{4,}', hay[lo:m.end() + radius]):
    if w.group(0) not in bad and w.group(0) not in _QUERY_STOPWORDS:
      near.setdefault(w.group(0), abs(lo + w.start() - m.start()))
  return sorted(near, key=near.get)[:k]


load_image = pipeline_data.load_image
GIVE_UP_RESPONSE = 'I could not find the answer.'
CHUNK_ITEMS = 64  # items per `run_episodes` call of the model expert (K episodes each)
# Degradation kind -> how the expert says what it sees before repairing it.
DEGRADATION_LOOKS = {'blur': 'blurry', 'downsample': 'low-resolution', 'perspective': 'skewed'}


class Observation(NamedTuple):
  """One tool response as the model reads it: its text and the names of the images it returned ('img_2')."""
  text: str
  images: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Action:
  """One oracle turn: `think` and exactly one of `tool_call` ({"name", "arguments"}) or `response`."""
  think: str
  tool_call: dict | None = None
  response: str | None = None

  def text(self) -> str:
    """The assistant text (`render_assistant_text`; parse_action of it is format_ok)."""
    return traj_lib.render_assistant_text(self.think, tool_call=self.tool_call, response=self.response)


def oracle_plan(item: Mapping, graph, top_k: int = 5, tools: Sequence[str] | None = None):
  """The oracle's policy on one item, as a generator: yields `Action`s, is sent each tool call's observation.

  Args:
    item: a grounded item (path, descriptors, answers, answer_attribute).
    graph: `wiki_graph.WikiGraph` (article texts for refinement words).
    top_k: text_search hits per call.
    tools: the enabled tool names (None: all); a repair tool that is not enabled is not called.
  Yields:
    Action; after a tool-call action, `send(Observation)` resumes it with what the tool returned.
  Returns:
    (StopIteration.value) 'ok' after the final response, else why it gave up (`image_search: ...`,
    `hop i: ...`, `answer: ...`); it yields no response then.

  An item with a `degradation` ({kind, params (JSON text), repair_tool}, `degrade.py`) is repaired first: the
  repair tool on img_1 (`degrade.repair_arguments`), then image_search on the image it returned (img_2); when
  the tool returns no image (perspective_correct finding no outline), or is not among `tools`, the original img_1
  is searched.
  """
  path, descs, answers = item['path'], item['descriptors'], list(item['answers'])
  names = [entities.display(t) for t in path]

  def search(think, query):
    return Action(think, tool_call={'name': 'text_search', 'arguments': {'query': query, 'top_k': top_k}})

  image, think = 'img_1', 'First identify the image.'
  degradation = item.get('degradation')
  if degradation and (tools is None or degradation['repair_tool'] in tools):
    kind, tool = degradation['kind'], degradation['repair_tool']
    params = degradation['params']
    params = json.loads(params) if isinstance(params, str) else dict(params)
    obs = yield Action(f'The image looks {DEGRADATION_LOOKS[kind]}; repair it with {tool} before searching.',
                       tool_call={'name': tool, 'arguments': {'image': 'img_1',
                                                              **degrade_lib.repair_arguments(kind, params)}})
    if obs.images:
      image, think = obs.images[0], f'Now identify the repaired image {obs.images[0]}.'
    else:
      think = f'{tool} returned no image; identify the original image.'
  obs = yield Action(think, tool_call={'name': 'image_search', 'arguments': {'image': image}})
  if not contains_name(obs.text, path[0]):
    return f'image_search: {path[0]} not identified'

  known = f'The image shows {names[0]}.'
  for i in range(1, len(path)):
    prev, d = names[i - 1], descs[i - 1]
    obs = yield search(f'{known} Next: the {d} in the {prev} article.', f'{prev} {d}')
    if not contains_name(obs.text, path[i]):
      words = context_words(graph.text(path[i - 1]), entities.aliases(path[i]), [prev])
      if not words:
        return f'hop {i}: {path[i]} not mentioned in {path[i - 1]}'
      obs = yield search('Not found; narrowing the search.', f'{prev} {" ".join(words)}')
      if not contains_name(obs.text, path[i]):
        return f'hop {i}: {path[i]} not in the search results'
    known = f'Found {names[i]}.'

  attr = item['answer_attribute']
  phrase = ATTRIBUTE_PHRASES[attr]
  obs = yield search(f'{known} Now: the {phrase} of {names[-1]}.', f'{names[-1]} {ATTRIBUTE_QUERY[attr]}')
  if not contains_answer(obs.text, answers):
    words = context_words(graph.text(path[-1]), answers[:1], [names[-1]] + answers)
    if not words:
      return 'answer: not found in the article text'
    obs = yield search('Not found; adding infobox terms.', f'{names[-1]} {ATTRIBUTE_QUERY[attr]} {" ".join(words)}')
    if not contains_answer(obs.text, answers):
      return 'answer: not in the search results'
  yield Action(f'The {phrase} of {names[-1]} is {answers[0]}.', response=answers[0])
  return 'ok'


def max_oracle_steps(item: Mapping) -> int:
  """Most steps `oracle_plan` takes: a repair (degraded items), image_search, 2 searches per hop, 2 for the
  answer, the response."""
  return 2 * len(item['path']) + 2 + bool(item.get('degradation'))


def _user_question(ids: np.ndarray, tokenizer) -> str:
  """The question of a rendered prompt: '<|im_start|>user\\n{question}[\\nimg_1: <|vision_start|>…]<|im_end|>'."""
  starts = np.flatnonzero(ids == traj_lib.IM_START_ID)
  if len(starts) < 2:
    raise ValueError('context has no user turn')
  begin = int(starts[1]) + 1
  ends = np.flatnonzero(np.isin(ids[begin:], (traj_lib.VISION_START_ID, traj_lib.IM_END_ID)))
  text = tokenizer.decode(ids[begin:begin + int(ends[0])].tolist(), skip_special_tokens=False)
  return re.sub(r'\nimg_1: $', '', text.removeprefix('user\n'))


def observations(ids: np.ndarray, tokenizer) -> list[Observation]:
  """Every `<tool_response>` turn in a context, in order: its text and the names of its images.

  Args:
    ids: int32 [T], a rendered trajectory (`TrajectoryBuilder` format: system turn, user turn, then assistant
      turns and observations '<tool_response>\\n{text}[\\nimg_k: <|vision_start|>…<|vision_end|>]*\\n
      </tool_response>').
    tokenizer: the Qwen tokenizer.
  Returns:
    `Observation`s: the text as the builder rendered it (a failed call with no text reads 'Error: <kind>'), the
    image names ('img_2', ...) in order.
  """
  starts = np.flatnonzero(ids == traj_lib.IM_START_ID)
  first_turn = int(starts[2]) if len(starts) > 2 else len(ids)  # after system + user (the schemas name the tags)
  out = []
  for start in first_turn + np.flatnonzero(ids[first_turn:] == traj_lib.TOOL_RESPONSE_ID):
    body = ids[start + 1:]
    body = body[:int(np.flatnonzero(body == traj_lib.TOOL_RESPONSE_END_ID)[0])]
    # Text pieces between the image spans: the text, then '\nimg_k: ' before each span.
    pieces, k = [], 0
    for v in np.flatnonzero(body == traj_lib.VISION_START_ID):
      pieces.append(body[k:int(v)])
      k = int(np.flatnonzero(body[v:] == traj_lib.VISION_END_ID)[0]) + int(v) + 1
    pieces.append(body[k:])
    texts = [tokenizer.decode(p.tolist(), skip_special_tokens=False) for p in pieces]
    names = [re.search(r'(img_\d+): $', t) for t in texts[:-1]]
    text = (texts[0][:names[0].start()] if names else texts[0]).removeprefix('\n').removesuffix('\n')
    out.append(Observation(text, tuple(m.group(1) for m in names if m)))
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

  def __init__(self, items: Sequence[Mapping], graph, tokenizer, top_k: int = 5, tools: Sequence[str] | None = None):
    """Args:
      items: grounded items (prompt_id, question, path, descriptors, answers, answer_attribute); their questions
        must differ (the item of a context is found by its question).
      graph: `wiki_graph.WikiGraph`.
      tokenizer: the Qwen tokenizer (`trajectory.load_tokenizer()`).
      top_k: text_search hits per call.
      tools: the enabled tool names (None: all), `oracle_plan`.
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
    self.graph, self.top_k, self.tools = graph, top_k, None if tools is None else tuple(tools)
    self.outcomes: dict[str, str] = {}

  def turn_text(self, step: int, context: engine_lib.Context) -> str:
    question = _user_question(context.prompt_ids, self.tokenizer)
    item = self.items.get(question)
    if item is None:
      raise ValueError(f'OracleEngine has no item with the question {question!r}')
    seen = observations(context.prompt_ids, self.tokenizer)
    if len(seen) != step:
      raise ValueError(f"prompt_id={item['prompt_id']!r}: {len(seen)} observations before step {step}")
    plan = oracle_plan(item, self.graph, self.top_k, self.tools)
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
    graph: `wiki_graph.WikiGraph` (article texts for refinement words).
    tokenizer: the Qwen tokenizer.
    top_k: text_search hits per call.
  Returns:
    (Trajectory or None, reason): the trajectory when the process check and the answer pass, else None and the
    reason (`image_search: ...`, `hop i: ...`, `answer: ...`, `final response ...`).
  """
  engine = OracleEngine([item], graph, tokenizer, top_k, getattr(env, 'names', None))
  prompt = agent_loop.Item(prompt_id=item['prompt_id'], question=item['question'], image=image,
                           answers=list(item['answers']))
  steps = max_oracle_steps(item)
  # The oracle decides itself when to give up: the loop's fatal cascade is longer than any episode.
  (traj,) = agent_loop.run_episodes(engine, env, make_builder, [prompt], num_generations=1,
                                    limits=agent_loop.Limits(max_turns=steps, fatal_k=steps + 1))
  reason = engine.outcomes.get(item['prompt_id'], f'stopped: {traj.stop_reason}')
  if reason != 'ok':
    return None, reason
  answer = item['answers'][0]
  if traj.final_response != answer:
    return None, f'final response {traj.final_response!r} != answer {answer!r}'
  return traj, 'ok'


def synthesize(items: list[dict], graph, data_dir, tool_config=None, top_k: int = 5, processor=None,
               progress=None, config: ml_collections.ConfigDict | None = None, engine=None, dataset_dir=None,
               system_prompt: str | None = None):
  """Expert trajectories for the accepted items, judged and selected (`experts.py`).

  The oracle runs one `run_episodes` call per item, in order; the model expert K episodes per item, items in
  chunks of `CHUNK_ITEMS` (one `run_episodes` call each). Every trajectory then goes through the two-stage
  rejection (`experts.select`).

  Args:
    items: grounded item records (rejected ones are skipped).
    graph: `wiki_graph.WikiGraph`.
    data_dir: shared data folder (images are read from `data_dir / item['image_path']`).
    dataset_dir: the dataset folder a degraded item's `image_path` is relative to
      (`osvl_jax.data.pipeline.image_file`); needed only for such items.
    tool_config: partial `tools.env.default_config()` overrides.
    top_k: text_search hits per oracle call.
    processor: `trajectory.ImageProcessor` for the input image (default: Qwen3-VL's pixel budget).
    progress: optional callable wrapping the iterable (tqdm).
    config: the `data.synthesize` section (`experts.default_config()`, the default).
    engine: the model expert's engine (default: `experts.model_engine(config)`, SGLang's /generate or an
      OpenAI-compatible endpoint at `config.base_url`); tests pass a `ScriptedEngine`.
    system_prompt: the agent's instructions of the trajectories' system turn (`trajectory.system_prompt_text`;
      None = the builder's default).
  Returns:
    (records: list of `Trajectory.to_record()` dicts, counts {'expert', 'model', 'in', 'episodes', 'kept',
    'items_kept', 'rejected' (episodes), 'reasons' (rejection reason -> episodes), 'surplus', 'passed',
    'process_score_mean', 'repaired' (kept trajectories that begin with a repair tool), 'tool_calls',
    'mean_tool_calls', 'seconds'}).
  Raises:
    ValueError: a bad `config` (`experts.check_config`).
  """
  from tools import env as env_lib
  config = config if config is not None else experts.default_config()
  experts.check_config(config)
  env = env_lib.ToolEnv(tool_config)
  tokenizer = traj_lib.load_tokenizer(data_dir)
  processor = processor or traj_lib.ImageProcessor()
  make_builder = factory.make_builder(tokenizer, processor, env, system_prompt)
  todo = [it for it in items if not it.get('rejected')]
  trajs, reasons = [], {}
  t0 = time.perf_counter()
  if config.expert == 'oracle':
    for item in (progress(todo) if progress else todo):
      if not item.get('path'):  # a merged external item (`merge.py`): no walk for the oracle to follow
        reasons['no path (external item)'] = reasons.get('no path (external item)', 0) + 1
        continue
      traj, reason = oracle_trajectory(item, pipeline_data.item_image(item, data_dir, dataset_dir), env,
                                       make_builder, graph, tokenizer, top_k)
      if traj is None:
        key = reason.split(':')[0] if not reason.startswith('hop') else 'hop'
        reasons[key] = reasons.get(key, 0) + 1
      else:
        trajs.append(traj)
    keep_per_item = 1
  else:
    engine = engine or experts.model_engine(config, tokenizer)
    chunks = [todo[k:k + CHUNK_ITEMS] for k in range(0, len(todo), CHUNK_ITEMS)]
    for chunk in (progress(chunks) if progress else chunks):
      prompts = [agent_loop.Item(prompt_id=it['prompt_id'], question=it['question'],
                                 image=pipeline_data.item_image(it, data_dir, dataset_dir), answers=list(it['answers']))
                 for it in chunk]
      trajs += experts.model_episodes(prompts, engine, env, make_builder, config)
    keep_per_item = int(config.keep_per_item)
  judge = experts.make_judge(config)
  kept, selected = experts.select(trajs, judge, float(config.min_process_score), keep_per_item)
  for reason, n in selected['reasons'].items():
    reasons[reason] = reasons.get(reason, 0) + n
  repair_tools = set(degrade_lib.REPAIR_TOOLS.values())
  calls = sum(len(t.steps) - 1 for t in kept)
  episodes = len(todo) if config.expert == 'oracle' else len(trajs)
  counts = {'expert': config.expert, 'model': config.model if config.expert != 'oracle' else 'oracle',
            'in': len(todo), 'episodes': episodes, 'kept': len(kept), 'items_kept': selected['items_kept'],
            'rejected': sum(reasons.values()), 'reasons': dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
            'surplus': selected['surplus'], 'passed': selected['passed'],
            'process_score_mean': selected['process_score_mean'],
            'repaired': sum(bool(t.steps) and t.steps[0].action.name in repair_tools for t in kept),
            'tool_calls': calls, 'mean_tool_calls': calls / max(len(kept), 1),
            'seconds': round(time.perf_counter() - t0, 2)}
  return [t.to_record() for t in kept], counts
