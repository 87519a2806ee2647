"""The lookup world: a synthetic multimodal tool task a tiny random-init policy can learn (DESIGN.md §6b, "Learning
testbed"), built in the project's dataset format (`osvl_jax.data.pipeline`: items, `sft` and `rl` splits,
build_config.json, stats.json) plus `vocab_ids.json` (the Qwen ids the world uses, for `model.vocab='dataset'`).

  .venv/bin/python -m data_pipeline.lookup_world --config=configs/lookup.py --workdir=W   (-> W/data)

An item: a square of one of ten colours (the image, img_1: its colour is the key, `COLOURS`, and is nowhere in
the text) and a question naming a day ("Day 5. ..."). The `lookup{key, day}` tool (`tools/specs/lookup.py`) returns
"The value of key k on day d is v." from a seeded table; the answer is v (1 hop) or, with `hops=2`, the value of
key v on the same day. Every copied value (key, day, value) is a digit, one Qwen token with the same id at the
source and the target. Splits are disjoint by (key, day) combination: the `rl` split's combinations never occur in
`sft` (its last `heldout_combos` combinations are the ones bench/learning_world.py holds out of GRPO), so a policy
that memorised the SFT table cannot answer them without the tool.

The expert (`LookupExpert`) is a policy engine run by the one agent loop against `ToolEnv` with failure injection
(`failure_rate`, backend_error): it reads the key from the item, calls lookup, and after a failed call retries the
same call with probability `retry_prob`, else gives up (a final response `GIVE_UP_RESPONSE`), the behaviour the
issue measured in the demo's expert data (retry 29%); GRPO can learn to retry. Episodes that end in a fatal cascade
(K consecutive failures) are not kept. Each expert turn is `<think>` + one call or response:
  "Key k, day d."                      -> lookup{k, d}
  "Next key v, day d."                 -> lookup{v, d}          (hops=2, after the first value)
  "The value is v."                    -> <response>v</response>
  "The lookup failed; try again."      -> the same call
  "The lookup failed; give up."        -> <response>GIVE_UP_RESPONSE</response>
"""

import json
import os
import pathlib
import re
import sys
import time

import ml_collections
import numpy as np
import tqdm
from absl import app, flags
from ml_collections import config_flags

from data_pipeline import dataset_folder
from data_pipeline import vocab as vocab_lib
from osvl_jax import trajectory as traj_lib
from osvl_jax.data import pipeline as pipeline_data
from osvl_jax.rollout import agent_loop, factory
from osvl_jax.rollout import engine as engine_lib
from tools.specs import lookup as lookup_spec

# The ten colours; the index is the key the square stands for.
COLOURS = (('red', (220, 30, 40)), ('green', (40, 170, 60)), ('blue', (20, 60, 220)), ('yellow', (240, 220, 30)),
           ('orange', (245, 130, 40)), ('purple', (130, 40, 170)), ('cyan', (60, 220, 230)),
           ('magenta', (230, 50, 200)), ('black', (10, 10, 10)), ('white', (245, 245, 245)))
GIVE_UP_RESPONSE = 'I could not find the answer.'
RESULT = re.compile(r'The value of key (\d) on day (\d) is (\d)\.')
QUESTIONS = {1: 'Day {day}. What value does the key of the square\'s colour hold?',
             2: 'Day {day}. Look up the key of the square\'s colour, then look up the value it gives as a key. '
                'What is the final value?'}
STATS_FILE = 'stats.json'   # written last: its presence means the world is built
GENERATED = pipeline_data.GENERATED_DIR
SPLIT_TAGS = ('sft', 'rl', 'heldout')


