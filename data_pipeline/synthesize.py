"""Stage `synthesize`: the oracle expert, SFT trajectories with real tool calls (DESIGN.md §7.8).

The oracle knows the path v0 -> ... -> vh and walks it through `tools.registry.ToolEnv.call`:

  step 0      image_search(img_1)                         -> must name v0 (its article title)
  hop i       text_search("{v(i-1)} {descriptor of vi}")  -> must name vi; if not, one refinement:
              text_search("{v(i-1)} {3 context words}")      words around vi's mention in v(i-1)'s text
  answer      text_search("{vh} {attribute phrase}")      -> must contain the answer; same refinement with the
                                                             words around the answer in vh's infobox
  last step   <response>{answer}</response>

Every assistant turn is `render_assistant_text(think, tool_call=...)` with a short templated think, tokenized
as `tokenizer.encode(text) + [<|im_end|>]` (`TrajectoryBuilder.append_assistant_text`), every observation the
real `ToolResult`. A trajectory is kept only when the process check passes (each search result actually
contains the entity of the next hop, the final search the answer) and the final response equals the answer;
otherwise the reason is counted (`sft_rejects` in the stats). Refinement queries use the oracle's knowledge of
the text around the next entity (its name is never in the query), the way an expert who has read the article
would narrow a search; they make the trajectories longer, as the paper's (6.3 tool turns on average).
"""

import re
import time

import numpy as np
from PIL import Image

from data_pipeline import entities

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


def load_image(data_dir, rel_path: str) -> np.ndarray:
  """uint8 [H, W, 3] RGB of `data_dir / rel_path`."""
  with Image.open(f'{data_dir}/{rel_path}') as im:
    return np.asarray(im.convert('RGB'), np.uint8)


class _Episode:
  """One oracle episode: a builder, the conversation images and the tool env."""

  def __init__(self, env, builder, image):
    self.env, self.builder, self.images = env, builder, [image]

  def act(self, think: str, name: str, arguments: dict):
    from osvl_jax import trajectory as traj_lib
    text = traj_lib.render_assistant_text(think, tool_call={'name': name, 'arguments': arguments})
    action = self.builder.append_assistant_text(text)
    assert action.format_ok, (text, action)
    result = self.env.call(name, arguments, self.images)
    self.builder.append_observation(result)
    self.images.extend(result.images)
    return result

  def respond(self, think: str, answer: str):
    from osvl_jax import trajectory as traj_lib
    self.builder.append_assistant_text(traj_lib.render_assistant_text(think, response=answer))


def oracle_trajectory(item: dict, env, builder, image: np.ndarray, graph, top_k: int = 5):
  """Runs the oracle on one item.

  Args:
    item: a grounded item (question, path, descriptors, answers, answer_attribute, prompt_id).
    env: `tools.registry.ToolEnv`.
    builder: a fresh `osvl_jax.trajectory.TrajectoryBuilder`.
    image: the item's image, uint8 [H, W, 3].
    graph: `paths.Graph` (article texts for refinement words).
    top_k: text_search hits per call.
  Returns:
    (Trajectory or None, reason): the trajectory when the process check and the answer pass, else None and the
    reason (`image_search: ...`, `hop i: ...`, `answer: ...`).
  """
  path, descs, answers = item['path'], item['descriptors'], list(item['answers'])
  names = [entities.display(t) for t in path]
  ep = _Episode(env, builder, image)
  builder.start(item['question'], image)

  r = ep.act('First identify the image.', 'image_search', {'image': 'img_1'})
  if not r.ok or not contains_name(r.text, path[0]):
    return None, f'image_search: {path[0]} not identified'

  known = f'The image shows {names[0]}.'
  for i in range(1, len(path)):
    prev, d = names[i - 1], descs[i - 1]
    query = f'{prev} {d}'
    r = ep.act(f'{known} Next: the {d} in the {prev} article.', 'text_search',
               {'query': query, 'top_k': top_k})
    if not (r.ok and contains_name(r.text, path[i])):
      words = context_words(graph.text(path[i - 1]), entities.aliases(path[i]), [prev])
      if not words:
        return None, f'hop {i}: {path[i]} not mentioned in {path[i - 1]}'
      r = ep.act('Not found; narrowing the search.', 'text_search',
                 {'query': f'{prev} {" ".join(words)}', 'top_k': top_k})
      if not (r.ok and contains_name(r.text, path[i])):
        return None, f'hop {i}: {path[i]} not in the search results'
    known = f'Found {names[i]}.'

  attr = item['answer_attribute']
  phrase = ATTRIBUTE_PHRASES[attr]
  r = ep.act(f'{known} Now: the {phrase} of {names[-1]}.', 'text_search',
             {'query': f'{names[-1]} {ATTRIBUTE_QUERY[attr]}', 'top_k': top_k})
  if not (r.ok and contains_answer(r.text, answers)):
    words = context_words(graph.text(path[-1]), answers[:1], [names[-1]] + answers)
    if not words:
      return None, 'answer: not found in the article text'
    r = ep.act('Not found; adding infobox terms.', 'text_search', {'query': f'{names[-1]} {ATTRIBUTE_QUERY[attr]} {" ".join(words)}', 'top_k': top_k})
    if not (r.ok and contains_answer(r.text, answers)):
      return None, 'answer: not in the search results'
  ep.respond(f'The {phrase} of {names[-1]} is {answers[0]}.', answers[0])
  traj = builder.finish(prompt_id=item['prompt_id'], sample_index=0, answers=answers)
  if traj.final_response != answers[0]:
    return None, f'final response {traj.final_response!r} != answer {answers[0]!r}'
  return traj, 'ok'


def synthesize(items: list[dict], graph, data_dir, tool_config=None, top_k: int = 5, processor=None,
               progress=None):
  """Oracle trajectories for the accepted items.

  Args:
    items: grounded item records (rejected ones are skipped).
    graph: `paths.Graph`.
    data_dir: shared data folder (images are read from `data_dir / item['image_path']`).
    tool_config: partial `tools.registry.default_config()` overrides.
    top_k: text_search hits per call.
    processor: `trajectory.ImageProcessor` for the input image (default: Qwen3-VL's pixel budget).
    progress: optional callable wrapping the iterable (tqdm).
  Returns:
    (records: list of `Trajectory.to_record()` dicts, counts {'in', 'kept', 'rejected', 'reasons': {..},
    'tool_calls', 'mean_tool_calls', 'seconds'}).
  """
  from osvl_jax import trajectory as traj_lib
  from tools import registry
  env = registry.ToolEnv(tool_config)
  tokenizer = traj_lib.load_tokenizer(data_dir)
  processor = processor or traj_lib.ImageProcessor()
  schemas = env.schemas()
  todo = [it for it in items if not it.get('rejected')]
  out, reasons, calls = [], {}, 0
  t0 = time.perf_counter()
  for item in (progress(todo) if progress else todo):
    builder = traj_lib.TrajectoryBuilder(tokenizer, processor, schemas)
    traj, reason = oracle_trajectory(item, env, builder, load_image(data_dir, item['image_path']), graph, top_k)
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