def default_config() -> ml_collections.ConfigDict:
  """The `data` section of a lookup world (configs/lookup.py). Fields:

    world: 'lookup' (what `build` checks it is given).
    seed: the table (`tools.lookup.seed` must equal it), the split of combinations, colour jitter, retry draws.
    hops: 1 or 2 dependent lookups per item.
    sft_items / rl_items_per_combo: items of the sft split (drawn over its combinations) / per rl combination.
    rl_combos / heldout_combos: combinations (of the 100 (key, day)) in the rl split / of those, the last ones
      (held out of GRPO by bench/learning_world.py through grpo.heldout_prompts).
    failure_rate: probability a tool call fails while the expert runs (injected backend_error).
    retry_prob: probability the expert retries after a failed call (else it gives up).
    fatal_k: K of the expert's episodes (consecutive failures that end one, not kept).
    image_size: side of the square image, pixels; jitter: ± colour noise per channel.
    min_pixels / max_pixels: the image processor budget of the trajectories (the policy's `image.*`).
    system_prompt: the agent's instructions (`trajectory.system_prompt_text`).
    dir: the dataset folder ('' = <workdir>/data).
  """
  c = ml_collections.ConfigDict()
  c.world = 'lookup'
  c.seed = 0
  c.hops = 1
  c.sft_items = 600
  c.rl_items_per_combo = 2
  c.rl_combos = 40
  c.heldout_combos = 20
  c.failure_rate = 0.3
  c.retry_prob = 0.29
  c.fatal_k = 3
  c.image_size = 64
  c.jitter = 12
  c.min_pixels = 64 * 64
  c.max_pixels = 64 * 64
  c.system_prompt = traj_lib.BUILDER_DEFAULT
  c.dir = ''
  return c


def check_config(c: ml_collections.ConfigDict) -> None:
  """Raises ValueError naming the `data.*` field that cannot build a world."""
  if c.get('world') != 'lookup':
    raise ValueError(f"data.world={c.get('world')!r}: expected 'lookup'")
  if c.hops not in (1, 2):
    raise ValueError(f'data.hops={c.hops!r}: expected 1 or 2')
  for name in ('sft_items', 'rl_items_per_combo', 'rl_combos', 'fatal_k', 'image_size'):
    if not isinstance(c[name], int) or c[name] < 1:
      raise ValueError(f'data.{name}={c[name]!r}: expected an int >= 1')
  if not 0 < c.heldout_combos < c.rl_combos < lookup_spec.DIGITS ** 2:
    raise ValueError(f'data.heldout_combos={c.heldout_combos!r}, data.rl_combos={c.rl_combos!r}: need 0 < heldout < '
                     f'rl < {lookup_spec.DIGITS ** 2} (the rest of the combinations are the sft split\'s)')
  for name in ('failure_rate', 'retry_prob'):
    if not 0 <= c[name] <= 1:
      raise ValueError(f'data.{name}={c[name]!r}: expected a probability in [0, 1]')


def split_combos(seed: int, rl_combos: int, heldout_combos: int) -> dict[str, list[tuple[int, int]]]:
  """The 100 (key, day) combinations in a seeded order: {'sft': ..., 'rl': (trained by GRPO), 'heldout': (its
  last `heldout_combos`)}; disjoint, together all of them."""
  combos = [(k, d) for k in range(lookup_spec.DIGITS) for d in range(lookup_spec.DIGITS)]
  order = np.random.default_rng([seed, 1]).permutation(len(combos))
  combos = [combos[i] for i in order]
  return {'sft': combos[rl_combos:], 'rl': combos[:rl_combos - heldout_combos],
          'heldout': combos[rl_combos - heldout_combos:rl_combos]}


def answer(seed: int, key: int, day: int, hops: int) -> int:
  """The item's answer: the table followed `hops` times from `key` on `day`."""
  for _ in range(hops):
    key = lookup_spec.table_value(seed, key, day)
  return key


def square(key: int, size: int, jitter: int, rng: np.random.Generator) -> np.ndarray:
  """uint8 [size, size, 3]: the colour of `key`, each channel moved by a uniform ±`jitter` draw."""
  rgb = np.clip(np.array(COLOURS[key][1]) + rng.integers(-jitter, jitter + 1, 3), 0, 255)
  return np.broadcast_to(rgb.astype(np.uint8), (size, size, 3)).copy()


def make_items(c: ml_collections.ConfigDict) -> list[dict]:
  """The world's items in split order (sft, then rl, then heldout), each with prompt_id, split, key, day, hops,
  question, answers and its image (uint8 [H, W, 3])."""
  combos = split_combos(c.seed, c.rl_combos, c.heldout_combos)
  rng = np.random.default_rng([c.seed, 2])
  drawn = {'sft': [combos['sft'][i] for i in rng.integers(len(combos['sft']), size=c.sft_items)],
           'rl': [x for x in combos['rl'] for _ in range(c.rl_items_per_combo)],
           'heldout': [x for x in combos['heldout'] for _ in range(c.rl_items_per_combo)]}
  items = []
  for split in SPLIT_TAGS:
    for n, (key, day) in enumerate(drawn[split]):
      items.append({'prompt_id': f'lookup-{split}-{n:05d}', 'split': split, 'key': key, 'day': day, 'hops': c.hops,
                    'question': QUESTIONS[c.hops].format(day=day),
                    'answers': [str(answer(c.seed, key, day, c.hops))],
                    'image': square(key, c.image_size, c.jitter, rng)})
  return items


class LookupExpert(engine_lib.TextEngine):
  """The expert of one item as a policy engine (`TextEngine`): the next turn from the observations in the context.

  Retry decisions are drawn per (seed, item, step), so replaying a context gives the same turn.

  Attributes:
    outcome: 'answered' or 'gave_up', set at the final turn.
  """

  def __init__(self, item: dict, tokenizer, seed: int, retry_prob: float):
    super().__init__(tokenizer, with_logprobs=False)
    self.item, self.seed, self.retry_prob = item, seed, retry_prob
    self.outcome = None

  def turn_text(self, step: int, context: engine_lib.Context) -> str:
    from data_pipeline import synthesize  # pylint: disable=g-import-not-at-top  # the observation reader
    day, hops = self.item['day'], self.item['hops']
    call, hop, failed = (self.item['key'], day), 0, False
    for obs in synthesize.observations(context.prompt_ids, self.tokenizer):
      m = RESULT.fullmatch(obs.text.strip())
      failed = m is None
      if m:
        hop, call = hop + 1, (int(m.group(3)), day)
    render = traj_lib.render_assistant_text
    lookup = {'name': 'lookup', 'arguments': {'key': call[0], 'day': call[1]}}
    if failed:
      draw = np.random.default_rng([self.seed, 3, int(self.item['prompt_id'].rsplit('-', 1)[1]), step]).random()
      if draw < self.retry_prob:
        return render('The lookup failed; try again.', tool_call=lookup)
      self.outcome = 'gave_up'
      return render('The lookup failed; give up.', response=GIVE_UP_RESPONSE)
    if hop == hops:
      self.outcome = 'answered'
      return render(f'The value is {call[0]}.', response=str(call[0]))
    think = f'Key {call[0]}, day {day}.' if hop == 0 else f'Next key {call[0]}, day {day}.'
    return render(think, tool_call=lookup)


def tool_config(c: ml_collections.ConfigDict, failure_rate: float | None = None, seed: int = 0) -> dict:
  """The `ToolEnv` config of the world: only `lookup`, its table seeded as the world, failures injected at
  `failure_rate` (None: the world's `data.failure_rate`) as backend_error."""
  rate = c.failure_rate if failure_rate is None else failure_rate
  return {'enabled': ('lookup',), 'lookup': {'seed': int(c.seed)},
          'failure_injection': {'rate': float(rate), 'kind': 'backend_error', 'seed': int(seed)}}


def expert_trajectories(c: ml_collections.ConfigDict, items: list[dict], tokenizer, make_builder, env) -> tuple:
  """Runs the expert on each item (one `agent_loop.run_episodes` call each, in order, so the injected failures
  follow the call order). Returns (kept `Trajectory`s, counts {'in', 'kept', 'answered', 'gave_up', 'retries',
  'fatal'})."""
  kept, counts = [], {'in': len(items), 'kept': 0, 'answered': 0, 'gave_up': 0, 'retries': 0, 'fatal': 0}
  limits = agent_loop.Limits(max_turns=3 * c.hops * c.fatal_k + 1, fatal_k=c.fatal_k)
  for item in tqdm.tqdm(items, desc='lookup expert', leave=False):
    engine = LookupExpert(item, tokenizer, c.seed, c.retry_prob)
    prompt = agent_loop.Item(prompt_id=item['prompt_id'], question=item['question'], image=item['image'],
                             answers=item['answers'])
    (traj,) = agent_loop.run_episodes(engine, env, make_builder, [prompt], num_generations=1, limits=limits)
    if traj.fatal_step is not None or engine.outcome is None:
      counts['fatal'] += 1
      continue
    counts[engine.outcome] += 1
    counts['retries'] += sum('The lookup failed; try again.' in s.text for s in traj.steps)
    kept.append(traj)
  counts['kept'] = len(kept)
  return kept, counts


def world_vocab(trajectories, prompts_ids, tokenizer, env) -> list[int]:
  """The Qwen ids the world can produce: every id of the expert trajectories and the RL prompts, the end-of-sequence
  ids, and the ids of the error texts of calls a policy may get wrong (an out-of-range digit, a missing or unexpected
  argument, an unknown tool, malformed turns). Another id of an error text reads as <|endoftext|>
  (`policy.mask_out_of_vocabulary`)."""
  ids = set(traj_lib.EOS_IDS)
  for t in trajectories:
    ids.update(int(i) for i in t.token_ids)
  for p in prompts_ids:
    ids.update(int(i) for i in p)
  errors = [env.call('lookup', {'key': 13, 'day': 5}, []), env.call('lookup', {'key': 3}, []),
            env.call('lookup', {'key': 3, 'day': 5, 'x': 1}, []), env.call('lookup', 'x', []),
            env.call('lookup_', {}, [])]
  think = '<think>\nKey 3.\n</think>\n'
  call = '<tool_call>\n{"name": "lookup", "arguments": {"key": 3, "day": 5}}\n</tool_call>'
  for text in (think, think + call[:-12], call, f'{think}{call}\n{call}', f'{think}<response>3</response>\n{call}',
               think + call.replace('}}', '}')):   # no action, cut, no think, two calls, two actions, bad JSON
    action = traj_lib.parse_action(text)
    if not action.format_ok:   # the observations of malformed turns (the agent loop's)
      errors.append(agent_loop.malformed_result(action))
  for r in errors:
    ids.update(tokenizer.encode(r.text))
  return sorted(ids)


def build(c: ml_collections.ConfigDict, out_dir: str | os.PathLike) -> dict:
  """Builds (or finds already built) the world in `out_dir`; returns its stats (also `out_dir/stats.json`).

  One build at a time holds the folder (`dataset_folder.locked`); its settings are recorded and compared as the
  Wikipedia build's (`dataset_folder.check_settings`); every split is written durably (`dataset_folder.save_split`),
  stats.json last.

  Raises:
    ValueError: a bad `data` section (`check_config`); `out_dir` holds a dataset built with other settings (naming
      them).
    BlockingIOError: another build holds the folder.
  """
  from tools import env as env_lib  # pylint: disable=g-import-not-at-top
  check_config(c)
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  with dataset_folder.locked(out):
    settings = json.loads(json.dumps({k: v for k, v in c.to_dict().items() if k != 'dir'}, sort_keys=True))
    dataset_folder.check_settings(out, settings, {}, (pipeline_data.ITEMS, pipeline_data.SFT, pipeline_data.RL))
    if (out / STATS_FILE).is_file():   # written last: the world is built
      return json.loads((out / STATS_FILE).read_text())
    return _build(c, out, env_lib.ToolEnv(tool_config(c, seed=c.seed)))


def _build(c: ml_collections.ConfigDict, out: pathlib.Path, env) -> dict:
  t0 = time.perf_counter()
  (out / GENERATED).mkdir(parents=True, exist_ok=True)
  items = make_items(c)
  tokenizer = traj_lib.load_tokenizer()
  processor = traj_lib.ImageProcessor(min_pixels=c.min_pixels, max_pixels=c.max_pixels)
  make_builder = factory.make_builder(tokenizer, processor, env, traj_lib.system_prompt_text(c.system_prompt))
  from PIL import Image  # pylint: disable=g-import-not-at-top
  for item in items:
    item['image_path'] = f"{GENERATED}/{item['prompt_id']}.png"
    Image.fromarray(item['image']).save(out / item['image_path'])
  sft_items = [it for it in items if it['split'] == 'sft']
  rl_items = [it for it in items if it['split'] != 'sft']
  trajectories, expert_counts = expert_trajectories(c, sft_items, tokenizer, make_builder, env)
  prompts_ids = []
  for it in rl_items:
    builder = make_builder()
    builder.start(it['question'], it['image'])
    prompts_ids.append(builder.prompt_ids())
  vocab = world_vocab(trajectories, prompts_ids, tokenizer, env)
  rows = [{'prompt_id': it['prompt_id'], 'question': it['question'], 'canonical_question': it['question'],
           'answers': it['answers'], 'image_path': it['image_path'], 'path': [], 'hops': it['hops'],
           'rejected': None, 'landmark': COLOURS[it['key']][0], 'descriptors': [],
           'answer_attribute': 'lookup', 'answer_evidence': f"key {it['key']} day {it['day']}",
           'anchor_expression': 'the square\'s colour', 'rewrite_trace': [], 'degradation': None,
           'original_image_path': None, 'relations': [it['split']]} for it in items]
  kept_ids = {t.prompt_id for t in trajectories}
  rl_rows = [{'prompt_id': it['prompt_id'], 'reason': 'held_out'} for it in rl_items]
  save = dataset_folder.save_split
  save(rows, out / pipeline_data.ITEMS, {'items': len(rows), 'accepted': len(rows)}, pipeline_data.items_features())
  save([t.to_record() for t in trajectories], out / pipeline_data.SFT, expert_counts, traj_lib.record_features())
  save(rl_rows, out / pipeline_data.RL, {'prompts': len(rl_rows)}, pipeline_data.rl_features())
  vocab = vocab_lib.write(out, [vocab])   # with the added tokens
  combos = split_combos(c.seed, c.rl_combos, c.heldout_combos)
  stats = {'world': 'lookup', 'hops': c.hops, 'items': len(items), 'sft': expert_counts,
           'rl_prompts': len(rl_rows), 'heldout_prompts': sum(it['split'] == 'heldout' for it in items),
           'combos': {k: len(v) for k, v in combos.items()}, 'vocab_ids': len(vocab),
           'sft_items_without_trajectory': len(sft_items) - len(kept_ids),
           'seconds': round(time.perf_counter() - t0, 2)}
  pipeline_data.write_durably(out / STATS_FILE, json.dumps(stats, indent=1, sort_keys=True))
  return stats


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  config = _CONFIG.value
  out = pipeline_data.dataset_dir(config, _WORKDIR.value)
  stats = build(config.data, out)
  print(json.dumps(stats), out, file=sys.stdout)


if __name__ == '__main__':
  _CONFIG = config_flags.DEFINE_config_file('config', 'configs/lookup.py', 'ml_collections config file.')
  _WORKDIR = flags.DEFINE_string('workdir', None, 'Job folder; the world is built into <workdir>/data unless '
                                 '--config.data.dir.', required=True)
  app.run(main)
